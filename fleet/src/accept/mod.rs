//! Accepting work: the [`Federation`] a fleet node's facade hands its one-shot
//! executions to. The accepting node publishes the order on its engine's work
//! queue (message id: the execution id) and waits on its inbox for the output and
//! the result; the record in the `P_exec` bucket is the truth it falls back on.
//!
//! Accepting work uses every book of the node ([`Parts`]); only `node` uses this
//! module.
//!
//! [`Federation`]: paddock_pool::federation::Federation

mod admission;
mod federation;
mod fencing;
mod idempotency;
mod publish;
mod wait;

pub(crate) use wait::inbox;

use std::sync::Arc;

use paddock_core::ExecutionId;
use paddock_pool::Caller;
use tokio::sync::mpsc;

use crate::context::Context;
use crate::orders::{Inbound, Orders};
use crate::registry::Membership;
use crate::sessions::SessionBook;
use crate::shares::{RunHold, ShareBook};

/// Every part of a node: accepting work uses them all (the node's card, its
/// orders, its sandboxes and the tenants' shares).
#[derive(Debug)]
pub(crate) struct Parts {
    /// The node's identity, connection and shared means.
    pub(crate) cx: Arc<Context>,
    pub(crate) members: Arc<Membership>,
    pub(crate) orders: Arc<Orders>,
    pub(crate) sessions: Arc<SessionBook>,
    pub(crate) shares: Arc<ShareBook>,
}

/// The facade's federation: this node's view of the fleet.
#[derive(Debug)]
pub(crate) struct Federated {
    pub(crate) inner: Arc<Parts>,
}

/// This node's waiter for an execution, removed when the wait ends however it ends
/// (a caller that drops its future included), so that the map cannot fill up with
/// waiters nobody reads.
struct WaiterGuard {
    inner: Arc<Parts>,
    id: ExecutionId,
}

impl Drop for WaiterGuard {
    fn drop(&mut self) {
        self.inner.orders.waiters.remove(&self.id);
    }
}

/// What a waiting node needs to fence work off itself when no node will answer
/// for it: the tenant, engine and program of its audit entry.
#[derive(Debug, Clone)]
struct Fence {
    tenant: Option<String>,
    engine: paddock_core::EngineName,
    code_hash: String,
}

/// Work accepted here (or attached to by key), not yet answered.
enum Pending {
    /// Ours: waits on the inbox.
    Own {
        _guard: WaiterGuard,
        id: ExecutionId,
        rx: mpsc::Receiver<Inbound>,
        start_by_ms: u64,
        /// The idempotency key it holds, if any.
        key: Option<String>,
        fence: Fence,
        /// Its place in the tenant's fleet-wide shares, if they are counted.
        hold: Option<RunHold>,
    },
    /// The first execution of an idempotency key.
    Attached {
        id: ExecutionId,
        start_by_ms: u64,
        fence: Fence,
    },
}

fn tenant_of(caller: &Caller) -> Option<Option<String>> {
    caller.confined_to().map(|t| t.map(str::to_owned))
}
