//! OTLP/HTTP (protobuf) exporters for metrics and spans (cargo feature `otlp`).

use std::time::Duration;

use opentelemetry_otlp::{MetricExporter, SpanExporter, WithExportConfig as _};
use opentelemetry_sdk::metrics::PeriodicReader;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;

use crate::TelemetryError;

/// Where and how often to send OTLP data.
///
/// Defaults: endpoint from the standard `OTEL_EXPORTER_OTLP_*` environment
/// variables, else `http://localhost:4318`; request timeout 10 s; metrics every
/// 60 s.
#[derive(Debug, Clone)]
pub struct OtlpConfig {
    endpoint: Option<String>,
    timeout: Duration,
    interval: Duration,
    service_name: String,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            timeout: Duration::from_secs(10),
            interval: Duration::from_secs(60),
            service_name: crate::METER_NAME.to_owned(),
        }
    }
}

impl OtlpConfig {
    /// Sends to the collector at `base_url` (such as `http://127.0.0.1:4318`):
    /// metrics to `{base_url}/v1/metrics`, spans to `{base_url}/v1/traces`.
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            endpoint: Some(base_url.into()),
            ..Self::default()
        }
    }

    /// Takes the endpoint from the `OTEL_EXPORTER_OTLP_*` environment variables.
    pub fn from_env() -> Self {
        Self::default()
    }

    /// Timeout of one export request.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How often metrics are sent.
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// The `service.name` resource attribute of exported spans (default `paddock`).
    pub fn with_service_name(mut self, name: impl Into<String>) -> Self {
        self.service_name = name.into();
        self
    }

    fn signal_url(&self, path: &str) -> Option<String> {
        self.endpoint
            .as_deref()
            .map(|base| format!("{}{path}", base.trim_end_matches('/')))
    }

    /// A periodic reader pushing metrics to `/v1/metrics`.
    pub(crate) fn metric_reader(&self) -> Result<PeriodicReader<MetricExporter>, TelemetryError> {
        let mut builder = MetricExporter::builder()
            .with_http()
            .with_timeout(self.timeout);
        if let Some(url) = self.signal_url("/v1/metrics") {
            builder = builder.with_endpoint(url);
        }
        Ok(PeriodicReader::builder(builder.build()?)
            .with_interval(self.interval)
            .build())
    }

    /// A tracer provider batching spans to `/v1/traces`, for
    /// [`TracingConfig::with_tracer_provider`](crate::TracingConfig::with_tracer_provider).
    pub fn tracer_provider(&self) -> Result<SdkTracerProvider, TelemetryError> {
        let mut builder = SpanExporter::builder()
            .with_http()
            .with_timeout(self.timeout);
        if let Some(url) = self.signal_url("/v1/traces") {
            builder = builder.with_endpoint(url);
        }
        Ok(SdkTracerProvider::builder()
            .with_resource(
                Resource::builder()
                    .with_service_name(self.service_name.clone())
                    .build(),
            )
            .with_batch_exporter(builder.build()?)
            .build())
    }
}
