//! Orders: the executions this node accepted and waits for, and those it runs for
//! the fleet, with its engines' slots. The book only; `accept` waits for orders,
//! `worker` runs them and `control` cancels them.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;

use async_nats::jetstream::kv;
use dashmap::DashMap;
use paddock_core::{EngineName, ExecutionId};
use tokio::sync::{mpsc, Semaphore};

use crate::context::Context;
use crate::wire::Answer;

/// What an accepting node hears about one execution it waits for.
#[derive(Debug)]
pub(crate) enum Inbound {
    Chunk(paddock_core::OutputChunk),
    Done(Box<Answer>),
}

/// An execution this node accepted and waits for.
#[derive(Debug)]
pub(crate) struct Waiter {
    pub(crate) tenant: Option<String>,
    /// The engine it was queued for.
    pub(crate) engine: EngineName,
    /// Its program's audit hash (for the entry of a cancel before it ran).
    pub(crate) code_hash: String,
    pub(crate) tx: mpsc::Sender<Inbound>,
}

/// An execution this node runs for the fleet.
#[derive(Debug)]
pub(crate) struct Running {
    pub(crate) tenant: Option<String>,
    /// A cancel arrived (maybe before the local pipeline knew the execution).
    pub(crate) cancel: AtomicBool,
    /// The cancel asked to forget the result too.
    pub(crate) forget: AtomicBool,
    pub(crate) notify: tokio::sync::Notify,
}

/// The slots of one engine: how many of its executions this node takes at once.
#[derive(Debug)]
pub(crate) struct EngineSlots {
    pub(crate) engine: EngineName,
    pub(crate) level: paddock_core::IsolationLevel,
    pub(crate) slots: usize,
    pub(crate) free: Arc<Semaphore>,
    /// Orders taken and not finished.
    pub(crate) busy: Arc<AtomicUsize>,
}

/// Orders: executions this node accepted and waits for, and those it runs.
#[derive(Debug)]
pub(crate) struct Orders {
    /// The node this book is of.
    pub(crate) cx: Arc<Context>,
    /// Idempotency keys (`P_idem`).
    pub(crate) idem: kv::Store,
    pub(crate) waiters: DashMap<ExecutionId, Arc<Waiter>>,
    pub(crate) running: DashMap<ExecutionId, Arc<Running>>,
    /// This node's engines and their free slots, by work queue.
    pub(crate) engines: Vec<EngineSlots>,
    /// Work taken from the queues and not yet finished.
    pub(crate) taken: AtomicUsize,
}
