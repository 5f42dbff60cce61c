//! Who checks an IO before it gets a bio: the engine runs the geometry
//! check inline for a backend that says its check is only that
//! (`Backend::checks_geometry_only`: the file backend and the mem device),
//! and asks every other backend through `Backend::check` (issue #12,
//! "validate once").

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::{local, watchdog};
use plugio_device::backend::mem::{MemConfig, MemDevice};
use plugio_device::{Backend, DmaBuf, Error, ErrorKind, FileBackend, IoOp};
use plugio_engine::{Device, DeviceOptions};

/// The offset from which [`OwnRule`] refuses writes.
const READ_ONLY_FROM_BYTES: u64 = 64 << 10;

/// A mem device with a check of its own: writes at or past
/// [`READ_ONLY_FROM_BYTES`] are refused, as a backend with a write-protected
/// zone would. Counts its checks and its submissions.
#[derive(Debug)]
struct OwnRule {
    inner: Arc<MemDevice>,
    checks: AtomicU64,
    submits: AtomicU64,
}

impl Backend for OwnRule {
    fn geometry(&self) -> &plugio_device::Geometry {
        self.inner.geometry()
    }

    fn kind(&self) -> plugio_device::backend::BackendKind {
        self.inner.kind()
    }

    fn check(&self, op: &IoOp<'_>) -> plugio_device::Result<()> {
        self.checks.fetch_add(1, Ordering::Relaxed);
        if op.kind.is_write() && op.offset_bytes + op.len_bytes > READ_ONLY_FROM_BYTES {
            return Err(Error::new(ErrorKind::PermissionDenied)
                .with_context("write-protected zone (test backend)"));
        }
        self.inner.check(op)
    }

    unsafe fn submit(
        &self,
        op: &IoOp<'_>,
        handler: plugio_device::HandlerId,
        token: u64,
    ) -> plugio_device::Result<()> {
        self.submits.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.submit(op, handler, token) }
    }
}

#[test]
fn a_backend_with_its_own_check_is_asked_before_submission() {
    watchdog(60, || {
        let backend = Arc::new(OwnRule {
            inner: Arc::new(MemDevice::new(MemConfig {
                capacity_bytes: 1 << 20,
                ..Default::default()
            })),
            checks: AtomicU64::new(0),
            submits: AtomicU64::new(0),
        });
        assert!(
            !backend.checks_geometry_only(),
            "the trait's default: a backend is asked unless it says otherwise"
        );
        let dyn_backend: Arc<dyn Backend> = backend.clone();
        let dev = Device::with_backend(dyn_backend, None, DeviceOptions::default()).unwrap();
        let (allowed, refused) = local().run(async move {
            let (allowed, _) = dev.write_at(DmaBuf::new(4096), 0).await;
            let (refused, _) = dev.write_at(DmaBuf::new(4096), READ_ONLY_FROM_BYTES).await;
            (allowed, refused)
        });
        assert_eq!(allowed.expect("a write below the zone"), 4096);
        let e = refused.expect_err("a write in the zone is refused by the backend's check");
        assert_eq!(e.kind(), &ErrorKind::PermissionDenied, "{e}");
        assert_eq!(
            backend.checks.load(Ordering::Relaxed),
            2,
            "both writes were checked"
        );
        assert_eq!(
            backend.submits.load(Ordering::Relaxed),
            1,
            "the refused write never reached submission"
        );
    });
}

#[test]
fn the_file_backend_and_the_mem_device_check_only_their_geometry() {
    let mem = MemDevice::new(MemConfig::default());
    assert!(mem.checks_geometry_only());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::write(&path, vec![0u8; 8192]).unwrap();
    let file = FileBackend::open(&path).unwrap();
    assert!(file.checks_geometry_only());
    // And the inline check refuses what the backend's own check refuses:
    // a read past i64::MAX, through the engine.
    let dev = Device::open(&path, DeviceOptions::default()).unwrap();
    let r = local().run(async move {
        let (r, _) = dev.read_at(DmaBuf::new(4096), u64::MAX - 4095).await;
        r
    });
    let e = r.expect_err("a range past i64::MAX is refused");
    assert!(matches!(e.kind(), ErrorKind::InvalidInput(_)), "{e}");
}
