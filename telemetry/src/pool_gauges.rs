//! Pool occupancy gauges: sources the pool updates, read when metrics are collected.
//!
//! A pool registers one [`PoolGaugeSource`] per engine with
//! [`Telemetry::register_pool`](crate::Telemetry::register_pool). The four
//! observable gauges (`paddock_pool_size`, `_idle`, `_busy`, `_waiting`) call
//! [`PoolGaugeSource::snapshot`] on every registered source when a reader collects
//! (a Prometheus scrape, a periodic export), so the pool's hot path never touches
//! OpenTelemetry: with [`PoolGauges`] an update is one relaxed atomic store.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use opentelemetry::KeyValue;

use crate::labels;

/// The occupancy of one engine pool at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PoolSnapshot {
    /// Engine instances the pool holds (idle + busy + starting).
    pub size: u64,
    /// Instances ready to take work.
    pub idle: u64,
    /// Instances running work or leased to a sandbox session.
    pub busy: u64,
    /// Requests queued for an instance.
    pub waiting: u64,
}

/// Something that can report a pool's occupancy when metrics are collected.
///
/// Called from the metrics reader's thread (the Prometheus render, a periodic
/// exporter), never from the record path, so it may take a moment; it must not
/// block for long or call back into [`Telemetry`](crate::Telemetry).
pub trait PoolGaugeSource: Send + Sync + fmt::Debug {
    /// The current occupancy.
    fn snapshot(&self) -> PoolSnapshot;
}

/// Lock-free occupancy counters a pool updates as it changes.
///
/// Each setter is a single relaxed atomic store; the gauges read the four values
/// one by one, so a collection may see, say, `idle` from just before and `busy`
/// from just after a handover. Gauges tolerate that.
///
/// ```
/// use std::sync::Arc;
/// use paddock_telemetry::{PoolGauges, PoolGaugeSource, PoolSnapshot};
///
/// let gauges = Arc::new(PoolGauges::new());
/// gauges.set_size(4);
/// gauges.set_idle(3);
/// gauges.set_busy(1);
/// assert_eq!(gauges.snapshot(), PoolSnapshot { size: 4, idle: 3, busy: 1, waiting: 0 });
/// ```
#[derive(Debug, Default)]
pub struct PoolGauges {
    size: AtomicU64,
    idle: AtomicU64,
    busy: AtomicU64,
    waiting: AtomicU64,
}

impl PoolGauges {
    /// All four values at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the number of instances the pool holds.
    pub fn set_size(&self, n: u64) {
        self.size.store(n, Ordering::Relaxed);
    }

    /// Sets the number of idle instances.
    pub fn set_idle(&self, n: u64) {
        self.idle.store(n, Ordering::Relaxed);
    }

    /// Sets the number of busy instances.
    pub fn set_busy(&self, n: u64) {
        self.busy.store(n, Ordering::Relaxed);
    }

    /// Sets the number of queued requests.
    pub fn set_waiting(&self, n: u64) {
        self.waiting.store(n, Ordering::Relaxed);
    }

    /// Sets all four values.
    pub fn set(&self, snapshot: PoolSnapshot) {
        self.set_size(snapshot.size);
        self.set_idle(snapshot.idle);
        self.set_busy(snapshot.busy);
        self.set_waiting(snapshot.waiting);
    }
}

impl PoolGaugeSource for PoolGauges {
    fn snapshot(&self) -> PoolSnapshot {
        PoolSnapshot {
            size: self.size.load(Ordering::Relaxed),
            idle: self.idle.load(Ordering::Relaxed),
            busy: self.busy.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
        }
    }
}

/// One registered pool: its `engine` label and its source.
#[derive(Debug)]
struct Entry {
    engine: String,
    attrs: [KeyValue; 1],
    source: Arc<dyn PoolGaugeSource>,
}

/// The registered sources, shared by the gauge callbacks.
///
/// The lock is taken on registration and on collection only.
#[derive(Debug, Clone, Default)]
pub(crate) struct PoolRegistry {
    entries: Arc<RwLock<Vec<Entry>>>,
}

impl PoolRegistry {
    /// Registers `source` under `engine`, replacing an earlier source of that name.
    pub(crate) fn register(&self, engine: &str, source: Arc<dyn PoolGaugeSource>) {
        let mut entries = self.entries.write().unwrap_or_else(PoisonError::into_inner);
        let attrs = [KeyValue::new(labels::ENGINE, engine.to_owned())];
        match entries.iter_mut().find(|e| e.engine == engine) {
            Some(entry) => entry.source = source,
            None => entries.push(Entry {
                engine: engine.to_owned(),
                attrs,
                source,
            }),
        }
    }

    /// Removes the source registered under `engine`; `true` if there was one.
    pub(crate) fn unregister(&self, engine: &str) -> bool {
        let mut entries = self.entries.write().unwrap_or_else(PoisonError::into_inner);
        let before = entries.len();
        entries.retain(|e| e.engine != engine);
        entries.len() != before
    }

    /// Calls `observe(value, attrs)` once per registered pool with the field `pick`
    /// selects from its snapshot.
    pub(crate) fn observe(
        &self,
        pick: fn(&PoolSnapshot) -> u64,
        observe: impl Fn(u64, &[KeyValue]),
    ) {
        let entries = self.entries.read().unwrap_or_else(PoisonError::into_inner);
        for entry in entries.iter() {
            observe(pick(&entry.source.snapshot()), &entry.attrs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn observed(registry: &PoolRegistry, pick: fn(&PoolSnapshot) -> u64) -> Vec<(String, u64)> {
        let seen = Mutex::new(Vec::new());
        registry.observe(pick, |v, attrs| {
            seen.lock()
                .unwrap()
                .push((attrs[0].value.as_str().into_owned(), v));
        });
        seen.into_inner().unwrap()
    }

    #[test]
    fn registering_twice_replaces_and_unregister_removes() {
        let registry = PoolRegistry::default();
        let first = Arc::new(PoolGauges::new());
        first.set_size(1);
        let second = Arc::new(PoolGauges::new());
        second.set_size(2);
        registry.register("subprocess", first);
        registry.register("subprocess", second);
        assert_eq!(observed(&registry, |s| s.size), [("subprocess".into(), 2)]);

        assert!(registry.unregister("subprocess"));
        assert!(!registry.unregister("subprocess"));
        assert!(observed(&registry, |s| s.size).is_empty());
    }

    #[test]
    fn set_writes_every_field() {
        let g = PoolGauges::new();
        let s = PoolSnapshot {
            size: 5,
            idle: 2,
            busy: 3,
            waiting: 7,
        };
        g.set(s);
        assert_eq!(g.snapshot(), s);
    }
}
