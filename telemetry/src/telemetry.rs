//! The [`Telemetry`] handle: the `paddock` meter, its instruments and exporters.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider as _, ObservableGauge};
use opentelemetry::{InstrumentationScope, Key, KeyValue};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::Resource;

use crate::labels;
use crate::pool_gauges::{PoolGaugeSource, PoolRegistry, PoolSnapshot};
use crate::TelemetryError;

/// Name of the meter (the instrumentation scope) every Paddock instrument lives in.
pub const METER_NAME: &str = "paddock";

/// Default bucket bounds of `paddock_execution_duration_ms`, in milliseconds.
///
/// From 100 µs (a call into a warm isolate) to 5 minutes (a long container job).
pub const DEFAULT_DURATION_BUCKETS_MS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1_000.0, 2_500.0,
    5_000.0, 10_000.0, 30_000.0, 60_000.0, 300_000.0,
];

const ENGINE: Key = Key::from_static_str(labels::ENGINE);
const OUTCOME: Key = Key::from_static_str(labels::OUTCOME);
const RESULT: Key = Key::from_static_str(labels::RESULT);
const REASON: Key = Key::from_static_str(labels::REASON);
const RULE: Key = Key::from_static_str(labels::RULE);

/// A `(engine, outcome)` attribute set built from static strings: no allocation.
/// An attribute value: a `&'static str` or a shared string, neither copied when a
/// measurement is recorded.
pub type Label = opentelemetry::StringValue;

fn engine_outcome(engine: Label, outcome: &'static str) -> [KeyValue; 2] {
    [
        KeyValue::new(ENGINE, engine),
        KeyValue::new(OUTCOME, outcome),
    ]
}

/// Paddock's metrics: a cheap, cloneable handle to the `paddock` meter's instruments.
///
/// Every clone records into the same instruments. The `record_*` methods take
/// static label values and do not allocate once a label combination has been
/// seen; a call is a read-locked hash lookup and an atomic update inside the
/// OpenTelemetry SDK.
///
/// Series as Prometheus shows them (OTLP and stdout carry the same names without
/// the `_total` suffix):
///
/// | series | labels |
/// |---|---|
/// | `paddock_executions_total` | `engine`, `outcome` |
/// | `paddock_rule_blocks_total` | `rule` |
/// | `paddock_pool_acquisitions_total` | `engine`, `result` |
/// | `paddock_execution_duration_ms` (histogram) | `engine`, `outcome` |
/// | `paddock_kills_total` | `reason` |
/// | `paddock_egress_decisions_total` | `engine`, `verdict` (`allowed`, `denied`) |
/// | `paddock_pool_size`, `_idle`, `_busy`, `_waiting` (gauges) | `engine` |
///
/// [`labels`] lists the known label values.
#[derive(Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

struct Inner {
    provider: SdkMeterProvider,
    meter: Meter,
    executions: Counter<u64>,
    rule_blocks: Counter<u64>,
    pool_acquisitions: Counter<u64>,
    execution_duration: Histogram<f64>,
    kills: Counter<u64>,
    egress: Counter<u64>,
    pools: PoolRegistry,
    /// Kept so the gauges live as long as the handle.
    _pool_gauges: [ObservableGauge<u64>; 4],
    prometheus: Option<prometheus::Registry>,
    exporters: Vec<&'static str>,
}

impl Telemetry {
    /// A builder with no exporter selected.
    pub fn builder() -> TelemetryBuilder {
        TelemetryBuilder::default()
    }

    /// Telemetry with the Prometheus exporter, for [`render_prometheus`](Self::render_prometheus).
    pub fn prometheus() -> Result<Self, TelemetryError> {
        Self::builder().with_prometheus().build()
    }

    /// Telemetry that exports nowhere: the instruments exist, recording is cheap and
    /// nothing is kept. For embedders and tests that do not want metrics.
    pub fn disabled() -> Self {
        Self::from_provider(SdkMeterProvider::builder().build(), None, Vec::new(), None)
    }

    fn from_provider(
        provider: SdkMeterProvider,
        prometheus: Option<prometheus::Registry>,
        exporters: Vec<&'static str>,
        buckets: Option<Vec<f64>>,
    ) -> Self {
        let scope = InstrumentationScope::builder(METER_NAME)
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let meter = provider.meter_with_scope(scope);
        let pools = PoolRegistry::default();
        let gauge =
            |name: &'static str, description: &'static str, pick: fn(&PoolSnapshot) -> u64| {
                let pools = pools.clone();
                meter
                    .u64_observable_gauge(name)
                    .with_description(description)
                    .with_callback(move |observer| {
                        pools.observe(pick, |v, attrs| observer.observe(v, attrs))
                    })
                    .build()
            };
        let pool_gauges = [
            gauge(
                "paddock_pool_size",
                "Engine instances held by the pool",
                |s| s.size,
            ),
            gauge("paddock_pool_idle", "Idle engine instances", |s| s.idle),
            gauge("paddock_pool_busy", "Busy engine instances", |s| s.busy),
            gauge(
                "paddock_pool_waiting",
                "Requests waiting for an engine instance",
                |s| s.waiting,
            ),
        ];
        let inner = Inner {
            executions: meter
                .u64_counter("paddock_executions")
                .with_description("Executions finished, by engine and outcome")
                .build(),
            rule_blocks: meter
                .u64_counter("paddock_rule_blocks")
                .with_description("Requests refused by a policy rule")
                .build(),
            pool_acquisitions: meter
                .u64_counter("paddock_pool_acquisitions")
                .with_description("Engine pool acquisitions, by engine and result")
                .build(),
            execution_duration: meter
                .f64_histogram("paddock_execution_duration_ms")
                .with_description("Execution wall time in milliseconds, by engine and outcome")
                .with_unit("ms")
                .with_boundaries(buckets.unwrap_or_else(|| DEFAULT_DURATION_BUCKETS_MS.to_vec()))
                .build(),
            kills: meter
                .u64_counter("paddock_kills")
                .with_description("Process trees or engines killed, by reason")
                .build(),
            egress: meter
                .u64_counter("paddock_egress_decisions")
                .with_description(
                    "Egress decisions (connections and name lookups) of allowlist sandboxes' executions, by engine and verdict",
                )
                .build(),
            pools,
            _pool_gauges: pool_gauges,
            prometheus,
            exporters,
            provider,
            meter,
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Counts one finished execution.
    pub fn record_execution(&self, engine: impl Into<Label>, outcome: &'static str) {
        self.inner
            .executions
            .add(1, &engine_outcome(engine.into(), outcome));
    }

    /// Records an execution's wall time in milliseconds.
    ///
    /// A negative or non-finite value is a caller's bug and is dropped, so it
    /// cannot poison the histogram's sum.
    pub fn record_duration(&self, engine: impl Into<Label>, outcome: &'static str, ms: f64) {
        if !(ms.is_finite() && ms >= 0.0) {
            return;
        }
        self.inner
            .execution_duration
            .record(ms, &engine_outcome(engine.into(), outcome));
    }

    /// Counts one request refused by the policy rule named `rule`.
    ///
    /// Rule names come from configuration, so this copies `rule` into the
    /// attribute set: a blocked request is not the hot path.
    pub fn record_rule_block(&self, rule: &str) {
        self.inner
            .rule_blocks
            .add(1, &[KeyValue::new(RULE, rule.to_owned())]);
    }

    /// Counts one pool acquisition and how it ended (see [`labels::acquire`]).
    pub fn record_pool_acquisition(&self, engine: impl Into<Label>, result: &'static str) {
        self.inner.pool_acquisitions.add(
            1,
            &[
                KeyValue::new(ENGINE, engine.into()),
                KeyValue::new(RESULT, result),
            ],
        );
    }

    /// Counts one kill and why it happened (see [`labels::kill`]).
    pub fn record_kill(&self, reason: &'static str) {
        self.inner.kills.add(1, &[KeyValue::new(REASON, reason)]);
    }

    /// Counts `n` egress decisions of verdict `verdict` (`allowed` or `denied`) made
    /// during executions on `engine`.
    pub fn record_egress(&self, engine: impl Into<Label>, verdict: &'static str, n: u64) {
        if n == 0 {
            return;
        }
        self.inner.egress.add(
            n,
            &[
                KeyValue::new(ENGINE, engine.into()),
                KeyValue::new("verdict", verdict),
            ],
        );
    }

    /// Registers the occupancy source of the pool of `engine`.
    ///
    /// The pool gauges read `source` whenever metrics are collected. Registering
    /// the same engine again replaces its source.
    pub fn register_pool(&self, engine: &str, source: Arc<dyn PoolGaugeSource>) {
        self.inner.pools.register(engine, source);
    }

    /// Stops reporting the pool of `engine`; `true` if one was registered.
    pub fn unregister_pool(&self, engine: &str) -> bool {
        self.inner.pools.unregister(engine)
    }

    /// The current metrics in the Prometheus text exposition format (version 0.0.4),
    /// ready to serve from `GET /metrics` with content type
    /// [`PROMETHEUS_CONTENT_TYPE`](crate::PROMETHEUS_CONTENT_TYPE).
    ///
    /// Empty when the Prometheus exporter was not enabled.
    pub fn render_prometheus(&self) -> String {
        let Some(registry) = &self.inner.prometheus else {
            return String::new();
        };
        let mut out = String::new();
        if let Err(err) = prometheus::TextEncoder::new().encode_utf8(&registry.gather(), &mut out) {
            tracing::warn!(error = %err, "rendering Prometheus metrics failed");
        }
        out
    }

    /// Whether [`render_prometheus`](Self::render_prometheus) has anything to render.
    pub fn has_prometheus(&self) -> bool {
        self.inner.prometheus.is_some()
    }

    /// The `paddock` meter, for instruments this crate does not define.
    pub fn meter(&self) -> &Meter {
        &self.inner.meter
    }

    /// Exports what periodic exporters (stdout, OTLP) have not sent yet.
    pub fn force_flush(&self) -> Result<(), TelemetryError> {
        self.inner
            .provider
            .force_flush()
            .map_err(|source| TelemetryError::Pipeline {
                action: "flush",
                source,
            })
    }

    /// Flushes and stops every exporter. Later records go nowhere, through every
    /// clone of this handle. Dropping the last clone shuts down as well.
    pub fn shutdown(&self) -> Result<(), TelemetryError> {
        self.inner
            .provider
            .shutdown()
            .map_err(|source| TelemetryError::Pipeline {
                action: "shutdown",
                source,
            })
    }
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Telemetry")
            .field("meter", &METER_NAME)
            .field("exporters", &self.inner.exporters)
            .finish_non_exhaustive()
    }
}

/// Chooses the exporters of a [`Telemetry`].
///
/// Defaults: no exporter, service name `paddock`, duration buckets
/// [`DEFAULT_DURATION_BUCKETS_MS`].
#[derive(Debug, Default)]
pub struct TelemetryBuilder {
    service_name: Option<String>,
    prometheus: bool,
    stdout_interval: Option<Duration>,
    #[cfg(feature = "otlp")]
    otlp: Option<crate::otlp::OtlpConfig>,
    buckets: Option<Vec<f64>>,
}

impl TelemetryBuilder {
    /// The `service.name` resource attribute (default `paddock`).
    pub fn service_name(mut self, name: impl Into<String>) -> Self {
        self.service_name = Some(name.into());
        self
    }

    /// Enables the Prometheus exporter with a registry of its own.
    pub fn with_prometheus(mut self) -> Self {
        self.prometheus = true;
        self
    }

    /// Prints the metrics to stdout every `interval` (and on
    /// [`Telemetry::force_flush`] and shutdown), in the OpenTelemetry stdout
    /// exporter's human-readable form. A background thread does the printing.
    pub fn with_stdout(mut self, interval: Duration) -> Self {
        self.stdout_interval = Some(interval);
        self
    }

    /// Exports the metrics over OTLP/HTTP (protobuf) as `config` says.
    #[cfg(feature = "otlp")]
    pub fn with_otlp(mut self, config: crate::otlp::OtlpConfig) -> Self {
        self.otlp = Some(config);
        self
    }

    /// Bucket bounds of `paddock_execution_duration_ms`, in milliseconds, ascending.
    pub fn duration_buckets(mut self, bounds: Vec<f64>) -> Self {
        self.buckets = Some(bounds);
        self
    }

    /// Builds the meter provider, its exporters and the instruments.
    pub fn build(self) -> Result<Telemetry, TelemetryError> {
        let service_name = self.service_name.unwrap_or_else(|| METER_NAME.to_owned());
        let mut builder = SdkMeterProvider::builder()
            .with_resource(Resource::builder().with_service_name(service_name).build());
        let mut exporters = Vec::new();

        let mut registry = None;
        if self.prometheus {
            let reg = prometheus::Registry::new();
            let exporter = opentelemetry_prometheus::exporter()
                .with_registry(reg.clone())
                // Keep `paddock_execution_duration_ms` as named; the unit stays in
                // the instrument's metadata for OTLP.
                .without_units()
                .build()
                .map_err(TelemetryError::Prometheus)?;
            builder = builder.with_reader(exporter);
            registry = Some(reg);
            exporters.push("prometheus");
        }
        if let Some(interval) = self.stdout_interval {
            let exporter = opentelemetry_stdout::MetricExporter::builder().build();
            builder = builder.with_reader(
                PeriodicReader::builder(exporter)
                    .with_interval(interval)
                    .build(),
            );
            exporters.push("stdout");
        }
        #[cfg(feature = "otlp")]
        if let Some(config) = &self.otlp {
            builder = builder.with_reader(config.metric_reader()?);
            exporters.push("otlp");
        }

        Ok(Telemetry::from_provider(
            builder.build(),
            registry,
            exporters,
            self.buckets,
        ))
    }
}
