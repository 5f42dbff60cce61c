//! Observability: the device's `tracing` span, the per-IO events of the
//! `trace-io` feature, `IoStats::delta`, and `IoStats` as JSON (feature
//! `serde`). The feature-gated tests run in CI with
//! `cargo test -p plugio-engine --features trace-io,serde --test observability`.

mod common;

use std::sync::{Arc, Mutex};

use common::{local, tmpdir};
use plugio_engine::device::Device;
use plugio_engine::options::DeviceOptions;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// One recorded event: its message, its fields, and the fields of the
/// `plugio_device` span it is in (empty when in none).
#[derive(Debug, Clone, Default)]
#[cfg_attr(not(feature = "trace-io"), allow(dead_code))] // `fields`: per-IO events only
struct Seen {
    target: String,
    message: String,
    fields: Vec<(String, String)>,
    device: Vec<(String, String)>,
}

impl Seen {
    #[cfg_attr(not(feature = "trace-io"), allow(dead_code))]
    fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn device_field(&self, name: &str) -> Option<&str> {
        self.device
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Fields(Vec<(String, String)>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
}

/// A layer that records every event with its device span's fields.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Seen>>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields.0);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let message = fields
            .0
            .iter()
            .find(|(n, _)| n == "message")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let device = ctx
            .event_scope(event)
            .and_then(|scope| {
                scope
                    .from_root()
                    .find(|s| s.name() == "plugio_device")
                    .and_then(|s| s.extensions().get::<Vec<(String, String)>>().cloned())
            })
            .unwrap_or_default();
        self.0.lock().expect("recorder").push(Seen {
            target: event.metadata().target().to_owned(),
            message,
            fields: fields.0,
            device,
        });
    }
}

/// Runs `f` with the recorder as this thread's subscriber; returns what it
/// saw.
/// Serializes the tests of this file. tracing caches each callsite's
/// interest when it is first hit: a test without a subscriber that opens a
/// device while another test is installing its scoped subscriber can cache
/// "never" for the `device opened` callsite against the new subscriber (a
/// race in the callsite registry), and that test then misses the event.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn record(f: impl FnOnce()) -> Vec<Seen> {
    let recorder = Recorder::default();
    let subscriber = tracing_subscriber::registry().with(recorder.clone());
    tracing::subscriber::with_default(subscriber, f);
    let seen = recorder.0.lock().expect("recorder").clone();
    seen
}

fn fixture(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let path = dir.path().join("dev");
    std::fs::write(&path, vec![5u8; 64 * 1024]).expect("fixture");
    path
}

#[test]
fn each_device_has_a_span_its_events_and_the_callers_are_in() {
    let _serial = serial();
    let dir = tmpdir();
    let path = fixture(&dir);
    let seen = record(|| {
        let ex = local();
        ex.run(async {
            let dev = Device::open(&path, DeviceOptions::default()).expect("open");
            dev.read_alloc_at(0, 4096).await.expect("read");
            let _in = dev.span().enter();
            tracing::info!(step = 1, "user event");
        });
    });
    let opened = seen
        .iter()
        .find(|s| s.message == "device opened")
        .unwrap_or_else(|| panic!("no `device opened` event: {seen:#?}"));
    assert!(opened.device_field("dev").is_some(), "{opened:?}");
    assert!(
        opened
            .device_field("path")
            .is_some_and(|p| p.contains("dev")),
        "{opened:?}"
    );
    assert!(opened.device_field("backend").is_some(), "{opened:?}");
    let user = seen
        .iter()
        .find(|s| s.message == "user event")
        .expect("user event");
    assert_eq!(user.device_field("dev"), opened.device_field("dev"));
    #[cfg(not(feature = "trace-io"))]
    assert!(
        !seen.iter().any(|s| s.target == "plugio::io"),
        "per-IO events without the trace-io feature: {seen:#?}"
    );
}

#[test]
fn iostats_delta_is_the_interval_between_two_snapshots() {
    let _serial = serial();
    let dir = tmpdir();
    let path = fixture(&dir);
    let ex = local();
    ex.run(async {
        let dev = Device::open(&path, DeviceOptions::default()).expect("open");
        for i in 0..4 {
            dev.read_alloc_at(i * 4096, 4096).await.expect("read");
        }
        let before = dev.iostats();
        for i in 0..6 {
            dev.read_alloc_at(i * 4096, 4096).await.expect("read");
        }
        let (r, _) = dev.write_at(dev.alloc_buf(4096), 0).await;
        r.expect("write");
        let now = dev.iostats();
        let d = now.delta(&before);
        assert_eq!(d.read.ios, 6, "{d:?}");
        assert_eq!(d.read.sectors, 6 * 8);
        assert_eq!(d.write.ios, 1);
        assert_eq!(d.bios, 7);
        assert_eq!(d.in_flight, now.in_flight);
        assert_eq!(now.read.ios, before.read.ios + d.read.ios);
        // A swapped pair saturates instead of wrapping.
        assert_eq!(before.delta(&now).read.ios, 0);
    });
}

#[cfg(feature = "trace-io")]
#[test]
fn trace_io_emits_one_issued_and_one_completed_event_per_io_in_the_device_span() {
    let _serial = serial();
    let dir = tmpdir();
    let path = fixture(&dir);
    let seen = record(|| {
        let ex = local();
        ex.run(async {
            let dev = Device::open(&path, DeviceOptions::default()).expect("open");
            dev.read_alloc_at(8192, 4096).await.expect("read");
            let (r, _) = dev.write_at(dev.alloc_buf(4096), 0).await;
            r.expect("write");
        });
    });
    let io: Vec<_> = seen.iter().filter(|s| s.target == "plugio::io").collect();
    let messages: Vec<_> = io.iter().map(|s| s.message.as_str()).collect();
    assert_eq!(
        messages,
        ["io issued", "io completed", "io issued", "io completed"],
        "{io:#?}"
    );
    assert_eq!(io[0].field("offset_bytes"), Some("8192"));
    assert_eq!(io[0].field("len_bytes"), Some("4096"));
    assert_eq!(io[1].field("bytes"), Some("4096"));
    assert!(io[1].field("latency_ns").is_some());
    assert!(
        io.iter().all(|s| s.device_field("dev").is_some()),
        "{io:#?}"
    );
}

#[cfg(feature = "serde")]
#[test]
fn iostats_serialize_to_json() {
    let _serial = serial();
    let dir = tmpdir();
    let path = fixture(&dir);
    let ex = local();
    let stats = ex.run(async {
        let dev = Device::open(&path, DeviceOptions::default()).expect("open");
        dev.read_alloc_at(0, 4096).await.expect("read");
        dev.iostats()
    });
    let json = serde_json::to_value(stats).expect("serialize");
    assert_eq!(json["read"]["ios"], 1);
    assert_eq!(json["read"]["sectors"], 8);
    assert_eq!(json["bios"], 1);
    assert!(json["tags"]["puts"].is_u64(), "{json}");
    let delta = serde_json::to_value(stats.delta(&stats)).expect("serialize");
    assert_eq!(delta["read"]["ios"], 0);
}
