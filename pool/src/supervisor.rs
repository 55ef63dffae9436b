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
use dashmap::DashMap;
use paddock_core::AccessRules;
use paddock_core::{
    CancelToken, Engine, EngineName, Error, ErrorCode, ExecResult, ExecutionId, IsolationLevel,
    Limits, NetworkPolicy, PoolConfig, SandboxStatus,
};

use crate::audit::{Audit, OperatorAccess, RecordAccess};
use crate::caller::Caller;
use crate::engine_pool::{DiskKey, EnginePool};
use crate::limiter::Limiter;
use crate::messages::*;
use crate::policy::Policy;
use crate::streamer::Streamer;
use choice::Runs;
use paddock_telemetry::Telemetry;

/// How many destroyed session ids are remembered, so a repeated destroy is Ok.
const REMEMBERED_DESTROYED: usize = 10_000;

/// Most pools of executions' own disk quotas or allowlists one tenant keeps at once
/// (each of their instances holds a filesystem of that size, or an egress gateway;
/// they are made on demand and not prewarmed). Each tenant has its own: one
/// tenant's pools never take another's place.
const MAX_DISK_POOLS: usize = 16;

/// Most pools of executions' own disk quotas or allowlists kept at once, all tenants
/// together.
const MAX_OWN_POOLS_TOTAL: usize = 256;

/// How long a pool of an execution's own disk quota is kept after work was last
/// routed to it, even with no instance, before another quota may replace it.
const DISK_POOL_GRACE: Duration = Duration::from_secs(60);

/// What a pool's instances are made with: engine, network policy, disk quota and
/// home ([`SandboxSpec::home`](paddock_core::SandboxSpec::home)), and for a pool of
/// a tenant's own disk quota or allowlist, the tenant (`None` for the pools every
/// tenant shares, and for those the operator keeps warm).
type PoolKey = (
    EngineName,
    NetworkPolicy,
    DiskKey,
    Option<Arc<str>>,
    Option<Arc<str>>,
);

/// Whether a pool of this network and disk is one made for one kind of request
/// (its own disk quota, its own allowlist): bounded in number per tenant.
fn own_kind(network: &NetworkPolicy, disk: &DiskKey) -> bool {
    !disk.is_default() || matches!(network, NetworkPolicy::Allowlist { .. })
}

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
mod files;
mod interactive;
mod observe;
mod session;

use crate::pipeline::{Pipeline, Target};
use crate::shares::{Share, Shares};
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

    /// The pool for an engine, network policy and disk quota, created (and
    /// prewarmed) on first use. Pools of executions' own disk quotas or allowlists are at most
    /// [`MAX_DISK_POOLS`]: a new one replaces one that holds no instance, or is
    /// refused with `POOL_EXHAUSTED` while all are in use.
    #[allow(clippy::too_many_arguments)]
    fn pool(
        &mut self,
        engine: Option<EngineName>,
        level: IsolationLevel,
        runs: Runs,
        network: &NetworkPolicy,
        disk: DiskKey,
        home: Option<&str>,
        tenant: Option<&str>,
    ) -> Result<Arc<EnginePool>, Error> {
        let kind = self.choose(engine, level, runs, tenant)?;
        let home: Option<Arc<str>> = home.map(Arc::from);
        let shared = (kind.clone(), network.clone(), disk, home.clone(), None);
        if let Some(p) = self.pools.get(&shared) {
            p.touch();
            return Ok(p.clone());
        }
        // Pools made for one kind of request (its own disk quota, its own
        // allowlist) are the tenant's own, and bounded in number per tenant: the
        // least recently used unused one of the tenant's makes room.
        let owner: Option<Arc<str>> = if own_kind(network, &disk) {
            tenant.map(Arc::from)
        } else {
            None
        };
        let key = (
            kind.clone(),
            network.clone(),
            disk,
            home.clone(),
            owner.clone(),
        );
        if let Some(p) = self.pools.get(&key) {
            p.touch();
            return Ok(p.clone());
        }
        if own_kind(network, &disk) {
            let mine = |(_, n, d, _, o): &PoolKey| own_kind(n, d) && *o == owner;
            let own = self.pools.keys().filter(|k| mine(k)).count();
            if own >= MAX_DISK_POOLS {
                // The one routed to longest ago among those with no instance and no
                // waiter, and not routed to within DISK_POOL_GRACE (an execution
                // routed there may still be waiting for its permit).
                let unused = self
                    .pools
                    .iter()
                    .filter(|(k, p)| mine(k) && p.is_unused() && p.idle_for() >= DISK_POOL_GRACE)
                    .max_by_key(|(_, p)| p.idle_for())
                    .map(|(k, _)| k.clone());
                let Some(unused) = unused else {
                    let who = match tenant {
                        Some(t) => format!("tenant `{t}` has"),
                        None => "callers without a tenant have".to_string(),
                    };
                    return Err(Error::new(
                        ErrorCode::PoolExhausted,
                        format!(
                            "{who} {MAX_DISK_POOLS} pools of executions' own disk quotas or allowlists in use, the most one tenant keeps; retry later, leave limits.disk_bytes and limits.disk_files unset, or reuse an allowlist already in use"
                        ),
                    ));
                };
                if let Some(p) = self.pools.remove(&unused) {
                    p.close();
                }
            }
            // All tenants' together are bounded too (tenants without API keys are
            // callers' own claims): at the bound, an unused pool of the tenant that
            // holds the most gives way, as results do in the server's store.
            let all: Vec<&PoolKey> = self
                .pools
                .keys()
                .filter(|(_, n, d, _, _)| own_kind(n, d))
                .collect();
            if all.len() >= MAX_OWN_POOLS_TOTAL {
                let mut held: HashMap<Option<Arc<str>>, usize> = HashMap::new();
                for (_, _, _, _, o) in &all {
                    *held.entry(o.clone()).or_default() += 1;
                }
                let unused = self
                    .pools
                    .iter()
                    .filter(|((_, n, d, _, _), p)| {
                        own_kind(n, d) && p.is_unused() && p.idle_for() >= DISK_POOL_GRACE
                    })
                    .max_by_key(|((_, _, _, _, o), p)| {
                        (held.get(o).copied().unwrap_or(0), p.idle_for())
                    })
                    .map(|(k, _)| k.clone());
                let Some(unused) = unused else {
                    return Err(Error::new(
                        ErrorCode::PoolExhausted,
                        format!(
                            "{MAX_OWN_POOLS_TOTAL} pools of executions' own disk quotas or allowlists are in use, the most the server keeps; retry later"
                        ),
                    ));
                };
                if let Some(p) = self.pools.remove(&unused) {
                    p.close();
                }
            }
        }
        let Some(engine) = self.engines.get(&kind).cloned() else {
            let mut configured: Vec<&str> = self.engines.keys().map(|k| k.as_str()).collect();
            configured.sort_unstable();
            return Err(Error::new(
                ErrorCode::CapabilityNotSupported,
                format!(
                    "the {kind} engine is not configured; configured engines: {}",
                    configured.join(", ")
                ),
            ));
        };
        engine.capabilities().check_network(&kind, network)?;
        if home.is_some() {
            engine
                .capabilities()
                .check_feature(&kind, paddock_core::engine::FEATURE_HOME)?;
        }
        let mut config = self.pool_config.clone();
        if *network != NetworkPolicy::None {
            // Only the default policy is kept warm; others grow on demand.
            config.min_idle = 0;
        }
        if !disk.is_default() {
            config.min_idle = 0;
        }
        if let Some(n) = self.warm_sizes.get(&key) {
            config.min_idle = (*n).min(config.max_size);
        }
        let pool = EnginePool::new(
            engine,
            network.clone(),
            disk,
            home.as_deref(),
            config,
            self.pipeline.telemetry.clone(),
        );
        if *network == NetworkPolicy::None && disk.is_default() && home.is_none() {
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
        let kinds: Vec<EngineName> = self.engines.keys().cloned().collect();
        for kind in kinds {
            if let Err(e) = self.pool(
                Some(kind.clone()),
                IsolationLevel::None,
                Runs::Sandbox,
                &NetworkPolicy::None,
                DiskKey::default(),
                None,
                None,
            ) {
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
    #[allow(clippy::too_many_arguments)]
    fn allowed_pool(
        &mut self,
        engine: Option<EngineName>,
        level: IsolationLevel,
        runs: Runs,
        network: &NetworkPolicy,
        disk: DiskKey,
        home: Option<&str>,
        tenant: Option<&str>,
    ) -> Result<Arc<EnginePool>, Error> {
        let allowed = self.pipeline.access.for_tenant(tenant);
        allowed.check_network(network, tenant)?;
        // An allowlist that does not parse is refused before any pool is made for it.
        network.rules("network")?;
        let pool = self.pool(engine, level, runs, network, disk, home, tenant)?;
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

    /// Destroys `session` (already removed from the open ones), keeping it as
    /// destroying until its teardown has ended, so that a concurrent destroy of the
    /// same id waits for that teardown too.
    fn destroy_session(
        &mut self,
        id: String,
        session: Rc<Session>,
    ) -> impl ActorFuture<Self, Output = Result<(), Error>> + 'static {
        let ending = end_session(session);
        self.destroying.insert(id.clone(), ending.clone());
        ending.into_actor(self).map(move |(), act, _ctx| {
            act.destroying.remove(&id);
            Ok(())
        })
    }

    /// Destroys sessions idle or open past their time.
    fn expire_sessions(&mut self, ctx: &mut Context<Self>) {
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
                let destroyed = self.destroy_session(id.clone(), session);
                ctx.spawn(destroyed.map(move |r, _act, _ctx| {
                    if let Err(e) = r {
                        tracing::warn!(sandbox = %id, error = %e, "destroying an expired sandbox failed");
                    }
                }));
            }
        }
    }

    /// Records an operator's use of its key (nothing for tenants or the embedder).
    fn note_operator(&self, caller: &Caller, action: &str, target: Option<String>) {
        note_operator(&self.pipeline.audit, caller, action, target);
    }
}

/// A session's end under way: resolves once its instance is recycled or gone.
type Ending = futures_util::future::Shared<futures_util::future::LocalBoxFuture<'static, ()>>;

/// Ends `session` (see [`Session::end`]) and lets it go; the future resolves when
/// its instance is back in the pool, recycled, or destroyed.
fn end_session(session: Rc<Session>) -> Ending {
    use futures_util::FutureExt;
    let done = session.end();
    drop(session);
    async move {
        // A dropped sender: the pool went first, and the instance with it.
        let _ = done.await;
    }
    .boxed_local()
    .shared()
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
                    let kind = pool.kind.clone();
                    Box::pin(self.pipeline.clone().run(
                        Target::Parked,
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
        // An execution's own disk quota picks (or makes) a pool of its own: checked
        // first, so a refused request never makes or replaces one.
        let disk = DiskKey::of(&msg.request.limits);
        if !disk.is_default() {
            let checked = msg.request.limits.validate("limits", false).and_then(|()| {
                paddock_core::tenancy::check_ceilings(
                    &self.pipeline.ceilings,
                    &msg.request.limits,
                    "limits",
                )
            });
            if let Err(e) = checked {
                let e = self.refuse(e);
                return Box::pin(async move { Err(e) });
            }
        }
        let tenant = msg.request.tenant.clone();
        let prepared = self
            .allowed_pool(
                msg.engine,
                msg.level,
                Runs::Program(msg.request.program.kind()),
                &msg.network,
                disk,
                None,
                tenant.as_deref(),
            )
            .and_then(|pool| {
                let caps = pool.engine().capabilities();
                caps.check_level(&pool.kind, msg.level)?;
                caps.check_program(&pool.kind, msg.request.program.kind())?;
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
        let kind = pool.kind.clone();
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
        // Checked before a pool is chosen: a pool of the sandbox's disk quota may be
        // made for it.
        let checked = msg.spec.limits.validate("limits", false).and_then(|()| {
            paddock_core::tenancy::check_ceilings(
                &self.pipeline.ceilings,
                &msg.spec.limits,
                "limits",
            )
        });
        if let Err(e) = checked {
            return Box::pin(actix::fut::ready(Err(e)));
        }
        let prepared = self
            .allowed_pool(
                msg.engine,
                msg.spec.level,
                Runs::Sandbox,
                &msg.spec.network,
                // Its filesystem is made with the instance: one of this size.
                DiskKey::of(&msg.spec.limits),
                msg.spec.home.as_deref(),
                tenant.as_deref(),
            )
            .and_then(|pool| {
                let caps = pool.engine().capabilities();
                caps.check_level(&pool.kind, msg.spec.level)?;
                msg.spec.limits.validate("limits", false)?;
                caps.check_limits(&pool.kind, &msg.spec.limits, "limits")?;
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
                Ok((pool.kind.clone(), lease, share))
            }
            .into_actor(self)
            .map(move |r, act, _ctx| {
                let (engine, lease, share) = r?;
                // Its own id, never reused: the instance outlives the session
                // (recycled for the next one), and a destroyed id stays destroyed.
                // Tagged like the instance's, which names its engine.
                let instance = lease.instance().sandbox.id().to_string();
                let tag = instance.split('-').next().unwrap_or("sb");
                let id = paddock_core::ids::tagged(tag);
                let session = Rc::new(Session {
                    engine: engine.clone(),
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
                    running: RefCell::default(),
                    ended: RefCell::default(),
                });
                // An engine that panics here never gets a session: the lease retires
                // the tainted instance when it goes.
                let (status, root_dir, host_dir) = session.describe()?;
                act.sessions.insert(id.clone(), session);
                Ok(SandboxInfo {
                    id,
                    engine,
                    status,
                    root_dir,
                    host_dir,
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
        let engine = session.engine.clone();
        let pipeline = self.pipeline.clone();
        Box::pin(pipeline.run(Target::Session(session), request, engine, msg.sink, None))
    }
}

impl Handler<GetSandbox> for Supervisor {
    type Result = Result<SandboxInfo, Error>;

    fn handle(&mut self, msg: GetSandbox, _ctx: &mut Self::Context) -> Self::Result {
        let session = self.session_for(&msg.caller, &msg.id)?;
        self.note_operator(&msg.caller, msg.action, Some(msg.id.clone()));
        let (status, root_dir, host_dir) = session.describe()?;
        Ok(SandboxInfo {
            id: msg.id,
            engine: session.engine.clone(),
            status,
            root_dir,
            host_dir,
        })
    }
}

impl Handler<WarmPool> for Supervisor {
    type Result = Result<(), Error>;

    fn handle(&mut self, msg: WarmPool, _ctx: &mut Self::Context) -> Self::Result {
        let home: Option<Arc<str>> = msg.spec.home.as_deref().map(Arc::from);
        let key = (
            msg.engine.clone(),
            msg.spec.network.clone(),
            DiskKey::of(&msg.spec.limits),
            home,
            None,
        );
        let n = self.warm_sizes.entry(key.clone()).or_insert(0);
        *n = (*n).max(msg.min_idle);
        if self.pools.contains_key(&key) {
            return Ok(());
        }
        // Made (and prewarmed) now, so that the first sandbox finds one ready.
        self.pool(
            Some(msg.engine),
            msg.spec.level,
            Runs::Sandbox,
            &msg.spec.network,
            DiskKey::of(&msg.spec.limits),
            msg.spec.home.as_deref(),
            None,
        )
        .map(drop)
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
    type Result = ResponseActFuture<Self, Result<(), Error>>;

    fn handle(&mut self, msg: DestroySandbox, _ctx: &mut Self::Context) -> Self::Result {
        // Another tenant's session, open or destroyed, is NOT_FOUND; a destroyed one
        // of the caller's is destroyed again, which is fine, and one whose destroy is
        // under way is joined: every destroy returns after the teardown.
        match self.session_for(&msg.caller, &msg.sandbox) {
            Ok(_) => {}
            Err(e) if e.code == ErrorCode::EngineDisposed => {
                return match self.destroying.get(&msg.sandbox).cloned() {
                    Some(ending) => Box::pin(
                        async move {
                            ending.await;
                            Ok(())
                        }
                        .into_actor(self),
                    ),
                    None => Box::pin(actix::fut::ready(Ok(()))),
                };
            }
            Err(e) => return Box::pin(actix::fut::ready(Err(e))),
        }
        let Some(session) = self.remove_session(&msg.sandbox) else {
            return Box::pin(actix::fut::ready(Ok(())));
        };
        self.note_operator(&msg.caller, "sandbox.destroy", Some(msg.sandbox.clone()));
        Box::pin(self.destroy_session(msg.sandbox, session))
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
                let destroyed = sessions.len();
                futures_util::future::join_all(sessions.into_iter().map(end_session)).await;
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
