//! One core with more devices than a 64-bit mask has bits: the flush and
//! the completion batch keep masks of the devices they touched, and every
//! device from index 63 up must still be dispatched, while a device slot
//! that was released (every handle gone) must be skipped.
//!
//! Found by a breaker running fio with `nrfiles=66
//! file_service_type=random`: random file service closes files early, and
//! IO on file 65 made the flush dispatch the released slot 63 (a panic).

use std::sync::Arc;
use std::time::Duration;

use plugio_device::backend::mem::{Fault, Latency, MemClock, MemConfig, MemDevice};
use plugio_engine::{Device, DeviceOptions};

mod common;

use common::{local, watchdog};

const NR_DEVICES: usize = 70;

fn mem(faults: Vec<Fault>) -> Arc<MemDevice> {
    Arc::new(MemDevice::new(MemConfig {
        capacity_bytes: 64 << 10,
        latency: Latency::Uniform {
            min: Duration::from_micros(1),
            max: Duration::from_micros(5),
        },
        clock: MemClock::Virtual,
        faults,
        ..Default::default()
    }))
}

fn open(faults: Vec<Fault>) -> Device {
    Device::with_backend(mem(faults), None, DeviceOptions::default()).expect("device")
}

fn data(dev: usize) -> Vec<u8> {
    vec![dev as u8 ^ 0x5a; 4096]
}

#[test]
fn devices_past_63_are_dispatched_and_released_slots_skipped() {
    watchdog(120, run);
}

fn run() {
    local().run(async {
        // Device 66 fails its first two ops with EAGAIN: the completion
        // batch requeues them on a device past 63.
        let mut devs: Vec<Option<Device>> = (0..NR_DEVICES)
            .map(|i| {
                let faults = if i == 66 {
                    vec![Fault::Eagain { ops: 2 }]
                } else {
                    Vec::new()
                };
                Some(open(faults))
            })
            .collect();
        // Every device joins this core (its slot in the core's list).
        for (i, d) in devs.iter().enumerate() {
            let d = d.as_ref().expect("open");
            let mut buf = d.alloc_buf(4096);
            buf.as_mut_slice().copy_from_slice(&data(i));
            let (r, _) = d.write_at(buf, 0).await;
            r.unwrap_or_else(|e| panic!("write on device {i}: {e}"));
        }
        // Devices 62 to 64 go away; a flush with an empty plug releases
        // their slots.
        for d in &mut devs[62..=64] {
            *d = None;
        }
        devs[0].as_ref().expect("open").nop().await.expect("nop");
        // IO on the devices past 63 (one plug, so one flush touches all
        // of them), each read checked.
        let reads = (65..NR_DEVICES).map(|i| {
            let d = devs[i].as_ref().expect("open");
            async move { (i, d.read_alloc_at(0, 4096).await) }
        });
        for (i, r) in futures::future::join_all(reads).await {
            let buf = r.unwrap_or_else(|e| panic!("read on device {i}: {e}"));
            assert_eq!(buf.as_slice(), &data(i)[..], "device {i}");
        }
        // And alone, each on its own tick.
        for (i, d) in devs.iter().enumerate().skip(65) {
            let d = d.as_ref().expect("open");
            let buf = d.read_alloc_at(0, 4096).await.expect("read");
            assert_eq!(buf.as_slice(), &data(i)[..], "device {i}");
        }
        // New devices take the vacant slots (the first vacant one is
        // reused) and work.
        for slot in &mut devs[62..=64] {
            let d = open(Vec::new());
            d.nop().await.expect("nop on a reused slot");
            *slot = Some(d);
        }
    });
}

/// A flush of a plug that holds bios of several devices (of 70 open on
/// the core) empties the plug counts of each of them: a device's
/// `plug_max_count` trigger counts only the bios plugged since, and each
/// device's bio cache hits and misses add up to its bios. (The flush
/// resets only the devices it drained; a debug build also asserts that
/// no other device kept a count.)
#[test]
fn a_flush_over_several_devices_empties_each_ones_plug_counts() {
    watchdog(120, counts_run);
}

fn counts_run() {
    local().run(async {
        let opts = DeviceOptions {
            plug_max_count: 4,
            iostats: true,
            ..DeviceOptions::default()
        };
        let devs: Vec<Device> = (0..NR_DEVICES)
            .map(|_| Device::with_backend(mem(Vec::new()), None, opts.clone()).expect("device"))
            .collect();
        // Device 7 gets three bios per tick (one under its trigger),
        // beside bios of devices 3, 40 and 69; then four alone. Each tick
        // is one flush of device 7: four plugged bios trigger one flush
        // early and the tick's end finds its plug empty. A count left
        // over from the mixed tick would trigger the early flush at the
        // first of the four, and the other three would need a second.
        for round in 0..50u64 {
            let before = devs[7].iostats().plug_flushes;
            let mixed = [7, 3, 7, 40, 7, 69].map(|i| devs[i].nop());
            for r in futures::future::join_all(mixed).await {
                r.expect("nop");
            }
            assert_eq!(
                devs[7].iostats().plug_flushes,
                before + 1,
                "round {round}, mixed tick"
            );
            let alone = (0..4).map(|_| devs[7].nop());
            for r in futures::future::join_all(alone).await {
                r.expect("nop");
            }
            assert_eq!(
                devs[7].iostats().plug_flushes,
                before + 2,
                "round {round}, device 7 alone"
            );
        }
        for (i, d) in devs.iter().enumerate() {
            let s = d.iostats();
            assert_eq!(
                s.bio_cache_hits + s.bio_cache_misses,
                s.bios,
                "device {i}: {s:?}"
            );
        }
        assert_eq!(devs[7].iostats().bios, 50 * 7);
        assert_eq!(devs[40].iostats().bios, 50);
        assert_eq!(devs[0].iostats().bios, 0);
    });
}
