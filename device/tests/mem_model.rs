//! Property test: the mem device against a plain model. Random writes (some
//! FUA), flushes and reads; reads see the latest writes; after a power cut
//! (LoseUnflushed) the device holds exactly the flushed-or-FUA image.

use std::sync::Arc;

use plugio_device::testing::block_on;
use plugio_device::{DeviceDriver, File, IoFlags, MemConfig, MemDevice};
use proptest::prelude::*;

const BLOCK: u64 = 512;
const BLOCKS: u64 = 64;

#[derive(Debug, Clone)]
enum Step {
    Write {
        block: u64,
        n: u64,
        byte: u8,
        fua: bool,
    },
    Flush,
    Read {
        block: u64,
        n: u64,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..BLOCKS, 1..8u64, any::<u8>(), any::<bool>()).prop_map(|(block, n, byte, fua)| {
            Step::Write { block, n: n.min(BLOCKS - block), byte, fua }
        }),
        1 => Just(Step::Flush),
        2 => (0..BLOCKS, 1..8u64).prop_map(|(block, n)| Step::Read { block, n: n.min(BLOCKS - block) }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn mem_device_matches_the_model(steps in proptest::collection::vec(step(), 1..40)) {
        let driver = DeviceDriver::without_ring().expect("driver");
        let dev = MemDevice::new(MemConfig {
            capacity_bytes: BLOCK * BLOCKS,
            ..MemConfig::default()
        });
        let file = File::from_backend(Arc::new(dev.clone()));
        let size = (BLOCK * BLOCKS) as usize;
        let mut volatile = vec![0u8; size];
        let mut durable = vec![0u8; size];
        block_on(&driver, async {
            for s in &steps {
                match *s {
                    Step::Write { block, n, byte, fua } => {
                        let r = (block * BLOCK) as usize..((block + n) * BLOCK) as usize;
                        let mut b = file.alloc_buf(r.len());
                        b.as_mut_slice().fill(byte);
                        let flags = if fua { IoFlags::FUA } else { IoFlags::NONE };
                        let (res, _) = file.write_at_with(b, block * BLOCK, flags).await;
                        assert_eq!(res.expect("write"), r.len());
                        volatile[r.clone()].fill(byte);
                        if fua {
                            durable[r].fill(byte);
                        }
                    }
                    Step::Flush => {
                        file.fdatasync().await.expect("flush");
                        durable.copy_from_slice(&volatile);
                    }
                    Step::Read { block, n } => {
                        let r = (block * BLOCK) as usize..((block + n) * BLOCK) as usize;
                        let (res, b) = file.read_at(file.alloc_buf(r.len()), block * BLOCK).await;
                        assert_eq!(res.expect("read"), r.len());
                        assert_eq!(b.as_slice(), &volatile[r]);
                    }
                }
            }
        });
        dev.power_cut();
        prop_assert_eq!(dev.durable_bytes(0..BLOCK * BLOCKS), durable.clone());
        let (res, b) = block_on(&driver, file.read_at(file.alloc_buf(size), 0));
        prop_assert_eq!(res.expect("read after cut"), size);
        prop_assert_eq!(b.as_slice(), &durable[..]);
    }
}
