//! Channel semantics: capacity, close from either side, waiting senders.

use plugio_executor::channel::{self, TryRecvError, TrySendError};
use plugio_executor::{spawn_local, yield_now, LocalExecutor};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

#[test]
fn try_send_and_try_recv_report_full_empty_and_closed() {
    let (tx, mut rx) = channel::bounded::<u32>(2);
    assert_eq!(tx.capacity(), 2);
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    tx.try_send(1).expect("room");
    tx.try_send(2).expect("room");
    assert_eq!(tx.try_send(3), Err(TrySendError::Full(3)));
    assert_eq!(tx.len(), 2);
    assert_eq!(rx.try_recv(), Ok(1));
    drop(tx);
    // Queued items survive the senders.
    assert_eq!(rx.try_recv(), Ok(2));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Closed));
}

#[test]
fn receiver_close_fails_sends_but_keeps_queued_items() {
    let (tx, mut rx) = channel::bounded::<u32>(4);
    tx.try_send(1).expect("room");
    rx.close();
    assert!(tx.is_closed());
    assert_eq!(tx.try_send(2), Err(TrySendError::Closed(2)));
    assert_eq!(rx.try_recv(), Ok(1));
    let ex = LocalExecutor::new();
    let err = ex.run(async { tx.send(5).await });
    assert_eq!(err.expect_err("closed").0, 5);
}

#[test]
fn recv_returns_none_after_last_sender_drops() {
    let ex = LocalExecutor::new();
    ex.run(async {
        let (tx, mut rx) = channel::bounded::<u32>(1);
        let tx2 = tx.clone();
        let h = spawn_local(async move {
            let mut got = Vec::new();
            while let Some(v) = rx.recv().await {
                got.push(v);
            }
            got
        });
        tx.send(1).await.expect("send");
        drop(tx);
        tx2.send(2).await.expect("send");
        drop(tx2);
        assert_eq!(h.await.expect("join"), vec![1, 2]);
    });
}

#[test]
fn waiting_senders_are_served_in_order() {
    let ex = LocalExecutor::new();
    let log = Rc::new(RefCell::new(Vec::new()));
    ex.run({
        let log = log.clone();
        async move {
            let (tx, mut rx) = channel::bounded::<u32>(1);
            let tx = Rc::new(tx);
            tx.try_send(0).expect("room");
            let senders: Vec<_> = (1..=3)
                .map(|i| {
                    let tx = tx.clone();
                    spawn_local(async move { tx.send(i).await.expect("send") })
                })
                .collect();
            // Let every sender block on the full channel.
            yield_now().await;
            for _ in 0..4 {
                let item = rx.recv().await.expect("item");
                log.borrow_mut().push(item);
            }
            for s in senders {
                s.await.expect("sender");
            }
        }
    });
    assert_eq!(*log.borrow(), vec![0, 1, 2, 3]);
}

#[test]
fn a_woken_sender_that_gives_up_passes_its_slot_on() {
    let ex = LocalExecutor::new();
    ex.run(async {
        let (tx, mut rx) = channel::bounded::<u32>(1);
        let tx = Rc::new(tx);
        tx.try_send(0).expect("room");
        let first = {
            let tx = tx.clone();
            spawn_local(async move { tx.send(1).await })
        };
        let second = {
            let tx = tx.clone();
            spawn_local(async move { tx.send(2).await })
        };
        yield_now().await;
        // Frees the slot and wakes `first`; `first` is aborted before it
        // runs, so its wake must go to `second`.
        assert_eq!(rx.try_recv(), Ok(0));
        first.abort();
        assert!(first.await.expect_err("aborted").is_cancelled());
        // A lost wake would leave `second` waiting: fail instead of hang.
        plugio_executor::timeout(std::time::Duration::from_secs(5), second)
            .await
            .expect("second was woken")
            .expect("join")
            .expect("second got the slot");
        assert_eq!(rx.recv().await, Some(2));
    });
}

/// tokio's contract: `close` ends `recv` after the buffered items are
/// drained, even while senders live; a sender waiting for room gets its
/// value back.
#[test]
fn close_ends_recv_after_draining_while_senders_live() {
    let ex = LocalExecutor::new();
    ex.run(async {
        let (tx, mut rx) = channel::bounded::<u32>(4);
        for i in 0..3 {
            tx.try_send(i).expect("room");
        }
        rx.close();
        assert!(tx.is_closed());
        assert_eq!(tx.try_send(9), Err(TrySendError::Closed(9)));
        let mut got = Vec::new();
        // A recv that waits for the live sender would hang: fail instead.
        while let Some(v) = plugio_executor::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("recv ended after the drain, not waiting for the live sender")
        {
            got.push(v);
        }
        assert_eq!(got, vec![0, 1, 2]);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Closed));
        drop(tx); // alive until here

        // A sender blocked on a full channel is woken by the close.
        let (tx, mut rx) = channel::bounded::<u32>(1);
        tx.try_send(1).expect("room");
        let tx = Rc::new(tx);
        let blocked = {
            let tx = tx.clone();
            spawn_local(async move { tx.send(2).await })
        };
        yield_now().await;
        rx.close();
        assert_eq!(blocked.await.expect("join").expect_err("closed").0, 2);
        assert_eq!(rx.recv().await, Some(1));
        assert_eq!(rx.recv().await, None);
    });
}

/// The same across cores: the producer on core 0 keeps its sender; the
/// consumer on core 1 takes 10 items, closes, and drains what was queued.
#[test]
fn close_across_cores_drains_then_ends() {
    use plugio_executor::Runtime;
    let rt = Runtime::builder().cores(2).build().expect("runtime");
    let (tx, mut rx) = channel::bounded::<u64>(8);
    let producer = rt.spawn_on(0, async move {
        let mut sent = 0u64;
        while tx.send(sent).await.is_ok() {
            sent += 1;
        }
        // The sender is still alive here: the close ended the sends.
        (sent, tx.is_closed())
    });
    let consumer = rt.spawn_on(1, async move {
        let mut got = Vec::new();
        for _ in 0..10 {
            got.push(rx.recv().await.expect("item"));
        }
        rx.close();
        while let Some(v) = rx.recv().await {
            got.push(v);
        }
        got
    });
    let got = futures::executor::block_on(consumer).expect("consumer");
    let (sent, closed) = futures::executor::block_on(producer).expect("producer");
    assert!(closed);
    assert_eq!(
        got,
        (0..sent).collect::<Vec<_>>(),
        "every item sent was received, in order"
    );
}
