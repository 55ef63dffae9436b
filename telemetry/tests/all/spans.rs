//! `execution_span`: fields, and joining the caller's trace through the
//! OpenTelemetry layer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use opentelemetry::trace::{TraceContextExt as _, TraceId};
use opentelemetry_sdk::trace::SdkTracerProvider;
use paddock_telemetry::{execution_span, TraceParent, TracingConfig};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::Layer;

const HEADER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Records the fields of every span by span name.
#[derive(Clone, Default)]
struct Fields(Arc<Mutex<HashMap<String, HashMap<String, String>>>>);

struct Visitor<'a>(&'a mut HashMap<String, String>);

impl Visit for Visitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>> Layer<S> for Fields {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let name = ctx.span(id).unwrap().name().to_owned();
        let mut map = self.0.lock().unwrap();
        attrs.record(&mut Visitor(map.entry(name).or_default()));
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let name = ctx.span(id).unwrap().name().to_owned();
        let mut map = self.0.lock().unwrap();
        values.record(&mut Visitor(map.entry(name).or_default()));
    }
}

impl Fields {
    fn of(&self, span: &str) -> HashMap<String, String> {
        self.0
            .lock()
            .unwrap()
            .get(span)
            .cloned()
            .unwrap_or_default()
    }
}

#[test]
fn span_fields_carry_ids_and_the_callers_trace() {
    let fields = Fields::default();
    let subscriber = tracing_subscriber::registry().with(fields.clone());
    tracing::subscriber::with_default(subscriber, || {
        let span = execution_span("exec-1", "subprocess", "acme", Some(HEADER));
        assert!(!span.is_disabled());
    });
    let f = fields.of("execution");
    assert_eq!(f["id"], "exec-1");
    assert_eq!(f["engine"], "subprocess");
    assert_eq!(f["tenant"], "acme");
    assert_eq!(f["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(f["parent_span_id"], "00f067aa0ba902b7");
}

#[test]
fn malformed_or_missing_traceparent_leaves_trace_fields_empty() {
    for header in [
        None,
        Some(""),
        Some("garbage"),
        Some("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"),
        Some("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    ] {
        let fields = Fields::default();
        let subscriber = tracing_subscriber::registry().with(fields.clone());
        tracing::subscriber::with_default(subscriber, || {
            let _span = execution_span(7, "isolate", "t", header);
        });
        let f = fields.of("execution");
        assert_eq!(f["id"], "7", "{header:?}");
        assert!(!f.contains_key("trace_id"), "{header:?}: {f:?}");
        assert!(!f.contains_key("parent_span_id"), "{header:?}: {f:?}");
    }
}

/// The trace id OpenTelemetry gives `execution_span(.., header)` under the layer.
fn otel_trace_id(header: Option<&str>) -> (TraceId, bool) {
    let provider = SdkTracerProvider::builder().build();
    let (dispatch, guard) = TracingConfig::new("info")
        .with_env_filter(false)
        .with_test_writer()
        .with_tracer_provider(provider)
        .build()
        .unwrap();
    let result = tracing::dispatcher::with_default(&dispatch, || {
        let span = execution_span("exec-2", "container", "acme", header);
        let _entered = span.enter();
        let cx = span.context();
        let span_ref = cx.span();
        let sc = span_ref.span_context();
        assert!(sc.is_valid());
        (sc.trace_id(), sc.is_remote())
    });
    guard.shutdown().unwrap();
    result
}

#[test]
fn with_the_otel_layer_the_span_joins_the_remote_trace() {
    let expected = TraceParent::parse(HEADER).unwrap().trace_id();
    let (trace_id, remote) = otel_trace_id(Some(HEADER));
    assert_eq!(trace_id, expected);
    // The execution span is a local child of the remote parent.
    assert!(!remote);

    // A malformed header starts a fresh trace instead.
    let bad = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0X";
    let (trace_id, _) = otel_trace_id(Some(bad));
    assert_ne!(trace_id, expected);
    let (trace_id, _) = otel_trace_id(None);
    assert_ne!(trace_id, expected);
}
