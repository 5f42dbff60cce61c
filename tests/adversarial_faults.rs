//! Adversarial checks with injected faults on the mem device: EIO ranges,
//! short reads, ENOSPC, power cuts; every IO completes exactly once with
//! the right typed error, and merging never changes a result.

use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use plugio::device::backend::mem::{Fault, FaultOn, Latency, MemClock, MemConfig, MemDevice};
use plugio::{Device, DeviceOptions, ErrorKind, IoFlags};

mod common;
use common::{local, watchdog};

const CAP: u64 = 1 << 20;

fn mem(faults: Vec<Fault>, latency: Latency) -> MemDevice {
    MemDevice::new(MemConfig {
        capacity_bytes: CAP,
        latency,
        clock: MemClock::Virtual,
        seed: 3,
        faults,
        ..MemConfig::default()
    })
}

fn dev_on(m: &MemDevice, opts: DeviceOptions) -> Device {
    Device::with_backend(Arc::new(m.clone()), None, opts).expect("device")
}

fn opts(nomerges: u8, queue_depth: u32) -> DeviceOptions {
    DeviceOptions {
        nomerges,
        queue_depth,
        ..DeviceOptions::default()
    }
}

fn uniform() -> Latency {
    Latency::Uniform {
        min: Duration::from_micros(1),
        max: Duration::from_micros(200),
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Bytes(usize),
    Err(String),
}

/// Issues `ios` (offset, len, is_write) all in one tick, each from its own
/// task; returns each outcome and checks each task finished exactly once.
fn run_batch(dev: &Device, ios: &[(u64, usize, bool)]) -> Vec<Outcome> {
    let ex = local();
    let ios = ios.to_vec();
    let dev = dev.clone();
    ex.run(async move {
        let done = Rc::new(Cell::new(0usize));
        let hs: Vec<_> = ios
            .iter()
            .map(|&(off, len, write)| {
                let dev = dev.clone();
                let done = done.clone();
                plugio::spawn_local(async move {
                    let r = if write {
                        let mut b = dev.alloc_buf(len);
                        b.as_mut_slice().fill((off / 512) as u8 | 1);
                        dev.write_at(b, off).await.0
                    } else {
                        let (r, _) = dev.read_at(dev.alloc_buf(len), off).await;
                        r
                    };
                    done.set(done.get() + 1);
                    match r {
                        Ok(n) => Outcome::Bytes(n),
                        Err(e) => Outcome::Err(format!("{:?}", e.kind())),
                    }
                })
            })
            .collect();
        let mut out = Vec::new();
        for h in hs {
            out.push(h.await.expect("io task"));
        }
        assert_eq!(done.get(), ios.len(), "each IO completes exactly once");
        assert_eq!(dev.tags_in_use(), 0);
        out
    })
}

#[test]
fn eio_ranges_fail_exactly_the_ios_that_touch_them_without_merging() {
    watchdog(10, || {
        let faults = vec![
            Fault::Eio {
                lbas: 16..17,
                on: FaultOn::Read,
            },
            Fault::Eio {
                lbas: 100..104,
                on: FaultOn::Write,
            },
            Fault::Eio {
                lbas: 200..201,
                on: FaultOn::Both,
            },
        ];
        let m = mem(faults, uniform());
        let dev = dev_on(&m, opts(2, 4));
        let mut ios = Vec::new();
        for i in 0..64u64 {
            ios.push((i * 4096 % (128 * 1024), 4096, i % 3 == 0));
        }
        let got = run_batch(&dev, &ios);
        for (&(off, len, write), g) in ios.iter().zip(&got) {
            let (s, e) = (off / 512, (off + len as u64) / 512);
            let hit = |a: u64, b: u64| s < b && a < e;
            let bad = if write {
                hit(100, 104) || hit(200, 201)
            } else {
                hit(16, 17) || hit(200, 201)
            };
            if bad {
                assert_eq!(g, &Outcome::Err("Io { errno: 5 }".into()), "{off} {write}");
            } else {
                assert_eq!(g, &Outcome::Bytes(len), "{off} {write}");
            }
        }
    });
}

/// A big read split into many requests with queue depth 1, one of them
/// failing: one error result, delivered once, and the tags all return.
#[test]
fn a_split_read_with_one_failing_part_fails_once() {
    watchdog(10, || {
        let m = mem(
            vec![Fault::Eio {
                lbas: 700..701,
                on: FaultOn::Read,
            }],
            uniform(),
        );
        let dev = dev_on(
            &m,
            DeviceOptions {
                queue_depth: 1,
                max_request_bytes: Some(8192),
                ..DeviceOptions::default()
            },
        );
        let got = run_batch(&dev, &[(0, 512 * 1024, false), (0, 4096, false)]);
        assert_eq!(got[0], Outcome::Err("Io { errno: 5 }".into()));
        assert_eq!(got[1], Outcome::Bytes(4096));
        let s = dev.iostats();
        assert!(s.requests >= 64, "the read was split: {s:?}");
    });
}

#[test]
fn enospc_is_out_of_space_and_later_writes_keep_failing_until_cleared() {
    watchdog(10, || {
        let m = mem(vec![Fault::EnospcAfter { bytes: 16384 }], uniform());
        let dev = dev_on(&m, opts(2, 8));
        let ios: Vec<_> = (0..8u64).map(|i| (i * 4096, 4096, true)).collect();
        let got = run_batch(&dev, &ios);
        let ok = got.iter().filter(|g| **g == Outcome::Bytes(4096)).count();
        let full = got
            .iter()
            .filter(|g| **g == Outcome::Err("OutOfSpace".into()))
            .count();
        assert_eq!((ok, full), (4, 4), "{got:?}");
        m.clear_faults();
        let got = run_batch(&dev, &[(0, 4096, true)]);
        assert_eq!(got[0], Outcome::Bytes(4096));
    });
}

/// Merging must not change results: with a short read in the middle of
/// the device (not at its end), a merged request once returned a short
/// count and every later bio of the request got 0 bytes, which a caller
/// reads as end of file, although the same read alone returns all its
/// bytes. Each read now gets what it gets alone: the one over the bad
/// block resumes there and fails naming it (no end of file inside a
/// device), the others read everything.
#[test]
fn a_short_read_inside_a_merged_request_does_not_change_other_bios_results() {
    watchdog(10, || {
        let fault = || vec![Fault::ShortRead { lba: 9 }];
        let ios = [(0, 4096, false), (4096, 4096, false), (8192, 4096, false)];
        let unmerged = run_batch(&dev_on(&mem(fault(), Latency::Zero), opts(2, 8)), &ios);
        let merged_dev = dev_on(&mem(fault(), Latency::Zero), opts(0, 8));
        let merged = run_batch(&merged_dev, &ios);
        assert_eq!(merged_dev.iostats().requests, 1, "the reads merged");
        assert_eq!(
            unmerged,
            vec![
                Outcome::Bytes(4096),
                Outcome::Err(format!(
                    "{:?}",
                    plugio::ErrorKind::NoProgress {
                        offset_bytes: 9 * 512,
                        len_bytes: 8192 - 9 * 512
                    }
                )),
                Outcome::Bytes(4096)
            ]
        );
        assert_eq!(merged, unmerged, "merging changed the results");
    });
}

/// A reboot after a power cut: a device made from the cut one's durable
/// image holds what was flushed or FUA and nothing else, and a write the
/// crashed code sends after the cut lands on the old device only.
#[test]
fn a_device_from_a_cut_devices_image_is_the_disk_after_a_reboot() {
    watchdog(10, || {
        let config = MemConfig {
            capacity_bytes: CAP,
            ..MemConfig::default()
        };
        let old = MemDevice::new(config.clone());
        let dev = dev_on(&old, opts(2, 16));
        let ex = local();
        let write = |dev: &Device, off: u64, fill: u8, flags: IoFlags| {
            let dev = dev.clone();
            async move {
                let mut b = dev.alloc_buf(4096);
                b.as_mut_slice().fill(fill);
                dev.write_at_with(b, off, flags).await.0.expect("write");
            }
        };
        ex.run(async {
            write(&dev, 0, 1, IoFlags::NONE).await;
            dev.sync_data().await.expect("flush");
            write(&dev, 4096, 2, IoFlags::FUA).await;
            write(&dev, 8192, 3, IoFlags::NONE).await;
        });
        old.power_cut();
        let rebooted = MemDevice::from_image(config, old.durable_bytes(0..CAP));
        let new_dev = dev_on(&rebooted, opts(2, 16));
        ex.run(async {
            // The crashed code's late write.
            write(&dev, 0, 9, IoFlags::FUA).await;
            let b = new_dev.read_alloc_at(0, 12288).await.expect("read");
            assert!(b.as_slice()[..4096].iter().all(|&x| x == 1), "flushed");
            assert!(b.as_slice()[4096..8192].iter().all(|&x| x == 2), "FUA");
            assert!(b.as_slice()[8192..].iter().all(|&x| x == 0), "unflushed");
        });
        assert_eq!(
            old.durable_bytes(0..1),
            vec![9],
            "the late write went to the old device"
        );
    });
}

/// A cut aimed at the third write from the fault: the first two land (one
/// flushed, one not), the third fails with ENODEV and lands nowhere, the
/// unflushed one is lost, and IO after the cut is served again.
#[test]
fn a_power_cut_aimed_at_the_third_write_cuts_exactly_there() {
    watchdog(10, || {
        let m = MemDevice::new(MemConfig {
            capacity_bytes: CAP,
            faults: vec![Fault::PowerCutAt { writes: 3 }],
            ..MemConfig::default()
        });
        let dev = dev_on(&m, opts(2, 16));
        let ex = local();
        ex.run(async {
            let write = |off: u64, fill: u8| {
                let dev = dev.clone();
                async move {
                    let mut b = dev.alloc_buf(4096);
                    b.as_mut_slice().fill(fill);
                    dev.write_at(b, off).await.0
                }
            };
            write(0, 1).await.expect("first");
            dev.sync_data().await.expect("flush");
            write(4096, 2).await.expect("second");
            assert_eq!(m.power_cuts(), 0);
            let e = write(8192, 3).await.expect_err("cut at the third");
            assert_eq!(
                e.kind(),
                &ErrorKind::Io {
                    errno: libc::ENODEV
                }
            );
            assert_eq!(m.power_cuts(), 1);
            assert_eq!(m.durable_bytes(0..1), vec![1], "flushed kept");
            assert_eq!(m.durable_bytes(4096..4097), vec![0], "unflushed lost");
            assert_eq!(m.durable_bytes(8192..8193), vec![0], "the cut write");
            write(12288, 4).await.expect("served after the cut");
            assert_eq!(m.power_cuts(), 1, "one cut per fault");
            // An attempt refused with EAGAIN (and sent again by the
            // engine) is one write, not two; `writes: 0` never cuts.
            m.inject(Fault::PowerCutAt { writes: 0 });
            m.inject(Fault::Eagain { ops: 1 });
            m.inject(Fault::PowerCutAt { writes: 2 });
            write(16384, 5).await.expect("refused once, then landed");
            assert_eq!(m.power_cuts(), 1);
            write(20480, 6).await.expect_err("the second write is cut");
            assert_eq!(m.power_cuts(), 2);
        });
    });
}

/// Power cut with writes in flight: those fail with ENODEV (the device
/// went away under them) exactly once;
/// FUA and flushed writes survive; unflushed ones are lost; IO after the
/// cut works.
#[test]
fn power_cut_mid_stream() {
    watchdog(10, || {
        let m = MemDevice::new(MemConfig {
            capacity_bytes: CAP,
            latency: Latency::Fixed(Duration::from_millis(30)),
            clock: MemClock::Real,
            ..MemConfig::default()
        });
        let dev = dev_on(&m, opts(2, 16));
        let ex = local();
        let m2 = m.clone();
        ex.run(async move {
            let write = |off: u64, fill: u8, flags: IoFlags| {
                let dev = dev.clone();
                async move {
                    let mut b = dev.alloc_buf(4096);
                    b.as_mut_slice().fill(fill);
                    dev.write_at_with(b, off, flags).await.0
                }
            };
            write(0, 1, IoFlags::NONE).await.expect("w0");
            dev.sync_data().await.expect("flush");
            write(4096, 2, IoFlags::FUA).await.expect("fua");
            write(8192, 3, IoFlags::NONE).await.expect("unflushed");
            // In flight at the cut: the eight writes are issued under an
            // explicit plug in one poll, and the power is cut before the
            // core parks again. A park could deliver them as done (their
            // 30 ms may pass while the machine is busy), so none comes
            // between their submission and the cut.
            let done = Rc::new(Cell::new(0));
            let writes = (0..8u64).map(|i| {
                let w = write(16384 + i * 4096, 9, IoFlags::NONE);
                let done = done.clone();
                async move {
                    let r = w.await;
                    done.set(done.get() + 1);
                    r
                }
            });
            let guard = dev.plug(8).expect("plug");
            let mut all = Box::pin(futures::future::join_all(writes));
            let waker = futures::task::noop_waker();
            let mut cx = std::task::Context::from_waker(&waker);
            assert!(all.as_mut().poll(&mut cx).is_pending());
            drop(guard);
            assert!(dev.tags_in_use() > 0, "the writes are in flight");
            m2.power_cut();
            for r in all.await {
                let e = r.expect_err("in flight at the cut");
                assert_eq!(
                    e.kind(),
                    &ErrorKind::Io {
                        errno: libc::ENODEV
                    }
                );
            }
            assert_eq!(done.get(), 8);
            let b = dev.read_alloc_at(0, 12288).await.expect("read after cut");
            assert!(b.as_slice()[..4096].iter().all(|&x| x == 1), "flushed lost");
            assert!(b.as_slice()[4096..8192].iter().all(|&x| x == 2), "FUA lost");
            assert!(
                b.as_slice()[8192..].iter().all(|&x| x == 0),
                "unflushed kept"
            );
            assert_eq!(dev.tags_in_use(), 0);
        });
    });
}
