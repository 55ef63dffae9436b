//! The supervisor actor: owns one engine pool per engine (and network policy), and
//! routes every execution through policy → limiter → pool → engine → streamer →
//! audit.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use async_trait::async_trait;
use dashmap::DashMap;
use paddock_core::config::LimiterConfig;
use paddock_core::AccessRules;
use paddock_core::{
    code_hash, unix_ms, CancelToken, Engine, EngineKind, Error, ErrorCode, ExecRequest, ExecResult,
    ExecutionId, IsolationLevel, Limits, NetworkPolicy, Outcome, OutputChunk, OutputSink,
    PoolConfig, SandboxStatus,
};

use crate::audit::{Audit, AuditEntry, OperatorAccess, Record, RecordAccess};
use crate::caller::Caller;
use crate::engine_actor::RunExec;
use crate::engine_pool::{EnginePool, Lease, Release};
use crate::limiter::{Admit, Limiter};
use crate::messages::*;
use crate::parking::{Parking, Refused};
use crate::policy::Policy;
use crate::streamer::{BufferSink, CloseStream, OpenStream, Streamer};
use paddock_telemetry::{labels, Telemetry};
use tracing::Instrument;

/// How many destroyed session ids are remembered, so a repeated destroy is Ok.
const REMEMBERED_DESTROYED: usize = 10_000;

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

/// Everything an execution needs after it left the supervisor's mailbox.
#[derive(Debug)]
struct Pipeline {
    shared: Arc<Shared>,
    telemetry: Telemetry,
    policy: Arc<Policy>,
    limiter: Addr<Limiter>,
    audit: Addr<Audit>,
    streamer: Addr<Streamer>,
    defaults: Limits,
    /// The operator's ceilings on what a request may ask for.
    ceilings: Limits,
    /// Which levels and networks each tenant may use.
    access: AccessRules,
    /// Per-tenant counts of open sandboxes and held pool slots.
    shares: Rc<RefCell<Shares>>,
    /// Instances of pooled executions that suspended, waiting for their resume.
    parking: RefCell<Parking>,
}

/// Per-tenant fair shares: open sandboxes and pool slots held.
#[derive(Debug, Default)]
pub(crate) struct Shares {
    max_sandboxes: Option<u32>,
    max_slots: Option<u32>,
    sandboxes: HashMap<Option<String>, u32>,
    slots: HashMap<Option<String>, u32>,
}

/// How long a tenant at its sandbox cap is told to wait before trying again.
const SANDBOX_CAP_RETRY_MS: u64 = 1_000;
/// How long a tenant at its slot cap is told to wait before trying again.
const SLOT_CAP_RETRY_MS: u64 = 250;

impl Shares {
    pub(crate) fn new(config: &LimiterConfig) -> Shares {
        Shares {
            max_sandboxes: config.max_sandboxes_per_tenant,
            max_slots: config.max_slots_per_tenant,
            ..Shares::default()
        }
    }
}

/// What a tenant holds of its shares; given back when dropped.
#[derive(Debug)]
pub(crate) struct Share {
    shares: Rc<RefCell<Shares>>,
    tenant: Option<String>,
    sandbox: bool,
}

impl Share {
    /// Takes a pool slot (and, for a sandbox, a sandbox place) for `tenant`, or
    /// refuses: `RATE_LIMITED` at the sandbox cap, `POOL_EXHAUSTED` at the slot cap.
    fn take(
        shares: &Rc<RefCell<Shares>>,
        tenant: &Option<String>,
        sandbox: bool,
    ) -> Result<Share, Error> {
        let mut s = shares.borrow_mut();
        let who = tenant.as_deref().unwrap_or("(none)");
        if sandbox {
            let open = s.sandboxes.get(tenant).copied().unwrap_or(0);
            if let Some(max) = s.max_sandboxes.filter(|m| open >= *m) {
                return Err(Error::new(
                    ErrorCode::RateLimited,
                    format!(
                        "tenant `{who}` has {open} sandboxes open, its cap (limiter.max_sandboxes_per_tenant = {max}); destroy one first"
                    ),
                )
                .with_retry_after_ms(SANDBOX_CAP_RETRY_MS));
            }
        }
        let held = s.slots.get(tenant).copied().unwrap_or(0);
        if let Some(max) = s.max_slots.filter(|m| held >= *m) {
            return Err(Error::new(
                ErrorCode::PoolExhausted,
                format!(
                    "tenant `{who}` holds {held} pool slots (open sandboxes and pooled executions), its cap (limiter.max_slots_per_tenant = {max}); retry when one ends"
                ),
            )
            .with_retry_after_ms(SLOT_CAP_RETRY_MS));
        }
        *s.slots.entry(tenant.clone()).or_default() += 1;
        if sandbox {
            *s.sandboxes.entry(tenant.clone()).or_default() += 1;
        }
        drop(s);
        Ok(Share {
            shares: shares.clone(),
            tenant: tenant.clone(),
            sandbox,
        })
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut s = self.shares.borrow_mut();
        let give_back = |map: &mut HashMap<Option<String>, u32>, tenant: &Option<String>| {
            if let Some(n) = map.get_mut(tenant) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    map.remove(tenant);
                }
            }
        };
        give_back(&mut s.slots, &self.tenant);
        if self.sandbox {
            give_back(&mut s.sandboxes, &self.tenant);
        }
    }
}

mod interactive;

#[derive(Debug)]
struct Session {
    engine: EngineKind,
    lease: Lease,
    tenant: Option<String>,
    limits: Limits,
    /// Its background processes and terminals.
    processes: RefCell<interactive::Processes>,
    /// When it was opened.
    opened: Instant,
    /// The last call on it.
    last_used: Cell<Instant>,
    /// Executions running in it, and uploads into it.
    busy: Cell<u32>,
    /// Downloads of its files in progress (readers live on other threads).
    transfers: Arc<std::sync::atomic::AtomicUsize>,
    /// When the last download ended, in ms after `opened`.
    transfer_ended_ms: Arc<AtomicU64>,
    /// Its place among its tenant's shares.
    _share: Share,
}

impl Session {
    /// Runs one engine method on the session's instance through its engine actor,
    /// the one door to an instance: a panic becomes `ENGINE_FAILED` and taints it.
    fn call<T, F>(
        &self,
        what: &'static str,
        f: F,
    ) -> impl std::future::Future<Output = Result<T, Error>> + 'static
    where
        T: Send + 'static,
        F: FnOnce(Arc<dyn paddock_core::Sandbox>) -> crate::engine_actor::CallFuture<T>
            + Send
            + 'static,
    {
        let actor = self.lease.instance().actor.clone();
        async move {
            actor
                .send(crate::engine_actor::Call::new(what, f))
                .await
                .map_err(|_| Error::disposed("the sandbox's engine instance"))?
        }
    }

    /// Destroys the session's sandbox (through the engine actor).
    fn destroy(&self) -> impl std::future::Future<Output = Result<(), Error>> + 'static {
        self.call("destroy", |sb| Box::pin(async move { sb.destroy().await }))
    }

    /// The sandbox's status and workdir, read with panic capture.
    fn describe(&self) -> Result<(SandboxStatus, String), Error> {
        let inst = self.lease.instance();
        let sandbox = inst.sandbox.clone();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            (
                sandbox.status(),
                sandbox.root_dir().to_string_lossy().into_owned(),
            )
        }))
        .map_err(|panic| {
            inst.tainted.store(true, Ordering::Release);
            crate::engine_actor::panicked("status", &*panic)
        })
    }

    /// Why it should be destroyed now, if it should: idle past `idle`, or open past
    /// `lifetime` (zero: never).
    fn expired(&self, now: Instant, idle: Duration, lifetime: Duration) -> Option<&'static str> {
        if !lifetime.is_zero() && now.duration_since(self.opened) >= lifetime {
            return Some("pool.sandbox_max_lifetime_ms");
        }
        let idle_now = self.busy.get() == 0
            && self.transfers.load(Ordering::Acquire) == 0
            && !self.processes.borrow().any_live();
        let transfer_ended =
            self.opened + Duration::from_millis(self.transfer_ended_ms.load(Ordering::Acquire));
        let last = self.last_used.get().max(transfer_ended);
        if !idle.is_zero() && idle_now && now.duration_since(last) >= idle {
            return Some("pool.sandbox_idle_timeout_ms");
        }
        None
    }
}

/// Counts an execution running in a session while it lives.
struct Busy(Rc<Session>);

impl Busy {
    fn new(session: Rc<Session>) -> Busy {
        session.busy.set(session.busy.get() + 1);
        Busy(session)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.set(self.0.busy.get().saturating_sub(1));
        self.0.last_used.set(Instant::now());
    }
}

/// The supervisor actor. Build it with [`crate::PaddockBuilder`] (which also starts
/// it on its own thread; `Paddock::supervisor` gives its address).
#[derive(Debug)]
pub struct Supervisor {
    engines: HashMap<EngineKind, Arc<dyn Engine>>,
    default_engine: EngineKind,
    pools: HashMap<(EngineKind, NetworkPolicy), Arc<EnginePool>>,
    pool_config: PoolConfig,
    pipeline: Rc<Pipeline>,
    sessions: HashMap<String, Rc<Session>>,
    /// Destroyed session ids and their tenants, so a repeated destroy is Ok for the
    /// owner and another tenant still gets `NOT_FOUND`.
    destroyed_sessions: VecDeque<(String, Option<String>)>,
}

/// Parts of a supervisor, assembled by the builder.
#[derive(Debug)]
pub(crate) struct SupervisorParts {
    pub(crate) engines: Vec<Arc<dyn Engine>>,
    pub(crate) default_engine: EngineKind,
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
            engines: parts.engines.into_iter().map(|e| (e.kind(), e)).collect(),
            default_engine: parts.default_engine,
            pools: HashMap::new(),
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
            destroyed_sessions: VecDeque::new(),
        }
    }

    /// The engine for a request that names `engine` (or none) and needs `level`: the
    /// named engine, else the default engine when it provides the level, else the
    /// configured engine with the weakest isolation that still provides it. A level no
    /// engine provides is left to the capability check, which refuses it.
    ///
    /// Only engines whose level `tenant` may use are chosen when one is not named; a
    /// named engine is taken as named, and the access check refuses it if need be.
    fn choose(
        &self,
        engine: Option<EngineKind>,
        level: IsolationLevel,
        tenant: Option<&str>,
    ) -> EngineKind {
        if let Some(kind) = engine {
            return kind;
        }
        let allowed = self.pipeline.access.for_tenant(tenant);
        let provides = |kind: &EngineKind| {
            self.engines.get(kind).is_some_and(|e| {
                let max = e.capabilities().max_level;
                max >= level && allowed.allows_level(max)
            })
        };
        if provides(&self.default_engine) {
            return self.default_engine;
        }
        self.engines
            .iter()
            .filter(|(kind, _)| provides(kind))
            .min_by_key(|(kind, e)| (e.capabilities().max_level, **kind))
            .map_or(self.default_engine, |(kind, _)| *kind)
    }

    /// The pool for an engine and network policy, created (and prewarmed) on first use.
    fn pool(
        &mut self,
        engine: Option<EngineKind>,
        level: IsolationLevel,
        network: &NetworkPolicy,
        tenant: Option<&str>,
    ) -> Result<Arc<EnginePool>, Error> {
        let kind = self.choose(engine, level, tenant);
        let key = (kind, network.clone());
        if let Some(p) = self.pools.get(&key) {
            return Ok(p.clone());
        }
        let Some(engine) = self.engines.get(&kind).cloned() else {
            let configured: Vec<&str> = self.engines.keys().map(|k| k.as_str()).collect();
            return Err(Error::new(
                ErrorCode::CapabilityNotSupported,
                format!(
                    "the {kind} engine is not configured; configured engines: {}",
                    configured.join(", ")
                ),
            ));
        };
        engine.capabilities().check_network(kind, network)?;
        let mut config = self.pool_config.clone();
        if *network != NetworkPolicy::None {
            // Only the default policy is kept warm; others grow on demand.
            config.min_idle = 0;
        }
        let pool = EnginePool::new(
            engine,
            network.clone(),
            config,
            self.pipeline.telemetry.clone(),
        );
        if *network == NetworkPolicy::None {
            self.pipeline.telemetry.register_pool(
                kind.as_str(),
                Arc::new(crate::engine_pool::Gauges(Arc::downgrade(&pool))),
            );
        }
        pool.prewarm();
        self.pools.insert(key, pool.clone());
        Ok(pool)
    }

    fn prewarm_all(&mut self) {
        let kinds: Vec<EngineKind> = self.engines.keys().copied().collect();
        for kind in kinds {
            if let Err(e) = self.pool(Some(kind), IsolationLevel::None, &NetworkPolicy::None, None)
            {
                tracing::info!(engine = %kind, error = %e, "no default pool");
            }
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

    /// Checks that `tenant` may ask for `network`, then finds the pool and checks
    /// that its engine gives a level `tenant` may use.
    fn allowed_pool(
        &mut self,
        engine: Option<EngineKind>,
        level: IsolationLevel,
        network: &NetworkPolicy,
        tenant: Option<&str>,
    ) -> Result<Arc<EnginePool>, Error> {
        let allowed = self.pipeline.access.for_tenant(tenant);
        allowed.check_network(network, tenant)?;
        let pool = self.pool(engine, level, network, tenant)?;
        let given = pool.engine().capabilities().max_level;
        allowed.check_level(given, pool.kind.as_str(), tenant)?;
        Ok(pool)
    }

    /// Forgets session `id`, remembering it (and its owner) as destroyed.
    fn remove_session(&mut self, id: &str) -> Option<Rc<Session>> {
        let session = self.sessions.remove(id)?;
        if self.destroyed_sessions.len() >= REMEMBERED_DESTROYED {
            self.destroyed_sessions.pop_front();
        }
        self.destroyed_sessions
            .push_back((id.to_string(), session.tenant.clone()));
        Some(session)
    }

    /// Destroys sessions idle or open past their time.
    fn expire_sessions(&mut self) {
        let idle = Duration::from_millis(self.pool_config.sandbox_idle_timeout_ms);
        let lifetime = Duration::from_millis(self.pool_config.sandbox_max_lifetime_ms);
        let now = Instant::now();
        let expired: Vec<(String, &'static str)> = self
            .sessions
            .iter()
            .filter_map(|(id, s)| s.expired(now, idle, lifetime).map(|why| (id.clone(), why)))
            .collect();
        for (id, why) in expired {
            if let Some(session) = self.remove_session(&id) {
                tracing::info!(sandbox = %id, reason = why, "destroying an expired sandbox");
                actix::spawn(async move {
                    if let Err(e) = session.destroy().await {
                        tracing::warn!(sandbox = %id, error = %e, "destroying an expired sandbox failed");
                    }
                    drop(session);
                });
            }
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
        ctx.run_interval(Duration::from_millis(500), |act, _| {
            let expired = act.pipeline.parking.borrow_mut().expire(Instant::now());
            for parked in expired {
                parked.retire();
            }
            for pool in act.pools.values() {
                pool.maintain();
            }
            act.expire_sessions();
        });
    }
}

/// A sink that feeds the streamer's buffer and, optionally, the caller's own sink.
struct Tee {
    buffer: BufferSink,
    extra: Option<Arc<dyn OutputSink>>,
}

#[async_trait]
impl OutputSink for Tee {
    async fn chunk(&self, chunk: OutputChunk) -> Result<(), Error> {
        match &self.extra {
            Some(extra) => {
                let first = self.buffer.chunk(chunk.clone()).await;
                let second = extra.chunk(chunk).await;
                first.and(second)
            }
            None => self.buffer.chunk(chunk).await,
        }
    }
}

/// Where an accepted execution runs.
enum Target {
    Pool(Arc<EnginePool>),
    Session(Rc<Session>),
    /// The resume of a pooled execution that suspended: the instance parked for it.
    Parked(Arc<EnginePool>),
}

impl Pipeline {
    /// Runs one accepted-or-refused execution to its end. Exactly one audit entry is
    /// recorded for every execution the limiter admitted.
    async fn run(
        self: Rc<Self>,
        target: Target,
        request: ExecRequest,
        engine: EngineKind,
        sink: Option<Arc<dyn OutputSink>>,
        traceparent: Option<String>,
    ) -> Result<ExecResult, Error> {
        let queued_at_ms = unix_ms();
        let refuse = |e: Error| {
            self.shared.refused_total.fetch_add(1, Ordering::Relaxed);
            e
        };
        if self.shared.stopping.load(Ordering::Acquire) {
            return Err(refuse(Error::new(
                ErrorCode::EngineDisposed,
                "Paddock is shutting down; no new executions are accepted",
            )));
        }
        request.validate().map_err(refuse)?;
        paddock_core::tenancy::check_ceilings(&self.ceilings, &request.limits, "limits")
            .map_err(refuse)?;
        let warnings = self.policy.check(&request.program).map_err(|r| {
            tracing::info!(rule = %r.rule, "policy refused an execution");
            self.telemetry.record_rule_block(&r.rule);
            refuse(r.error)
        })?;
        let tenant = request.tenant.clone();
        let engine_caps_output = match &target {
            Target::Pool(p) | Target::Parked(p) => {
                p.engine().capabilities().has_feature("output_cap")
            }
            Target::Session(s) => s.lease.engine_has_feature("output_cap"),
        };
        let max_output = request
            .limits
            .max_output_bytes
            .or(self.defaults.max_output_bytes);
        let permit = match self
            .limiter
            .send(Admit::tenant(tenant.clone().unwrap_or_default()))
            .await
        {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => return Err(refuse(e)),
            Err(e) => return Err(refuse(mailbox_error("limiter", e))),
        };
        // A pooled execution holds one of its tenant's pool slots while it waits and
        // runs; one in a session uses the session's.
        let share = match &target {
            Target::Pool(_) => Some(Share::take(&self.shares, &tenant, false).map_err(refuse)?),
            Target::Session(_) | Target::Parked(_) => None,
        };
        let id = request.id.clone();
        let token = CancelToken::new();
        {
            use dashmap::mapref::entry::Entry;
            match self.shared.running.entry(id.clone()) {
                Entry::Occupied(_) => {
                    return Err(refuse(Error::invalid_options(
                        "id",
                        format!("an execution with id {id} is already running; use a fresh id"),
                    )))
                }
                Entry::Vacant(v) => {
                    v.insert(Running {
                        tenant: tenant.clone(),
                        token: token.clone(),
                    });
                }
            }
        }
        // Accepted from here on.
        self.shared.accepted_total.fetch_add(1, Ordering::Relaxed);
        let hash = code_hash(&request.program.audit_text());
        let span = paddock_telemetry::execution_span(
            &id,
            engine.as_str(),
            tenant.as_deref().unwrap_or(""),
            traceparent.as_deref(),
        );
        let outcome = self
            .clone()
            .run_accepted(target, request, engine, sink, token)
            .instrument(span)
            .await;
        self.record_metrics(engine, &outcome);
        // Queued without waiting for the answer when the mailbox has room; a full
        // mailbox waits (bounded, never dropped).
        if let Err(SendError::Full(msg)) = self.streamer.try_send(CloseStream(id.clone())) {
            let _ = self.streamer.send(msg).await;
        }

        let entry_result = match &outcome {
            Ok(r) => AuditEntry::from_result(r, tenant.as_deref(), hash),
            Err(e) => {
                let mut failed = ExecResult::failed(id.clone(), engine, e.clone());
                failed.timings.queued_at_ms = queued_at_ms;
                AuditEntry::from_result(&failed, tenant.as_deref(), hash)
            }
        };
        // Exactly one entry per accepted execution: queued in order (a later `Flush`
        // or query sees it), waiting only when the mailbox is full.
        match self.audit.try_send(Record(entry_result)) {
            Ok(()) => {}
            Err(SendError::Full(msg)) => {
                if let Err(e) = self.audit.send(msg).await {
                    tracing::error!(error = %e, "the audit actor is gone; an entry was lost");
                }
            }
            Err(SendError::Closed(_)) => {
                tracing::error!("the audit actor is gone; an entry was lost");
            }
        }
        self.shared.running.remove(&id);
        drop(share);
        drop(permit);
        outcome.map(|mut r| {
            r.timings.queued_at_ms = queued_at_ms;
            r.warnings.extend(warnings);
            // Engines cap output while capturing; this holds the cap for any engine
            // that does not.
            // (An engine that caps by bytes while capturing says so with the
            // `output_cap` feature; re-cutting its lossy UTF-8 text by length would
            // flag binary output that never passed the cap.)
            if let Some(cap) = max_output.filter(|_| !engine_caps_output) {
                crate::limiter::enforce_output_cap(&mut r, cap);
            }
            r
        })
    }

    fn record_metrics(&self, engine: EngineKind, outcome: &Result<ExecResult, Error>) {
        let t = &self.telemetry;
        let (name, wall_ms) = match outcome {
            Ok(r) => (r.outcome.name(), r.usage.wall_ms as f64),
            Err(_) => (labels::outcome::FAILED, 0.0),
        };
        t.record_execution(engine.as_str(), name);
        t.record_duration(engine.as_str(), name, wall_ms);
        if let Ok(r) = outcome {
            let reason = match &r.outcome {
                Outcome::TimedOut => Some(labels::kill::TIMEOUT),
                Outcome::Cancelled => Some(labels::kill::CANCEL),
                Outcome::LimitExceeded { limit } => Some(match limit {
                    paddock_core::LimitKind::Memory => labels::kill::MEMORY,
                    paddock_core::LimitKind::Pids => labels::kill::PIDS,
                    paddock_core::LimitKind::Output => labels::kill::OUTPUT,
                    paddock_core::LimitKind::Cpu => labels::kill::CPU,
                    paddock_core::LimitKind::FileSize => "file_size",
                }),
                _ => None,
            };
            if let Some(reason) = reason {
                t.record_kill(reason);
            }
        }
    }

    async fn run_accepted(
        self: Rc<Self>,
        target: Target,
        request: ExecRequest,
        engine: EngineKind,
        sink: Option<Arc<dyn OutputSink>>,
        token: CancelToken,
    ) -> Result<ExecResult, Error> {
        let buffer = match self.streamer.send(OpenStream(request.id.clone())).await {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => return Err(e),
            Err(e) => return Err(mailbox_error("streamer", e)),
        };
        let tee: Arc<dyn OutputSink> = Arc::new(Tee {
            buffer: BufferSink(buffer),
            extra: sink,
        });
        match target {
            Target::Pool(pool) => {
                let lease = match pool.acquire(&token).await {
                    Ok(l) => l,
                    Err(e) if e.code == ErrorCode::Cancelled => {
                        return Ok(cancelled_result(request.id, engine));
                    }
                    Err(e) => return Err(e),
                };
                let limits = request.limits.clone().or(&self.defaults);
                let grace = Duration::from_millis(pool.config.watchdog_grace_ms);
                let tenant = request.tenant.clone();
                let mut result = run_on(&lease, request, tee, token, &limits, grace).await;
                self.settle(pool, lease, tenant, &mut result);
                result
            }
            Target::Parked(_) => {
                let paddock_core::Program::Resume { token_id, .. } = &request.program else {
                    unreachable!("only resumes are routed to parked instances")
                };
                // The instance's own pool: the one it was parked from, whatever the
                // routing saw.
                let parked = self.parking.borrow_mut().take(&request.tenant, token_id)?;
                let (pool, lease) = (parked.pool, parked.lease);
                let limits = request.limits.clone().or(&self.defaults);
                let grace = Duration::from_millis(pool.config.watchdog_grace_ms);
                let tenant = request.tenant.clone();
                let mut result = run_on(&lease, request, tee, token, &limits, grace).await;
                self.settle(pool, lease, tenant, &mut result);
                result
            }
            Target::Session(session) => {
                let _busy = Busy::new(session.clone());
                let mut request = request;
                request.limits = request.limits.or(&session.limits);
                let limits = request.limits.clone().or(&self.defaults);
                let grace = Duration::from_millis(session.lease.pool_config().watchdog_grace_ms);
                run_on(&session.lease, request, tee, token, &limits, grace).await
            }
        }
    }
}

impl Pipeline {
    /// Ends a pooled lease: an execution that suspended parks its instance for the
    /// resume; anything else goes back to the pool (retired unless clean).
    fn settle(
        &self,
        pool: Arc<EnginePool>,
        lease: Lease,
        tenant: Option<String>,
        result: &mut Result<ExecResult, Error>,
    ) {
        let Ok(r) = result else {
            pool.release(lease, release_for(result));
            return;
        };
        let Outcome::Suspended { token_id } = &r.outcome else {
            pool.release(lease, release_for(result));
            return;
        };
        let parked = self
            .parking
            .borrow_mut()
            .park(tenant, token_id.clone(), pool.clone(), lease);
        match parked {
            Ok(evicted) => {
                for p in evicted {
                    p.retire();
                }
            }
            Err(Refused::Disabled(lease)) => {
                r.warnings.push(
                    "pool.max_suspended is 0, so the instance holding this suspension was retired: \
                     the token cannot be resumed"
                        .to_string(),
                );
                pool.release(lease, Release::Retire);
            }
            Err(Refused::Duplicate(lease)) => {
                let message = format!(
                    "the handler suspended on token `{token_id}`, which another suspended execution of \
                     this tenant already holds; tokens must be unique"
                );
                r.outcome = Outcome::Failed {
                    error: Error::new(ErrorCode::WorkerFailed, message),
                };
                pool.release(lease, Release::Retire);
            }
        }
    }
}

/// Runs on a leased instance, with a watchdog in case the engine ignores its deadline.
async fn run_on(
    lease: &Lease,
    request: ExecRequest,
    sink: Arc<dyn OutputSink>,
    cancel: CancelToken,
    limits: &Limits,
    grace: Duration,
) -> Result<ExecResult, Error> {
    let inst = lease.instance();
    let id = request.id.clone();
    let engine = inst.sandbox.kind();
    let instance_id = inst.sandbox.id().to_string();
    let deadline = limits.timeout().unwrap_or(Duration::from_secs(30)) + grace;
    let started = Instant::now();
    let fut = inst.actor.send(RunExec {
        request,
        sink,
        cancel: cancel.clone(),
    });
    match tokio::time::timeout(deadline, fut).await {
        Ok(Ok(result)) => result,
        Ok(Err(e)) => Err(mailbox_error("engine instance", e)),
        Err(_) => {
            cancel.cancel();
            let mut r = ExecResult::empty(id, Outcome::TimedOut, engine, instance_id);
            r.usage.wall_ms = started.elapsed().as_millis() as u64;
            r.warnings.push(format!(
                "the engine did not stop within {} ms of its deadline; the instance was retired",
                grace.as_millis()
            ));
            Ok(r)
        }
    }
}

/// Anything but a clean completion taints the instance.
fn release_for(result: &Result<ExecResult, Error>) -> Release {
    match result {
        Ok(r) if matches!(r.outcome, Outcome::Completed { .. }) => Release::Reuse,
        Ok(_) => Release::Retire,
        Err(e) => match e.code {
            ErrorCode::EngineFailed
            | ErrorCode::WorkerFailed
            | ErrorCode::ProtocolError
            | ErrorCode::EngineDisposed
            | ErrorCode::Timeout => Release::Retire,
            _ => Release::Reuse,
        },
    }
}

fn cancelled_result(id: ExecutionId, engine: EngineKind) -> ExecResult {
    ExecResult::empty(id, Outcome::Cancelled, engine, "")
}

fn mailbox_error(what: &str, e: MailboxError) -> Error {
    Error::new(
        ErrorCode::EngineFailed,
        format!("the {what} actor did not answer ({e}); retry"),
    )
}

impl Handler<Execute> for Supervisor {
    type Result = ResponseFuture<Result<ExecResult, Error>>;

    fn handle(&mut self, msg: Execute, _ctx: &mut Self::Context) -> Self::Result {
        if let paddock_core::Program::Resume { token_id, .. } = &msg.request.program {
            // A resume goes to the instance its execution suspended on.
            let parking = self.pipeline.parking.borrow();
            let routed = match parking.pool_of(&msg.request.tenant, token_id) {
                Some(pool) if msg.engine.is_some_and(|e| e != pool.kind) => Err(Error::invalid_options(
                    "engine",
                    format!(
                        "token `{token_id}` belongs to an execution on the {} engine; name that engine or none",
                        pool.kind
                    ),
                )),
                Some(pool) => Ok(pool),
                None => Err(parking.not_found_error(&msg.request.tenant, token_id)),
            };
            drop(parking);
            return match routed {
                Ok(pool) => {
                    let kind = pool.kind;
                    Box::pin(self.pipeline.clone().run(
                        Target::Parked(pool),
                        msg.request,
                        kind,
                        msg.sink,
                        msg.traceparent,
                    ))
                }
                Err(e) => {
                    let e = self.refuse(e);
                    Box::pin(async move { Err(e) })
                }
            };
        }
        let tenant = msg.request.tenant.clone();
        let prepared = self
            .allowed_pool(msg.engine, msg.level, &msg.network, tenant.as_deref())
            .and_then(|pool| {
                let caps = pool.engine().capabilities();
                caps.check_level(pool.kind, msg.level)?;
                caps.check_program(pool.kind, msg.request.program.kind())?;
                Ok(pool)
            });
        let pool = match prepared {
            Ok(p) => p,
            Err(e) => {
                let e = self.refuse(e);
                return Box::pin(async move { Err(e) });
            }
        };
        let pipeline = self.pipeline.clone();
        let kind = pool.kind;
        Box::pin(pipeline.run(
            Target::Pool(pool),
            msg.request,
            kind,
            msg.sink,
            msg.traceparent,
        ))
    }
}

impl Handler<Cancel> for Supervisor {
    type Result = bool;

    fn handle(&mut self, msg: Cancel, _ctx: &mut Self::Context) -> bool {
        self.note_operator(&msg.caller, "execution.cancel", Some(msg.id.to_string()));
        cancel_running(&self.pipeline.shared, &msg.caller, &msg.id)
    }
}

/// Cancels a running execution through the shared registry, if `caller` may see it:
/// another tenant's execution is not cancelled, exactly like an unknown id.
pub(crate) fn cancel_running(shared: &Shared, caller: &Caller, id: &ExecutionId) -> bool {
    match shared.running.get(id) {
        Some(r) if caller.sees(r.tenant.as_deref()) => r.token.cancel(),
        _ => false,
    }
}

impl Handler<OpenSandbox> for Supervisor {
    type Result = ResponseActFuture<Self, Result<SandboxInfo, Error>>;

    fn handle(&mut self, msg: OpenSandbox, _ctx: &mut Self::Context) -> Self::Result {
        let tenant = msg.spec.tenant.clone();
        let prepared = self
            .allowed_pool(
                msg.engine,
                msg.spec.level,
                &msg.spec.network,
                tenant.as_deref(),
            )
            .and_then(|pool| {
                let caps = pool.engine().capabilities();
                caps.check_level(pool.kind, msg.spec.level)?;
                msg.spec.limits.validate("limits", false)?;
                paddock_core::tenancy::check_ceilings(
                    &self.pipeline.ceilings,
                    &msg.spec.limits,
                    "limits",
                )?;
                // Held from here: a sandbox being opened counts against the caps.
                let share = Share::take(&self.pipeline.shares, &tenant, true)?;
                Ok((pool, share))
            });
        let stopping = self.pipeline.shared.stopping.load(Ordering::Acquire);
        Box::pin(
            async move {
                if stopping {
                    return Err(Error::new(
                        ErrorCode::EngineDisposed,
                        "Paddock is shutting down; no new sandboxes are opened",
                    ));
                }
                let (pool, share) = prepared?;
                let lease = pool.acquire(&CancelToken::new()).await?;
                Ok((pool.kind, lease, share))
            }
            .into_actor(self)
            .map(move |r, act, _ctx| {
                let (engine, lease, share) = r?;
                let id = lease.instance().sandbox.id().to_string();
                let session = Rc::new(Session {
                    engine,
                    lease,
                    tenant: msg.spec.tenant.clone(),
                    limits: msg.spec.limits.clone(),
                    processes: RefCell::new(Default::default()),
                    opened: Instant::now(),
                    last_used: Cell::new(Instant::now()),
                    busy: Cell::new(0),
                    transfers: Arc::default(),
                    transfer_ended_ms: Arc::default(),
                    _share: share,
                });
                // An engine that panics here never gets a session: the lease retires
                // the tainted instance when it goes.
                let (status, root_dir) = session.describe()?;
                act.sessions.insert(id.clone(), session);
                Ok(SandboxInfo {
                    id,
                    engine,
                    status,
                    root_dir,
                })
            }),
        )
    }
}

impl Handler<SandboxExec> for Supervisor {
    type Result = ResponseFuture<Result<ExecResult, Error>>;

    fn handle(&mut self, msg: SandboxExec, _ctx: &mut Self::Context) -> Self::Result {
        let session = match self.session_for(&msg.caller, &msg.sandbox) {
            Ok(s) => s,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let mut request = msg.request;
        if request.tenant.is_none() {
            request.tenant = session.tenant.clone();
        }
        let engine = session.engine;
        let pipeline = self.pipeline.clone();
        Box::pin(pipeline.run(Target::Session(session), request, engine, msg.sink, None))
    }
}

/// A session message handled by one engine method, called through the engine actor.
macro_rules! session_op {
    ($msg:ty, $out:ty, $what:literal, |$s:ident, $m:ident| $body:expr) => {
        impl Handler<$msg> for Supervisor {
            type Result = ResponseFuture<Result<$out, Error>>;

            fn handle(&mut self, $m: $msg, _ctx: &mut Self::Context) -> Self::Result {
                let session = match self.session_for(&$m.caller, &$m.sandbox) {
                    Ok(s) => s,
                    Err(e) => return Box::pin(async move { Err(e) }),
                };
                Box::pin(session.call($what, move |$s| Box::pin($body)))
            }
        }
    };
}

session_op!(WriteFile, (), "write_file", |sb, msg| async move {
    sb.write_file(&msg.path, &msg.data).await
});
session_op!(ReadFile, Vec<u8>, "read_file", |sb, msg| async move {
    sb.read_file(&msg.path).await
});
impl Handler<OpenRead> for Supervisor {
    type Result = ResponseFuture<Result<paddock_core::FileReader, Error>>;

    fn handle(&mut self, msg: OpenRead, _ctx: &mut Self::Context) -> Self::Result {
        let session = match self.session_for(&msg.caller, &msg.sandbox) {
            Ok(s) => s,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        Box::pin(async move {
            let path = msg.path;
            let reader = session
                .call("open_read", move |sb| {
                    Box::pin(async move { sb.open_read(&path).await })
                })
                .await?;
            // The sandbox counts as in use until the reader is done.
            let guard = Transfer::new(&session);
            Ok(paddock_core::FileReader::new(
                reader.size,
                Box::pin(Guarded {
                    inner: reader.reader,
                    _guard: guard,
                }),
            ))
        })
    }
}

impl Handler<WriteFrom> for Supervisor {
    type Result = ResponseFuture<Result<u64, Error>>;

    fn handle(&mut self, msg: WriteFrom, _ctx: &mut Self::Context) -> Self::Result {
        let session = match self.session_for(&msg.caller, &msg.sandbox) {
            Ok(s) => s,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        Box::pin(async move {
            // In use while the upload lasts.
            let _busy = Busy::new(session.clone());
            let WriteFrom {
                path,
                source,
                max_bytes,
                ..
            } = msg;
            session
                .call("write_from", move |sb| {
                    Box::pin(async move { sb.write_from(&path, source, max_bytes).await })
                })
                .await
        })
    }
}

/// A download of a session's file in progress, counted so that idle expiry spares
/// the session; it notes when it ended.
struct Transfer {
    count: Arc<std::sync::atomic::AtomicUsize>,
    ended_ms: Arc<AtomicU64>,
    opened: Instant,
}

impl Transfer {
    fn new(session: &Session) -> Transfer {
        session.transfers.fetch_add(1, Ordering::AcqRel);
        Transfer {
            count: session.transfers.clone(),
            ended_ms: session.transfer_ended_ms.clone(),
            opened: session.opened,
        }
    }
}

impl Drop for Transfer {
    fn drop(&mut self) {
        let ms = self.opened.elapsed().as_millis() as u64;
        self.ended_ms.fetch_max(ms, Ordering::AcqRel);
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A reader that holds a [`Transfer`] while it lives.
struct Guarded {
    inner: paddock_core::ByteSource,
    _guard: Transfer,
}

impl tokio::io::AsyncRead for Guarded {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.inner.as_mut().poll_read(cx, buf)
    }
}
session_op!(PauseSandbox, (), "pause", |sb, _msg| async move {
    sb.pause().await
});
session_op!(UnpauseSandbox, (), "unpause", |sb, _msg| async move {
    sb.unpause().await
});
session_op!(
    ListFiles,
    Vec<paddock_core::FileEntry>,
    "list_files",
    |sb, msg| async move { sb.list_files(&msg.path).await }
);

impl Handler<GetSandbox> for Supervisor {
    type Result = Result<SandboxInfo, Error>;

    fn handle(&mut self, msg: GetSandbox, _ctx: &mut Self::Context) -> Self::Result {
        let session = self.session_for(&msg.caller, &msg.id)?;
        self.note_operator(&msg.caller, msg.action, Some(msg.id.clone()));
        let (status, root_dir) = session.describe()?;
        Ok(SandboxInfo {
            id: msg.id,
            engine: session.engine,
            status,
            root_dir,
        })
    }
}

impl Handler<GetSandboxStatus> for Supervisor {
    type Result = Result<SandboxStatus, Error>;

    fn handle(&mut self, msg: GetSandboxStatus, _ctx: &mut Self::Context) -> Self::Result {
        match self.session_for(&msg.caller, &msg.sandbox) {
            Ok(s) => Ok(s.describe()?.0),
            Err(e) if e.code == ErrorCode::EngineDisposed => Ok(SandboxStatus::Destroyed),
            Err(e) => Err(e),
        }
    }
}

impl Handler<DestroySandbox> for Supervisor {
    type Result = ResponseFuture<Result<(), Error>>;

    fn handle(&mut self, msg: DestroySandbox, _ctx: &mut Self::Context) -> Self::Result {
        // Another tenant's session, open or destroyed, is NOT_FOUND; a destroyed one
        // of the caller's is destroyed again, which is fine.
        match self.session_for(&msg.caller, &msg.sandbox) {
            Ok(_) => {}
            Err(e) if e.code == ErrorCode::EngineDisposed => return Box::pin(async { Ok(()) }),
            Err(e) => return Box::pin(async move { Err(e) }),
        }
        let Some(session) = self.remove_session(&msg.sandbox) else {
            return Box::pin(async { Ok(()) });
        };
        self.note_operator(&msg.caller, "sandbox.destroy", Some(msg.sandbox.clone()));
        Box::pin(async move {
            // Destroy now (it kills running executions and waits for them); the lease
            // then retires the instance when the last reference goes.
            let r = session.destroy().await;
            drop(session);
            r
        })
    }
}

impl Handler<GetStats> for Supervisor {
    type Result = MessageResult<GetStats>;

    fn handle(&mut self, msg: GetStats, _ctx: &mut Self::Context) -> Self::Result {
        self.note_operator(&msg.caller, "stats", None);
        let shared = &self.pipeline.shared;
        let pools = self.pools.values().map(|p| p.stats()).collect();
        let admitting = !shared.stopping.load(Ordering::Relaxed);
        let Some(owner) = msg.caller.confined_to() else {
            return MessageResult(Stats {
                pools,
                accepted_total: Some(shared.accepted_total.load(Ordering::Relaxed)),
                refused_total: Some(shared.refused_total.load(Ordering::Relaxed)),
                in_flight: shared.running.len(),
                sandboxes: self.sessions.len(),
                suspended: self.pipeline.parking.borrow().len(),
                admitting,
                tenant: None,
            });
        };
        MessageResult(Stats {
            pools,
            accepted_total: None,
            refused_total: None,
            in_flight: shared
                .running
                .iter()
                .filter(|r| r.value().tenant.as_deref() == owner)
                .count(),
            sandboxes: self
                .sessions
                .values()
                .filter(|s| s.tenant.as_deref() == owner)
                .count(),
            suspended: self.pipeline.parking.borrow().count_for(owner),
            admitting,
            tenant: Some(owner.unwrap_or_default().to_string()),
        })
    }
}

impl Handler<SearchAudit> for Supervisor {
    type Result = ResponseFuture<Vec<AuditEntry>>;

    fn handle(&mut self, msg: SearchAudit, _ctx: &mut Self::Context) -> Self::Result {
        self.note_operator(&msg.caller, "audit.search", msg.query.tenant.clone());
        let audit = self.pipeline.audit.clone();
        let owner = msg.caller.confined_to().map(|o| o.map(str::to_owned));
        Box::pin(async move {
            audit
                .send(crate::audit::SearchFor {
                    query: msg.query,
                    owner,
                })
                .await
                .unwrap_or_default()
        })
    }
}

impl Handler<AuditStatistics> for Supervisor {
    type Result = ResponseFuture<crate::audit::AuditStats>;

    fn handle(&mut self, msg: AuditStatistics, _ctx: &mut Self::Context) -> Self::Result {
        self.note_operator(&msg.caller, "audit.statistics", None);
        let audit = self.pipeline.audit.clone();
        let owner = msg.caller.confined_to().map(|o| o.map(str::to_owned));
        Box::pin(async move {
            audit
                .send(crate::audit::StatisticsFor { owner })
                .await
                .unwrap_or_default()
        })
    }
}

impl Handler<OperatorAccesses> for Supervisor {
    type Result = ResponseFuture<Result<Vec<OperatorAccess>, Error>>;

    fn handle(&mut self, msg: OperatorAccesses, _ctx: &mut Self::Context) -> Self::Result {
        if msg.caller.confined_to().is_some() {
            return Box::pin(async {
                Err(Error::new(
                    ErrorCode::NotFound,
                    "operator accesses are shown to operator keys only",
                ))
            });
        }
        self.note_operator(&msg.caller, "audit.operator_accesses", None);
        let audit = self.pipeline.audit.clone();
        Box::pin(async move {
            audit
                .send(crate::audit::Accesses { limit: msg.limit })
                .await
                .map_err(|e| mailbox_error("audit", e))
        })
    }
}

impl Handler<Shutdown> for Supervisor {
    type Result = ResponseActFuture<Self, ShutdownReport>;

    fn handle(&mut self, msg: Shutdown, _ctx: &mut Self::Context) -> Self::Result {
        let shared = self.pipeline.shared.clone();
        shared.stopping.store(true, Ordering::Release);
        let audit = self.pipeline.audit.clone();
        let in_flight_at_start = shared.running.len();
        let sessions: Vec<Rc<Session>> = self.sessions.drain().map(|(_, s)| s).collect();
        let parked = self.pipeline.parking.borrow_mut().drain();
        let pools: Vec<Arc<EnginePool>> = self.pools.values().cloned().collect();
        Box::pin(
            async move {
                let deadline = Instant::now() + msg.drain;
                while !shared.running.is_empty() && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let mut cancelled = 0;
                for entry in shared.running.iter() {
                    if entry.value().token.cancel() {
                        cancelled += 1;
                    }
                }
                // Cancelled executions finish promptly; give them a moment to record.
                let grace = Instant::now() + Duration::from_secs(10);
                while !shared.running.is_empty() && Instant::now() < grace {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let mut destroyed = 0;
                for s in sessions {
                    let _ = s.destroy().await;
                    destroyed += 1;
                }
                for p in parked {
                    p.retire();
                }
                for p in &pools {
                    p.close();
                }
                let _ = audit.send(crate::audit::Flush).await;
                ShutdownReport {
                    drained: in_flight_at_start.saturating_sub(cancelled),
                    cancelled,
                    sandboxes_destroyed: destroyed,
                }
            }
            .into_actor(self),
        )
    }
}
