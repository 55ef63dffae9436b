//! Counters and the duration histogram, read back from the Prometheus text.

use std::time::Duration;

use paddock_telemetry::{labels, Telemetry};

use crate::prom::{matching, type_of, value};

#[test]
fn executions_count_per_engine_and_outcome() {
    let t = Telemetry::prometheus().unwrap();
    for _ in 0..3 {
        t.record_execution("subprocess", "completed");
    }
    t.record_execution("isolate", labels::outcome::TIMED_OUT);

    let text = t.render_prometheus();
    assert_eq!(type_of(&text, "paddock_executions_total"), Some("counter"));
    let sub = [("engine", "subprocess"), ("outcome", "completed")];
    assert_eq!(value(&text, "paddock_executions_total", &sub), Some(3.0));
    let iso = [("engine", "isolate"), ("outcome", "timed_out")];
    assert_eq!(value(&text, "paddock_executions_total", &iso), Some(1.0));
    assert_eq!(
        value(
            &text,
            "paddock_executions_total",
            &[("engine", "isolate"), ("outcome", "completed")]
        ),
        None
    );
    // The meter is the instrumentation scope of every series.
    assert_eq!(
        value(
            &text,
            "paddock_executions_total",
            &[("otel_scope_name", "paddock"), ("engine", "subprocess")]
        ),
        Some(3.0)
    );
}

#[test]
fn duration_histogram_has_buckets_sum_and_count() {
    let t = Telemetry::prometheus().unwrap();
    for ms in [0.3, 7.0, 120.0] {
        t.record_duration("subprocess", "completed", ms);
    }
    t.record_duration("subprocess", "failed", 1.0);
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        t.record_duration("subprocess", "completed", bad);
    }

    let text = t.render_prometheus();
    let name = "paddock_execution_duration_ms";
    assert_eq!(type_of(&text, name), Some("histogram"));
    let ok = [("engine", "subprocess"), ("outcome", "completed")];
    assert_eq!(value(&text, &format!("{name}_count"), &ok), Some(3.0));
    let sum = value(&text, &format!("{name}_sum"), &ok).unwrap();
    assert!((sum - 127.3).abs() < 1e-9, "sum {sum}");

    let bucket = |le: &str| {
        let mut want = ok.to_vec();
        want.push(("le", le));
        value(&text, &format!("{name}_bucket"), &want)
    };
    assert_eq!(bucket("0.25"), Some(0.0));
    assert_eq!(bucket("0.5"), Some(1.0));
    assert_eq!(bucket("10"), Some(2.0));
    assert_eq!(bucket("100"), Some(2.0));
    assert_eq!(bucket("250"), Some(3.0));
    assert_eq!(bucket("+Inf"), Some(3.0));
    // Buckets are cumulative and end at +Inf.
    let buckets = matching(&text, &format!("{name}_bucket"), &ok);
    assert_eq!(
        buckets.len(),
        paddock_telemetry::DEFAULT_DURATION_BUCKETS_MS.len() + 1
    );
    assert!(buckets.windows(2).all(|w| w[0].value <= w[1].value));

    let failed = [("engine", "subprocess"), ("outcome", "failed")];
    assert_eq!(value(&text, &format!("{name}_count"), &failed), Some(1.0));
}

#[test]
fn custom_duration_buckets_are_used() {
    let t = Telemetry::builder()
        .with_prometheus()
        .duration_buckets(vec![1.0, 10.0])
        .build()
        .unwrap();
    t.record_duration("container", "completed", 5.0);
    let text = t.render_prometheus();
    let buckets = matching(&text, "paddock_execution_duration_ms_bucket", &[]);
    let les: Vec<_> = buckets
        .iter()
        .map(|s| s.labels.iter().find(|(k, _)| k == "le").unwrap().1.clone())
        .collect();
    assert_eq!(les, ["1", "10", "+Inf"]);
    assert_eq!(
        buckets.iter().map(|s| s.value).collect::<Vec<_>>(),
        [0.0, 1.0, 1.0]
    );
}

#[test]
fn rule_blocks_acquisitions_and_kills_are_counted() {
    let t = Telemetry::prometheus().unwrap();
    let rule = String::from("python.no-subprocess");
    t.record_rule_block(&rule);
    t.record_rule_block(&rule);
    t.record_rule_block("code-too-long");
    t.record_pool_acquisition("subprocess", labels::acquire::OK);
    t.record_pool_acquisition("subprocess", labels::acquire::OK);
    t.record_pool_acquisition("subprocess", labels::acquire::EXHAUSTED);
    t.record_pool_acquisition("container", labels::acquire::TIMEOUT);
    t.record_kill(labels::kill::TIMEOUT);
    t.record_kill(labels::kill::CANCEL);
    t.record_kill(labels::kill::CANCEL);

    let text = t.render_prometheus();
    for name in [
        "paddock_rule_blocks_total",
        "paddock_pool_acquisitions_total",
        "paddock_kills_total",
    ] {
        assert_eq!(type_of(&text, name), Some("counter"), "{name}");
    }
    let v = |name, want: &[(&str, &str)]| value(&text, name, want);
    assert_eq!(
        v(
            "paddock_rule_blocks_total",
            &[("rule", "python.no-subprocess")]
        ),
        Some(2.0)
    );
    assert_eq!(
        v("paddock_rule_blocks_total", &[("rule", "code-too-long")]),
        Some(1.0)
    );
    let acq = "paddock_pool_acquisitions_total";
    assert_eq!(
        v(acq, &[("engine", "subprocess"), ("result", "ok")]),
        Some(2.0)
    );
    assert_eq!(
        v(acq, &[("engine", "subprocess"), ("result", "exhausted")]),
        Some(1.0)
    );
    assert_eq!(
        v(acq, &[("engine", "container"), ("result", "timeout")]),
        Some(1.0)
    );
    assert_eq!(
        v("paddock_kills_total", &[("reason", "timeout")]),
        Some(1.0)
    );
    assert_eq!(v("paddock_kills_total", &[("reason", "cancel")]), Some(2.0));
}

#[test]
fn clones_on_many_threads_record_into_the_same_instruments() {
    let t = Telemetry::prometheus().unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let t = t.clone();
            std::thread::spawn(move || {
                for _ in 0..1000 {
                    t.record_execution("isolate", "completed");
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    let text = t.render_prometheus();
    assert_eq!(
        value(&text, "paddock_executions_total", &[("engine", "isolate")]),
        Some(4000.0)
    );
}

#[test]
fn each_telemetry_has_its_own_registry() {
    let a = Telemetry::prometheus().unwrap();
    let b = Telemetry::prometheus().unwrap();
    a.record_kill("memory");
    assert_eq!(
        value(
            &a.render_prometheus(),
            "paddock_kills_total",
            &[("reason", "memory")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &b.render_prometheus(),
            "paddock_kills_total",
            &[("reason", "memory")]
        ),
        None
    );
}

#[test]
fn service_name_is_the_target_info() {
    let t = Telemetry::builder()
        .with_prometheus()
        .service_name("paddock-test")
        .build()
        .unwrap();
    t.record_kill("cancel");
    let text = t.render_prometheus();
    assert_eq!(
        value(&text, "target_info", &[("service_name", "paddock-test")]),
        Some(1.0)
    );
}

#[test]
fn disabled_telemetry_records_and_renders_nothing() {
    let t = Telemetry::disabled();
    t.record_execution("subprocess", "completed");
    t.record_duration("subprocess", "completed", 1.0);
    assert!(!t.has_prometheus());
    assert_eq!(t.render_prometheus(), "");
    assert!(Telemetry::prometheus().unwrap().has_prometheus());
}

#[test]
fn stdout_exporter_flushes_and_shuts_down_once() {
    let t = Telemetry::builder()
        .with_stdout(Duration::from_secs(3600))
        .build()
        .unwrap();
    assert!(format!("{t:?}").contains("stdout"));
    t.record_kill("shutdown");
    t.force_flush().unwrap();
    t.shutdown().unwrap();
    // The provider is shut down for every clone; a second shutdown says so.
    assert!(t.clone().shutdown().is_err());
}

#[test]
fn after_shutdown_prometheus_stops_collecting() {
    let t = Telemetry::prometheus().unwrap();
    t.record_kill("destroy");
    assert!(t.render_prometheus().contains("paddock_kills_total"));
    t.shutdown().unwrap();
    t.record_kill("destroy");
    assert!(!t.render_prometheus().contains("paddock_kills_total"));
}
