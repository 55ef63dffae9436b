//! `TracingConfig` and `init_tracing`.

use paddock_telemetry::{init_tracing, TelemetryError, TracingConfig};

#[test]
fn an_invalid_default_filter_is_an_error() {
    let err = TracingConfig::new("paddock=loudest")
        .with_env_filter(false)
        .build()
        .unwrap_err();
    match &err {
        TelemetryError::Filter { filter, .. } => assert_eq!(filter, "paddock=loudest"),
        other => panic!("unexpected error {other:?}"),
    }
    assert!(err.to_string().contains("paddock=loudest"));
}

#[test]
fn the_filter_decides_what_is_enabled() {
    let (dispatch, _guard) = TracingConfig::new("warn,paddock_telemetry=debug")
        .with_env_filter(false)
        .with_test_writer()
        .build()
        .unwrap();
    tracing::dispatcher::with_default(&dispatch, || {
        assert!(tracing::enabled!(target: "paddock_telemetry", tracing::Level::DEBUG));
        assert!(!tracing::enabled!(target: "other", tracing::Level::INFO));
        assert!(tracing::enabled!(target: "other", tracing::Level::WARN));
    });
}

#[test]
fn init_tracing_installs_once_per_process() {
    let guard = init_tracing(TracingConfig::new("off").with_env_filter(false)).unwrap();
    let again = init_tracing(TracingConfig::new("off").with_env_filter(false));
    assert!(matches!(again, Err(TelemetryError::SubscriberInit(_))));
    guard.shutdown().unwrap();
}
