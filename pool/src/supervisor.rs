//! The supervisor actor: owns one engine pool per engine (and network policy), and
//! routes every execution through policy → limiter → pool → engine → streamer →
//! audit.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use dashmap::DashMap;
use paddock_core::AccessRules;
use paddock_core::{CancelToken, Engine, EngineName, Error, ErrorCode, ExecutionId, Limits};

use crate::PoolConfig;

use crate::audit::{Audit, OperatorAccess, RecordAccess};
use crate::caller::Caller;
use crate::engine_pool::EnginePool;
use crate::limiter::Limiter;
use crate::policy::Policy;
use crate::streamer::Streamer;
use paddock_telemetry::Telemetry;

/// An accepted execution not yet finished.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    /// The tenant it is accounted to.
    pub(crate) tenant: Option<String>,
    /// Cancels it.
    pub(crate) token: CancelToken,
}

/// State shared between the supervisor and `Paddock` handles on other threads.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// Accepted executions not yet finished, by id.
    pub(crate) running: DashMap<ExecutionId, Running>,
    pub(crate) accepted_total: AtomicU64,
    pub(crate) refused_total: AtomicU64,
    pub(crate) stopping: AtomicBool,
}

mod choice;
mod execute;
mod files;
mod interactive;
mod lifecycle;
mod observe;
mod pools;
mod session;
mod shutdown;

use crate::pipeline::Pipeline;
use crate::shares::Shares;
pub(crate) use execute::cancel_running;
use lifecycle::Ending;
use pools::PoolKey;
pub(crate) use session::{Busy, Session};

/// The supervisor actor. Build it with [`crate::PaddockBuilder`] (which also starts
/// it on its own thread; `Paddock::supervisor` gives its address).
#[derive(Debug)]
pub struct Supervisor {
    engines: HashMap<EngineName, Arc<dyn Engine>>,
    /// Each engine's place in registration order (the built-ins first), which breaks
    /// ties when an engine is chosen by level.
    registered: HashMap<EngineName, usize>,
    /// Engines a request gets only by naming them (`[engines.NAME]`).
    by_name_only: std::collections::HashSet<EngineName>,
    default_engine: EngineName,
    /// Engines the config enables that cannot run here, and why.
    unavailable: Vec<(EngineName, String)>,
    /// By engine, network policy, disk quota and home: what an instance is made with.
    pools: HashMap<PoolKey, Arc<EnginePool>>,
    /// Pools an embedder asked to keep more (or fewer) instances ready in.
    warm_sizes: HashMap<PoolKey, usize>,
    pool_config: PoolConfig,
    pipeline: Rc<Pipeline>,
    sessions: HashMap<String, Rc<Session>>,
    /// Sessions whose destroy is under way, until their instance is recycled or
    /// gone: a second destroy joins it instead of returning early.
    destroying: HashMap<String, Ending>,
    /// Destroyed session ids and their tenants, so a repeated destroy is Ok for the
    /// owner and another tenant still gets `NOT_FOUND`.
    destroyed_sessions: VecDeque<(String, Option<String>)>,
}

/// Parts of a supervisor, assembled by the builder.
#[derive(Debug)]
pub(crate) struct SupervisorParts {
    pub(crate) engines: Vec<Arc<dyn Engine>>,
    pub(crate) default_engine: EngineName,
    pub(crate) unavailable: Vec<(EngineName, String)>,
    pub(crate) by_name_only: std::collections::HashSet<EngineName>,
    pub(crate) pool_config: PoolConfig,
    pub(crate) defaults: Limits,
    pub(crate) policy: Arc<Policy>,
    pub(crate) limiter: Addr<Limiter>,
    pub(crate) audit: Addr<Audit>,
    pub(crate) streamer: Addr<Streamer>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) telemetry: Telemetry,
    pub(crate) ceilings: Limits,
    pub(crate) access: AccessRules,
    pub(crate) shares: Shares,
}

impl Supervisor {
    pub(crate) fn from_parts(parts: SupervisorParts) -> Supervisor {
        Supervisor {
            registered: parts
                .engines
                .iter()
                .enumerate()
                .map(|(i, e)| (e.name(), i))
                .collect(),
            engines: parts.engines.into_iter().map(|e| (e.name(), e)).collect(),
            default_engine: parts.default_engine,
            unavailable: parts.unavailable,
            by_name_only: parts.by_name_only,
            pools: HashMap::new(),
            warm_sizes: HashMap::new(),
            pool_config: parts.pool_config,
            pipeline: Rc::new(Pipeline {
                shared: parts.shared,
                telemetry: parts.telemetry,
                policy: parts.policy,
                limiter: parts.limiter,
                audit: parts.audit,
                streamer: parts.streamer,
                defaults: parts.defaults,
                ceilings: parts.ceilings,
                access: parts.access,
                shares: Rc::new(RefCell::new(parts.shares)),
                parking: RefCell::default(),
            }),
            sessions: HashMap::new(),
            destroying: HashMap::new(),
            destroyed_sessions: VecDeque::new(),
        }
    }

    fn refuse(&self, e: Error) -> Error {
        self.pipeline
            .shared
            .refused_total
            .fetch_add(1, Ordering::Relaxed);
        e
    }

    /// The session `id` if `caller` may use it: another tenant's session (open or
    /// destroyed) is `NOT_FOUND`, like one that never existed.
    fn session_for(&self, caller: &Caller, id: &str) -> Result<Rc<Session>, Error> {
        if let Some(s) = self.sessions.get(id) {
            if !caller.sees(s.tenant.as_deref()) {
                return Err(no_sandbox(id));
            }
            s.last_used.set(Instant::now());
            return Ok(s.clone());
        }
        match self.destroyed_sessions.iter().find(|(d, _)| d == id) {
            Some((_, owner)) if caller.sees(owner.as_deref()) => {
                Err(Error::disposed(&format!("sandbox {id}")))
            }
            _ => Err(no_sandbox(id)),
        }
    }

    /// Records an operator's use of its key (nothing for tenants or the embedder).
    fn note_operator(&self, caller: &Caller, action: &str, target: Option<String>) {
        note_operator(&self.pipeline.audit, caller, action, target);
    }
}

/// Records an operator's use of its key (nothing for tenants or the embedder), from
/// the supervisor's arbiter.
fn note_operator(audit: &Addr<Audit>, caller: &Caller, action: &str, target: Option<String>) {
    if let Some(record) = access_record(caller, action, target) {
        if let Err(SendError::Full(msg)) = audit.try_send(record) {
            let audit = audit.clone();
            actix::spawn(async move {
                let _ = audit.send(msg).await;
            });
        }
    }
}

/// The record of an operator's use of its key; `None` for tenants and the embedder.
pub(crate) fn access_record(
    caller: &Caller,
    action: &str,
    target: Option<String>,
) -> Option<RecordAccess> {
    match caller {
        Caller::Operator(name) => Some(RecordAccess(OperatorAccess::now(name, action, target))),
        Caller::Tenant(_) | Caller::Embedder => None,
    }
}

fn no_sandbox(id: &str) -> Error {
    Error::new(
        ErrorCode::NotFound,
        format!("no sandbox with id `{id}`; open one first"),
    )
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(65_536);
        self.prewarm_all();
        ctx.run_interval(Duration::from_millis(500), |act, ctx| {
            let expired = act.pipeline.parking.borrow_mut().expire(Instant::now());
            for parked in expired {
                parked.retire();
            }
            for pool in act.pools.values() {
                pool.maintain();
            }
            act.expire_sessions(ctx);
        });
    }
}
