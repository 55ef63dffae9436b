//! Pool gauges read from registered sources when metrics are rendered.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use paddock_telemetry::{PoolGaugeSource, PoolGauges, PoolSnapshot, Telemetry};

use crate::prom::{type_of, value};

#[test]
fn gauges_reflect_the_registered_source() {
    let t = Telemetry::prometheus().unwrap();
    let sub = Arc::new(PoolGauges::new());
    sub.set(PoolSnapshot {
        size: 4,
        idle: 1,
        busy: 3,
        waiting: 2,
    });
    t.register_pool("subprocess", sub.clone());

    let text = t.render_prometheus();
    let engine = [("engine", "subprocess")];
    for (name, want) in [
        ("paddock_pool_size", 4.0),
        ("paddock_pool_idle", 1.0),
        ("paddock_pool_busy", 3.0),
        ("paddock_pool_waiting", 2.0),
    ] {
        assert_eq!(type_of(&text, name), Some("gauge"), "{name}");
        assert_eq!(value(&text, name, &engine), Some(want), "{name}");
    }

    // The next collection sees the pool's updates.
    sub.set_busy(0);
    sub.set_idle(4);
    sub.set_waiting(0);
    let text = t.render_prometheus();
    assert_eq!(value(&text, "paddock_pool_busy", &engine), Some(0.0));
    assert_eq!(value(&text, "paddock_pool_idle", &engine), Some(4.0));
    assert_eq!(value(&text, "paddock_pool_waiting", &engine), Some(0.0));
}

/// A pool that keeps its own counters and reports them through the trait.
#[derive(Debug, Default)]
struct OwnCounters {
    busy: AtomicU64,
}

impl PoolGaugeSource for OwnCounters {
    fn snapshot(&self) -> PoolSnapshot {
        let busy = self.busy.load(Ordering::Relaxed);
        PoolSnapshot {
            size: busy + 1,
            idle: 1,
            busy,
            waiting: 0,
        }
    }
}

#[test]
fn several_pools_and_custom_sources_are_labelled_by_engine() {
    let t = Telemetry::prometheus().unwrap();
    let own = Arc::new(OwnCounters::default());
    own.busy.store(5, Ordering::Relaxed);
    t.register_pool("container", own);
    let iso = Arc::new(PoolGauges::new());
    iso.set_size(8);
    t.register_pool("isolate", iso);

    let text = t.render_prometheus();
    assert_eq!(
        value(&text, "paddock_pool_size", &[("engine", "container")]),
        Some(6.0)
    );
    assert_eq!(
        value(&text, "paddock_pool_busy", &[("engine", "container")]),
        Some(5.0)
    );
    assert_eq!(
        value(&text, "paddock_pool_size", &[("engine", "isolate")]),
        Some(8.0)
    );
}

#[test]
fn replacing_and_unregistering_a_pool() {
    let t = Telemetry::prometheus().unwrap();
    let first = Arc::new(PoolGauges::new());
    first.set_size(1);
    t.register_pool("subprocess", first);
    let second = Arc::new(PoolGauges::new());
    second.set_size(2);
    t.register_pool("subprocess", second);
    let engine = [("engine", "subprocess")];
    assert_eq!(
        value(&t.render_prometheus(), "paddock_pool_size", &engine),
        Some(2.0)
    );

    assert!(t.unregister_pool("subprocess"));
    assert!(!t.unregister_pool("subprocess"));
    assert_eq!(
        value(&t.render_prometheus(), "paddock_pool_size", &engine),
        None
    );
}
