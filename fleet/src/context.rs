//! What every concept of a node needs: its configuration and identity, the NATS
//! connection, the execution records, this node's own scheduler, and the stop
//! signal its tasks watch.
//!
//! A leaf of the crate's concepts: it uses none of them. Each concept's book
//! (membership, orders, sessions, shares) holds an `Arc` of it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use paddock_pool::Paddock;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::FleetConfig;
use crate::names::Names;
use crate::store::Records;

/// A node's identity, connection and shared means.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) config: FleetConfig,
    pub(crate) node: String,
    pub(crate) incarnation: String,
    pub(crate) names: Names,
    pub(crate) client: async_nats::Client,
    pub(crate) js: jetstream::Context,
    pub(crate) records: Records,
    /// This node's own scheduler (not federated).
    pub(crate) paddock: Paddock,
    /// The largest message the servers take.
    pub(crate) max_payload: usize,
    pub(crate) stop: watch::Sender<bool>,
    pub(crate) tasks: parking_lot::Mutex<Vec<JoinHandle<()>>>,
    /// The streams' duplicate window, in ms.
    pub(crate) dedupe_ms: u64,
    /// The last write token drawn ([`Context::next_write`]).
    pub(crate) writes: AtomicU64,
}

impl Context {
    /// A fresh write token for a record this incarnation writes: one per take of
    /// an order, and one per fence, never 0 (what a record without one reads as).
    pub(crate) fn next_write(&self) -> u64 {
        self.writes.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn ack_wait(&self) -> Duration {
        Duration::from_millis(self.config.ack_wait_ms)
    }

    pub(crate) fn heartbeat(&self) -> Duration {
        Duration::from_millis(self.config.heartbeat_ms)
    }

    pub(crate) fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// The heartbeat of a task that runs until the node stops: see [`Beats`].
    pub(crate) fn beats(&self) -> Beats {
        let mut tick = tokio::time::interval(self.heartbeat());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Beats {
            stop: self.stop.subscribe(),
            tick,
        }
    }

    pub(crate) fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.lock().push(tokio::spawn(task));
    }
}

/// Every heartbeat until the node stops (a late beat is not caught up with).
#[derive(Debug)]
pub(crate) struct Beats {
    stop: watch::Receiver<bool>,
    tick: tokio::time::Interval,
}

impl Beats {
    /// Waits for the next beat: `false` once the node stops.
    pub(crate) async fn next(&mut self) -> bool {
        tokio::select! {
            _ = self.tick.tick() => true,
            _ = self.stop.changed() => false,
        }
    }
}
