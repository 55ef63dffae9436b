//! The tracing span of one execution.

use std::fmt;

use opentelemetry::trace::TraceContextExt as _;
use opentelemetry::Context;
use tracing::field::{display, Empty};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::TraceParent;

/// Creates the `execution` span (level INFO) of one execution.
///
/// Fields: `id`, `engine`, `tenant`, and, when `traceparent` holds a valid W3C
/// `traceparent` header value, `trace_id` and `parent_span_id` taken from it.
/// When the subscriber has the OpenTelemetry layer (see
/// [`init_tracing`](crate::init_tracing)), the span also joins the caller's
/// trace as a child of the remote parent. A malformed `traceparent` is ignored
/// (logged at DEBUG) and the span starts a trace of its own; it never panics.
///
/// ```
/// let span = paddock_telemetry::execution_span(
///     "0190b5e4-7c1a-7e2b-9c3d-4e5f60718293",
///     "subprocess",
///     "acme",
///     Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
/// );
/// let _entered = span.enter();
/// tracing::info!("running");
/// ```
pub fn execution_span(
    id: impl fmt::Display,
    engine: &str,
    tenant: &str,
    traceparent: Option<&str>,
) -> Span {
    let span = tracing::info_span!(
        "execution",
        id = %id,
        engine,
        tenant,
        trace_id = Empty,
        parent_span_id = Empty,
    );
    let parent = traceparent.and_then(|value| match TraceParent::parse(value) {
        Ok(parent) => Some(parent),
        Err(err) => {
            tracing::debug!(error = %err, "ignoring malformed traceparent header");
            None
        }
    });
    if let Some(parent) = parent {
        span.record("trace_id", display(parent.trace_id()));
        span.record("parent_span_id", display(parent.parent_id()));
        let cx = Context::new().with_remote_span_context(parent.span_context());
        // Without the OpenTelemetry layer there is no trace to join; the fields
        // above still carry the caller's ids.
        let _ = span.set_parent(cx);
    }
    span
}
