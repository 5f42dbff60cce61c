//! The ring configurations the integration suites run over, and the one
//! macro that writes each test once and runs it in every configuration
//! (tokio's `rt_test!` and `tests/rt_common.rs` are the model).
//!
//! Shared by the device crate's `tests/matrix.rs` and the engine crate's
//! `tests/matrix.rs` (which includes this file by path).
//!
//! Invariants:
//! - Every [`Setup`] names one module of [`matrix!`] (`Setup::name`), and a
//!   test can recover its setup from `module_path!()` alone
//!   ([`Setup::from_module_path`]), so a test can check that the macro wired
//!   the module to the configuration its name promises.
//! - A configuration the machine refuses is never skipped silently: only a
//!   refusal of io_uring itself (`EPERM`, `ENOSYS`: a seccomp filter,
//!   `io_uring_disabled`, an SQPOLL thread not allowed) is tolerated, and
//!   then [`Setup::driver`] prints a `SKIP` line naming the configuration
//!   and the error, and runs on the sync pool that [`DeviceDriver::new`]
//!   falls back to; any other setup error fails the test.

#![allow(dead_code)] // each test binary uses its own subset

use plugio_device::buf::{configure_arena, ArenaConfig};
use plugio_device::{DeviceDriver, RingConfig, RingInfo};

/// One configuration of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Setup {
    /// A ring with no optional setup flags (no taskrun flags, no SQPOLL);
    /// registered files and buffers on.
    Plain,
    /// `SINGLE_ISSUER` + `DEFER_TASKRUN` (+ `TASKRUN_FLAG`): the default.
    DeferTaskrun,
    /// `COOP_TASKRUN` (+ `TASKRUN_FLAG`), `DEFER_TASKRUN` not tried.
    CoopTaskrun,
    /// `IORING_SETUP_SQPOLL` (a kernel thread polls the SQ), no taskrun
    /// flags.
    Sqpoll,
    /// A plain ring with no registered buffers (the core's arena is off:
    /// no `READ_FIXED`/`WRITE_FIXED`) and no registered files (raw fds).
    Unregistered,
    /// No io_uring at all: the driver runs without a ring, as
    /// `DeviceDriver::new` does where io_uring is refused, and file IO
    /// goes through the sync thread pool.
    SyncFallback,
    /// The simulated in-memory device instead of a file, on the default
    /// ring.
    Mem,
}

impl Setup {
    /// Every configuration, in the order of [`matrix!`]'s modules.
    pub const ALL: [Setup; 7] = [
        Setup::Plain,
        Setup::DeferTaskrun,
        Setup::CoopTaskrun,
        Setup::Sqpoll,
        Setup::Unregistered,
        Setup::SyncFallback,
        Setup::Mem,
    ];

    /// The name of this configuration's module in [`matrix!`].
    pub fn name(self) -> &'static str {
        match self {
            Setup::Plain => "plain",
            Setup::DeferTaskrun => "defer_taskrun",
            Setup::CoopTaskrun => "coop_taskrun",
            Setup::Sqpoll => "sqpoll",
            Setup::Unregistered => "unregistered",
            Setup::SyncFallback => "sync_fallback",
            Setup::Mem => "mem",
        }
    }

    /// The configuration whose module `module_path!()` names: the last
    /// path segment that is a configuration's name.
    ///
    /// # Panics
    /// When no segment names one.
    pub fn from_module_path(path: &str) -> Setup {
        path.rsplit("::")
            .find_map(|seg| Setup::ALL.into_iter().find(|s| s.name() == seg))
            .unwrap_or_else(|| panic!("{path} names no matrix configuration"))
    }

    /// The ring this configuration builds; `None` for the sync fallback.
    pub fn ring_config(self) -> Option<RingConfig> {
        let plain = RingConfig {
            taskrun_flags: false,
            ..RingConfig::default()
        };
        match self {
            Setup::Plain => Some(plain),
            Setup::DeferTaskrun | Setup::Mem => Some(RingConfig::default()),
            Setup::CoopTaskrun => Some(RingConfig {
                defer_taskrun: false,
                ..RingConfig::default()
            }),
            Setup::Sqpoll => Some(RingConfig {
                sqpoll_idle_ms: Some(10),
                ..plain
            }),
            Setup::Unregistered => Some(RingConfig {
                registered_files: 0,
                ..plain
            }),
            Setup::SyncFallback => None,
        }
    }

    /// True when the suites run on a `MemDevice` instead of a file.
    pub fn mem_device(self) -> bool {
        self == Setup::Mem
    }

    /// Reports that a check of this configuration cannot run here, and
    /// why: `SKIP <configuration>: <reason>` written straight to the
    /// process's stderr, so that it shows in `cargo test`'s output even
    /// when the test passes (libtest captures only `eprintln!`).
    pub fn skip(self, reason: &str) {
        use std::io::Write;
        let line = format!("SKIP {}: {reason}\n", self.name());
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    /// Installs this configuration's driver on the calling thread (for
    /// [`Setup::Unregistered`], first turns the thread's buffer arena off).
    ///
    /// Where io_uring itself is refused (`EPERM`, `ENOSYS`) it prints a
    /// `SKIP` line naming the configuration and the error and returns the
    /// ring-less driver `DeviceDriver::new` falls back to.
    ///
    /// # Panics
    /// Any other setup error; the arena of this thread already existed
    /// (so it could not be turned off).
    pub fn driver(self) -> DeviceDriver {
        let Some(config) = self.ring_config() else {
            return DeviceDriver::without_ring().expect("ring-less driver");
        };
        if self == Setup::Unregistered {
            let off = ArenaConfig {
                nr_chunks: 0,
                ..ArenaConfig::default()
            };
            assert!(
                configure_arena(off),
                "{}: this thread's arena already exists; cannot turn registered buffers off",
                self.name()
            );
        }
        match DeviceDriver::with_ring(&config) {
            Ok(driver) => driver,
            Err(e) if matches!(e.errno(), libc::EPERM | libc::ENOSYS) => {
                // Once per configuration and process: a test builds many
                // drivers (one per core, one per runtime).
                static SAID: std::sync::Mutex<Vec<Setup>> = std::sync::Mutex::new(Vec::new());
                let mut said = SAID
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if !said.contains(&self) {
                    said.push(self);
                    self.skip(&format!(
                        "io_uring_setup refused this ring ({e}); every {} case of this run \
                         runs on the sync pool DeviceDriver::new falls back to",
                        self.name()
                    ));
                }
                let driver = DeviceDriver::new(&config).expect("fallback driver");
                assert!(driver.ring_info().is_none(), "fell back to no ring");
                driver
            }
            Err(e) => panic!("{}: ring setup failed: {e}", self.name()),
        }
    }
}

impl Setup {
    /// Checks the ring a core of this configuration observed (`info`:
    /// `None` without a ring; `uring_active`: the thread's
    /// `uring_active()`) against what the configuration promises: ring or
    /// none, the taskrun and SQPOLL setup flags, the registered-file
    /// table. A flag the kernel refused (the ring's setup drops it on
    /// `EINVAL`) or a table it refused is reported as a `SKIP` of that
    /// check, never passed over silently.
    ///
    /// # Panics
    /// When the ring is not what the configuration promises.
    pub fn check_ring(self, info: Option<&RingInfo>, uring_active: bool) {
        let name = self.name();
        if self == Setup::SyncFallback {
            assert!(!uring_active, "{name}: no ring on the core");
            assert!(info.is_none(), "{name}: no ring on the core");
            return;
        }
        let Some(info) = info else {
            // `Setup::driver` printed why (io_uring refused: EPERM/ENOSYS).
            self.skip("no ring on this machine; checked only that IO ran on the fallback");
            assert!(!uring_active);
            return;
        };
        assert!(uring_active, "{name}: the core's IO goes through its ring");
        let want_defer = matches!(self, Setup::DeferTaskrun | Setup::Mem);
        let want_coop = self == Setup::CoopTaskrun;
        assert!(
            want_defer || !info.defer_taskrun,
            "{name}: DEFER_TASKRUN not asked for\n{info}"
        );
        let defer_refused = want_defer && !info.defer_taskrun;
        if defer_refused {
            self.skip("the kernel refused SINGLE_ISSUER|DEFER_TASKRUN (EINVAL; before 6.1)");
        }
        if want_coop && !info.coop_taskrun {
            self.skip("the kernel refused COOP_TASKRUN (EINVAL; before 5.19)");
        } else if !defer_refused {
            assert_eq!(info.coop_taskrun, want_coop, "{name}\n{info}");
        }
        assert_eq!(
            info.taskrun_flag,
            info.defer_taskrun || info.coop_taskrun,
            "{name}\n{info}"
        );
        assert_eq!(info.sqpoll, self == Setup::Sqpoll, "{name}\n{info}");
        assert!(!info.iopoll, "{name}\n{info}");
        let want_files = self.ring_config().map_or(0, |c| c.registered_files);
        if want_files > 0 && info.registered_files == 0 {
            self.skip("the kernel refused the registered-file table");
        } else {
            assert_eq!(info.registered_files, want_files, "{name}\n{info}");
        }
    }
}

/// Writes each test once and runs it in every [`Setup`]: one module per
/// configuration (named by [`Setup::name`]), each with `use super::*`,
/// a `const SETUP: Setup` and the given items. A body asks `SETUP` (or
/// `Setup::from_module_path(module_path!())`) what it runs on.
///
/// The calling file must have `Setup` in scope at its root.
macro_rules! matrix {
    (@one $module:ident, $setup:ident, { $($items:tt)* }) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            #[allow(dead_code)]
            const SETUP: Setup = Setup::$setup;
            $($items)*
        }
    };
    ($($items:tt)*) => {
        matrix!(@one plain, Plain, { $($items)* });
        matrix!(@one defer_taskrun, DeferTaskrun, { $($items)* });
        matrix!(@one coop_taskrun, CoopTaskrun, { $($items)* });
        matrix!(@one sqpoll, Sqpoll, { $($items)* });
        matrix!(@one unregistered, Unregistered, { $($items)* });
        matrix!(@one sync_fallback, SyncFallback, { $($items)* });
        matrix!(@one mem, Mem, { $($items)* });
    };
}
