//! The `tracing` subscriber for the CLI: fmt to stderr, an env filter, and
//! optionally the OpenTelemetry layer.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Dispatch;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::fmt::TestWriter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::EnvFilter;

use crate::TelemetryError;

/// How [`init_tracing`] sets up logging and tracing.
///
/// Defaults: filter from `RUST_LOG`, else `info`; ANSI colours off; output to
/// stderr; no OpenTelemetry layer.
#[derive(Debug, Clone)]
pub struct TracingConfig {
    default_filter: String,
    read_env: bool,
    ansi: bool,
    test_writer: bool,
    tracer_provider: Option<SdkTracerProvider>,
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self::new("info")
    }
}

impl TracingConfig {
    /// A config whose filter, when `RUST_LOG` is unset, is `default_filter`
    /// (directives such as `info` or `paddock_pool=debug,warn`).
    pub fn new(default_filter: impl Into<String>) -> Self {
        Self {
            default_filter: default_filter.into(),
            read_env: true,
            ansi: false,
            test_writer: false,
            tracer_provider: None,
        }
    }

    /// Whether a non-empty `RUST_LOG` overrides the default filter (default `true`).
    pub fn with_env_filter(mut self, read_env: bool) -> Self {
        self.read_env = read_env;
        self
    }

    /// Colours the fmt output with ANSI escapes (for a terminal).
    pub fn with_ansi(mut self, ansi: bool) -> Self {
        self.ansi = ansi;
        self
    }

    /// Writes the fmt output through the test harness's capture instead of stderr.
    pub fn with_test_writer(mut self) -> Self {
        self.test_writer = true;
        self
    }

    /// Adds the OpenTelemetry layer: spans are sent to `provider`'s exporters and
    /// [`execution_span`](crate::execution_span) joins the caller's trace.
    pub fn with_tracer_provider(mut self, provider: SdkTracerProvider) -> Self {
        self.tracer_provider = Some(provider);
        self
    }

    /// Adds the OpenTelemetry layer with an OTLP/HTTP span exporter.
    #[cfg(feature = "otlp")]
    pub fn with_otlp(self, config: &crate::otlp::OtlpConfig) -> Result<Self, TelemetryError> {
        Ok(self.with_tracer_provider(config.tracer_provider()?))
    }

    /// The filter: `RUST_LOG` when set, else the default.
    fn filter(&self) -> Result<EnvFilter, TelemetryError> {
        let from_env = self
            .read_env
            .then(|| std::env::var(EnvFilter::DEFAULT_ENV).ok())
            .flatten()
            .filter(|value| !value.trim().is_empty());
        let directives = from_env.unwrap_or_else(|| self.default_filter.clone());
        EnvFilter::try_new(&directives).map_err(|err| TelemetryError::Filter {
            filter: directives,
            message: err.to_string(),
        })
    }

    /// Builds the subscriber without installing it.
    ///
    /// [`init_tracing`] installs it process-wide; tests and embedders can scope it
    /// with [`tracing::dispatcher::with_default`].
    pub fn build(self) -> Result<(Dispatch, TracingGuard), TelemetryError> {
        let filter = self.filter()?;
        let writer = if self.test_writer {
            BoxMakeWriter::new(TestWriter::new())
        } else {
            BoxMakeWriter::new(std::io::stderr)
        };
        let fmt = tracing_subscriber::fmt::layer()
            .with_ansi(self.ansi)
            .with_writer(writer);
        let otel = self.tracer_provider.as_ref().map(|provider| {
            tracing_opentelemetry::layer().with_tracer(provider.tracer(crate::METER_NAME))
        });
        let subscriber = tracing_subscriber::registry()
            .with(filter)
            .with(fmt)
            .with(otel);
        Ok((
            Dispatch::new(subscriber),
            TracingGuard {
                provider: self.tracer_provider,
            },
        ))
    }
}

/// Keeps the trace exporters alive; dropping it flushes and shuts them down.
#[derive(Debug)]
#[must_use = "dropping the guard shuts down the trace exporters"]
pub struct TracingGuard {
    provider: Option<SdkTracerProvider>,
}

impl TracingGuard {
    /// Flushes and shuts down the trace exporters now, reporting failure.
    pub fn shutdown(mut self) -> Result<(), TelemetryError> {
        match self.provider.take() {
            Some(provider) => provider
                .shutdown()
                .map_err(|source| TelemetryError::Pipeline {
                    action: "shutdown",
                    source,
                }),
            None => Ok(()),
        }
    }
}

impl Drop for TracingGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

/// Installs the process-wide `tracing` subscriber for the CLI.
///
/// Log lines go to stderr (stdout carries program output). Keep the guard until
/// the process exits so buffered spans are exported. Fails if a global
/// subscriber is already set.
pub fn init_tracing(config: TracingConfig) -> Result<TracingGuard, TelemetryError> {
    let (dispatch, guard) = config.build()?;
    tracing::dispatcher::set_global_default(dispatch)?;
    Ok(guard)
}
