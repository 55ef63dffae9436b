//! What one `record_execution` + `record_duration` pair costs (printed, not asserted).

use std::time::Instant;

use paddock_telemetry::Telemetry;

use crate::prom::value;

#[test]
fn cost_of_a_record_pair() {
    const N: u32 = 200_000;
    let t = Telemetry::prometheus().unwrap();
    t.record_execution("subprocess", "completed");
    t.record_duration("subprocess", "completed", 1.0);

    let start = Instant::now();
    for i in 0..N {
        t.record_execution("subprocess", "completed");
        t.record_duration("subprocess", "completed", f64::from(i % 1000));
    }
    let per_pair = start.elapsed() / N;
    println!(
        "record_execution + record_duration: {per_pair:?} per pair ({} build)",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );

    let text = t.render_prometheus();
    let labels = [("engine", "subprocess"), ("outcome", "completed")];
    assert_eq!(
        value(&text, "paddock_executions_total", &labels),
        Some(f64::from(N + 1))
    );
    assert_eq!(
        value(&text, "paddock_execution_duration_ms_count", &labels),
        Some(f64::from(N + 1))
    );
}
