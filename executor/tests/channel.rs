//! Channel semantics: capacity, close from either side, waiting senders.

use plugio_executor::channel::{self, TryRecvError, TrySendError};
use plugio_executor::{spawn_local, yield_now, LocalExecutor};
use std::cell::RefCell;
use std::rc::Rc;

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
