//! Paddock's telemetry: the OpenTelemetry `paddock` meter with its instruments
//! and `record_*` helpers, pool occupancy gauges, a Prometheus text renderer for
//! `GET /metrics`, stdout and (feature `otlp`) OTLP exporters, and the `tracing`
//! side: one span per execution that joins the caller's W3C trace, and the CLI's
//! subscriber setup.
//!
//! ```
//! use std::sync::Arc;
//! use paddock_telemetry::{labels, PoolGauges, Telemetry};
//!
//! let telemetry = Telemetry::prometheus()?;
//! telemetry.record_execution("subprocess", labels::outcome::COMPLETED);
//! telemetry.record_duration("subprocess", labels::outcome::COMPLETED, 12.5);
//!
//! let gauges = Arc::new(PoolGauges::new());
//! telemetry.register_pool("subprocess", gauges.clone());
//! gauges.set_idle(2);
//!
//! let text = telemetry.render_prometheus();
//! assert!(text.contains("# TYPE paddock_executions_total counter"));
//! assert!(text.contains("paddock_pool_idle{engine=\"subprocess\""));
//! # Ok::<(), paddock_telemetry::TelemetryError>(())
//! ```
//!
//! Cargo features: `otlp` (off by default) adds `OtlpConfig` and the OTLP/HTTP
//! exporters for metrics and spans.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unused_must_use)]
#![forbid(unsafe_code)]

mod error;
pub mod labels;
#[cfg(feature = "otlp")]
mod otlp;
mod pool_gauges;
mod span;
mod subscriber;
mod telemetry;
mod traceparent;

pub use error::TelemetryError;
#[cfg(feature = "otlp")]
pub use otlp::OtlpConfig;
pub use pool_gauges::{PoolGaugeSource, PoolGauges, PoolSnapshot};
pub use span::execution_span;
pub use subscriber::{init_tracing, TracingConfig, TracingGuard};
pub use telemetry::{Label, Telemetry, TelemetryBuilder, DEFAULT_DURATION_BUCKETS_MS, METER_NAME};
pub use traceparent::{parse_traceparent, TraceParent, TraceParentError};

/// Content type of [`Telemetry::render_prometheus`]'s output.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
