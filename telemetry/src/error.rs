//! The crate's error type.

use opentelemetry_sdk::error::OTelSdkError;

/// What went wrong while setting up or flushing telemetry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// The Prometheus exporter could not be built or registered.
    #[error("building the Prometheus exporter failed: {0}")]
    Prometheus(#[source] OTelSdkError),
    /// A flush or shutdown of the metrics or trace pipeline failed.
    #[error("telemetry {action} failed: {source}")]
    Pipeline {
        /// What was being done (`flush`, `shutdown`).
        action: &'static str,
        /// The SDK's error.
        #[source]
        source: OTelSdkError,
    },
    /// The log filter (the `RUST_LOG` value or the configured default) is invalid.
    #[error("invalid log filter {filter:?}: {message}; use directives like `info` or `paddock_pool=debug,warn`")]
    Filter {
        /// The rejected filter.
        filter: String,
        /// Why it was rejected.
        message: String,
    },
    /// A global `tracing` subscriber was already installed.
    #[error("installing the tracing subscriber failed: {0}; init_tracing may be called once per process")]
    SubscriberInit(#[from] tracing::subscriber::SetGlobalDefaultError),
    /// An OTLP exporter could not be built.
    #[cfg(feature = "otlp")]
    #[error("building the OTLP exporter failed: {0}")]
    Otlp(#[from] opentelemetry_otlp::ExporterBuildError),
}
