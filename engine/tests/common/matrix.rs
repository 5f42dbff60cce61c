//! The engine's side of the configuration matrix: executors whose cores
//! get a [`Setup`]'s driver, and fixtures that are a file or, for
//! [`Setup::Mem`], a `MemDevice` holding the same bytes.
//!
//! Invariant: a [`Case`] builds every executor and device of a test from
//! its one `Setup`; nothing in a matrix test calls
//! `plugio_engine::runtime::local` or `Device::open` itself.

#![allow(dead_code)] // tests use their own subset

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use plugio_device::backend::mem::{Latency, MemClock, MemConfig, MemDevice};
use plugio_device::{Backend, RingConfig};
use plugio_engine::{Device, DeviceOptions};
use plugio_executor::{Driver, LocalExecutor, Runtime};

use crate::setup::Setup;

/// One test's run in one configuration.
pub struct Case {
    /// The configuration.
    pub setup: Setup,
    dir: tempfile::TempDir,
}

impl Case {
    /// A case in `setup` with a fresh temporary directory that takes
    /// `O_DIRECT`.
    pub fn new(setup: Setup) -> Case {
        Case {
            setup,
            dir: crate::common::tmpdir(),
        }
    }

    /// A single-thread executor (core 0 on the calling thread) with the
    /// setup's driver.
    pub fn local(&self) -> LocalExecutor {
        let setup = self.setup;
        LocalExecutor::builder()
            .driver(move |_core| Ok(Box::new(setup.driver()) as Box<dyn Driver>))
            .build()
            .expect("local executor")
    }

    /// A runtime of `cores` cores, each with the setup's driver.
    pub fn runtime(&self, cores: usize) -> Runtime {
        let setup = self.setup;
        plugio_executor::Builder::new()
            .driver(move |_core| Ok(Box::new(setup.driver()) as Box<dyn Driver>))
            .cores(cores)
            .build()
            .expect("runtime")
    }

    /// A device holding `data`: a file named `name` in the case's directory,
    /// or for [`Setup::Mem`] a `MemDevice` of `data.len()` rounded up to
    /// 512 bytes (the rest zero) with 1-50 µs of virtual latency per op.
    pub fn fixture(&self, name: &str, data: &[u8]) -> Fixture {
        if self.setup.mem_device() {
            Fixture::Mem(seeded_mem(data))
        } else {
            let path = self.dir.path().join(name);
            std::fs::write(&path, data).expect("write fixture");
            Fixture::File(path)
        }
    }
}

/// What a matrix test opens its devices on.
pub enum Fixture {
    /// A regular file.
    File(PathBuf),
    /// The simulated device (shared by every device opened on it).
    Mem(Arc<MemDevice>),
}

impl Fixture {
    /// Opens a device on the fixture with `options`.
    ///
    /// # Panics
    /// When the open fails.
    pub fn open(&self, options: DeviceOptions) -> Device {
        match self {
            Fixture::File(path) => Device::open(path, options).expect("open file"),
            Fixture::Mem(mem) => {
                let backend: Arc<dyn Backend> = mem.clone();
                Device::with_backend(backend, None, options).expect("open mem device")
            }
        }
    }

    /// The `MemDevice`, for a mem fixture.
    pub fn mem(&self) -> Option<&Arc<MemDevice>> {
        match self {
            Fixture::Mem(mem) => Some(mem),
            Fixture::File(_) => None,
        }
    }
}

/// A `MemDevice` holding `data`, written through the engine on a scratch
/// thread (the test thread's driver is not built yet).
fn seeded_mem(data: &[u8]) -> Arc<MemDevice> {
    let capacity_bytes = (data.len() as u64).next_multiple_of(512).max(512);
    let mem = Arc::new(MemDevice::new(MemConfig {
        capacity_bytes,
        latency: Latency::Uniform {
            min: Duration::from_micros(1),
            max: Duration::from_micros(50),
        },
        clock: MemClock::Virtual,
        ..MemConfig::default()
    }));
    let mut bytes = data.to_vec();
    bytes.resize(capacity_bytes as usize, 0);
    let seed = mem.clone();
    std::thread::spawn(move || {
        let ex = plugio_engine::runtime::local(RingConfig::default()).expect("seed executor");
        ex.run(async move {
            let backend: Arc<dyn Backend> = seed;
            let dev = Device::with_backend(backend, None, DeviceOptions::default()).expect("mem");
            let mut buf = dev.alloc_buf(bytes.len());
            buf.as_mut_slice().copy_from_slice(&bytes);
            let (res, _) = dev.write_at(buf, 0).await;
            assert_eq!(res.expect("seed write"), bytes.len());
            dev.sync_data().await.expect("seed flush");
        });
    })
    .join()
    .expect("seeding thread");
    mem
}
