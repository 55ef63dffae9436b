//! Integration tests of `paddock-telemetry`, one binary (see the `mod`s below).
//!
//! Every test records through the public API into real OpenTelemetry
//! instruments and reads the result back from the Prometheus text or from the
//! tracing subscriber.

mod alloc;
mod cost;
mod gauges;
mod metrics;
#[cfg(feature = "otlp")]
mod otlp;
mod prom;
mod spans;
mod subscriber;
