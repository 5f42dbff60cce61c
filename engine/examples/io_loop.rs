//! A fixed number of IOs through the engine on one core, for instruction
//! counting under callgrind: `io_loop nop N [QD]`, `io_loop read PATH N [QD]`
//! (4 KiB buffered random reads of PATH) or `io_loop seq PATH N [QD]` (4 KiB
//! buffered reads of PATH in order, the next block to the next task, so the
//! plug merges them). Prints the IO count.

use std::cell::Cell;
use std::rc::Rc;

use plugio_device::RingConfig;
use plugio_engine::{Device, DeviceOptions};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str);
    let seq = mode == Some("seq");
    let read = mode == Some("read") || seq;
    let (path, rest) = if read {
        (Some(args[2].clone()), &args[3..])
    } else {
        (None, &args[2..])
    };
    let n: u64 = rest.first().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let qd: u64 = rest.get(1).and_then(|s| s.parse().ok()).unwrap_or(128);
    let ex = plugio_engine::runtime::local(RingConfig {
        sq_entries: 128,
        registered_files: 64,
        ..RingConfig::default()
    })
    .expect("runtime");
    let done = ex.run(async move {
        let opts = DeviceOptions {
            direct: false,
            read_only: true,
            queue_depth: 128,
            ..DeviceOptions::default()
        };
        let dev = match &path {
            Some(p) => Device::open(p, opts).expect("open"),
            None => {
                let f = std::env::temp_dir().join("io_loop_nop");
                std::fs::write(&f, vec![0u8; 1 << 20]).unwrap();
                Device::open(&f, opts).expect("open")
            }
        };
        let size = match &path {
            Some(p) => std::fs::metadata(p).expect("stat").len(),
            None => 1 << 20,
        };
        let blocks = (size / 4096).max(1);
        let left = Rc::new(Cell::new(n));
        let count = Rc::new(Cell::new(0u64));
        let next = Rc::new(Cell::new(0u64));
        let tasks: Vec<_> = (0..qd)
            .map(|t| {
                let (dev, left, count) = (dev.clone(), left.clone(), count.clone());
                let next = next.clone();
                plugio_executor::spawn_local(async move {
                    let mut buf = dev.alloc_buf(4096);
                    let mut x = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                    while left.get() > 0 {
                        left.set(left.get() - 1);
                        if read {
                            let block = if seq {
                                next.set(next.get() + 1);
                                (next.get() - 1) % blocks
                            } else {
                                x ^= x << 13;
                                x ^= x >> 7;
                                x ^= x << 17;
                                x % blocks
                            };
                            buf.set_len(4096);
                            let (r, b) = dev.read_at(buf, block * 4096).await;
                            buf = b;
                            r.expect("read");
                        } else {
                            dev.nop().await.expect("nop");
                        }
                        count.set(count.get() + 1);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
        count.get()
    });
    println!("{done}");
}
