//! An engine pool: warm instances of one engine (for one network policy), leased one
//! execution at a time.
//!
//! Sizing: prewarm to `min_idle`, grow lazily to `max_size`. Waiting: at most
//! `max_waiting` queued callers, each for at most `acquire_timeout`, then
//! `POOL_EXHAUSTED`. Recycling: an instance is retired after
//! `max_executions_per_engine`, after `max_age`, and at once after anything that
//! taints it (timeout, kill, crash, protocol error); otherwise it is recycled — the
//! health check — before it is leased again. Idle instances past `idle_timeout` are
//! reaped down to `min_idle`. Consecutive creation failures open a circuit breaker:
//! the pool reports itself degraded with the cause and refuses fast until a backoff
//! passes.
//!
//! Pools live on the supervisor's arbiter; their counts are read by stats and gauges
//! from other threads and are eventually consistent.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use actix::prelude::*;
use paddock_core::{CancelToken, Engine, EngineName, Error, ErrorCode, NetworkPolicy, Sandbox, SandboxSpec};
use serde::Serialize;

use crate::PoolConfig;

use crate::engine_actor::{DestroyInstance, EngineActor, Recycle};
use crate::slots::{Acquire, Slots, Waiter};
use paddock_telemetry::{labels, PoolGaugeSource, PoolSnapshot, Telemetry};

/// One pooled instance.
#[derive(Debug)]
pub(crate) struct Instance {
    pub(crate) actor: Addr<EngineActor>,
    pub(crate) sandbox: Arc<dyn Sandbox>,
    /// Set when an engine method panicked on it: it is retired, never reused.
    pub(crate) tainted: Arc<std::sync::atomic::AtomicBool>,
    pub(crate) created: Instant,
    pub(crate) last_used: Instant,
    pub(crate) executions: u64,
}

#[derive(Debug, Default)]
struct Breaker {
    consecutive_failures: u32,
    open_until: Option<Instant>,
    backoff: Duration,
    last_error: Option<Error>,
}

/// Counters of one pool, for stats.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct PoolStats {
    /// The engine.
    pub engine: EngineName,
    /// The network policy the pool's instances enforce.
    pub network: String,
    /// Instances that exist or are being created.
    pub size: usize,
    /// Ready instances.
    pub idle: usize,
    /// Leased instances.
    pub busy: usize,
    /// Instances being created.
    pub creating: usize,
    /// Queued callers.
    pub waiting: usize,
    /// Largest size.
    pub max_size: usize,
    /// Whether the circuit breaker is open.
    pub degraded: bool,
    /// The last creation error, while degraded.
    pub degraded_cause: Option<String>,
    /// Instances created so far.
    pub created_total: u64,
    /// Instances retired so far.
    pub retired_total: u64,
    /// Retired instances whose destruction is still running, and instances whose
    /// creation outlived the caller who asked for it (destroyed once made).
    pub destroying: usize,
    /// Creation failures so far.
    pub create_failures_total: u64,
    /// The disk quota its instances were made with, when an execution asked for
    /// one of its own (`limits.disk_bytes` / `disk_files`); unset: the default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// See `disk_bytes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_files: Option<u64>,
}

/// The disk limits an execution asked for itself: a sandbox's filesystem is made
/// with it, so executions that ask for different ones run in pools of their own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) struct DiskKey {
    pub(crate) bytes: Option<u64>,
    pub(crate) files: Option<u64>,
}

impl DiskKey {
    /// The disk limits `limits` sets.
    pub(crate) fn of(limits: &paddock_core::Limits) -> DiskKey {
        DiskKey {
            bytes: limits.disk_bytes,
            files: limits.disk_files,
        }
    }

    /// Whether the engine's defaults apply.
    pub(crate) fn is_default(&self) -> bool {
        self.bytes.is_none() && self.files.is_none()
    }
}

/// How a lease ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// Clean: recycle and reuse.
    Reuse,
    /// Tainted: retire now.
    Retire,
}

/// The pool.
#[derive(Debug)]
pub(crate) struct EnginePool {
    pub(crate) kind: EngineName,
    pub(crate) network: NetworkPolicy,
    engine: Arc<dyn Engine>,
    spec: SandboxSpec,
    pub(crate) config: PoolConfig,
    slots: Slots<Instance>,
    breaker: parking_lot::Mutex<Breaker>,
    telemetry: Telemetry,
    created_total: std::sync::atomic::AtomicU64,
    retired_total: std::sync::atomic::AtomicU64,
    /// Destructions spawned and not yet finished.
    destroying: Arc<std::sync::atomic::AtomicUsize>,
    create_failures_total: std::sync::atomic::AtomicU64,
    /// When the scheduler last routed work to it.
    touched: parking_lot::Mutex<std::time::Instant>,
    /// Recent demand, which sets how many instances are kept idle.
    demand: parking_lot::Mutex<Demand>,
}

/// How many instances were in use at once lately: the pool keeps as many idle (up to
/// `burst_idle_max`), so that the next burst like the last finds them ready.
#[derive(Debug)]
struct Demand {
    peak: usize,
    peak_at: Instant,
}

impl Demand {
    fn new() -> Demand {
        Demand {
            peak: 0,
            peak_at: Instant::now(),
        }
    }

    /// Notes a lease granted while `in_use` instances (its own included) were
    /// leased. Callers one after another need one or two (one serving, one being
    /// recycled); a burst of `k`, `k`.
    fn note(&mut self, in_use: usize, window: Duration) {
        let now = Instant::now();
        if in_use >= self.peak || now.duration_since(self.peak_at) >= window {
            self.peak = in_use;
            self.peak_at = now;
        }
    }

    /// The largest burst within `window`, 0 if none.
    fn recent_peak(&self, window: Duration) -> usize {
        if self.peak_at.elapsed() < window {
            self.peak
        } else {
            0
        }
    }
}

/// A leased instance. Dropping a lease without [`EnginePool::release`] retires the
/// instance (its execution was interrupted, so it is not trusted again), unless
/// [`Lease::reuse_on_drop`] said otherwise.
#[derive(Debug)]
pub(crate) struct Lease {
    pool: Arc<EnginePool>,
    instance: Option<Instance>,
    /// Set by [`Lease::reuse_on_drop`]: recycle rather than retire when dropped, and
    /// say when the instance is back in the pool (or gone).
    ending: parking_lot::Mutex<Option<Ending>>,
}

/// How a dropped lease ends: recycled for the next lease (`reuse`) or retired; `done`
/// hears when that has finished.
#[derive(Debug)]
struct Ending {
    reuse: bool,
    done: tokio::sync::oneshot::Sender<()>,
}

impl Lease {
    pub(crate) fn pool_config(&self) -> &PoolConfig {
        &self.pool.config
    }

    /// The engine of the pool the instance came from.
    pub(crate) fn engine(&self) -> &Arc<dyn Engine> {
        self.pool.engine()
    }

    pub(crate) fn instance(&self) -> &Instance {
        self.instance
            .as_ref()
            .expect("a lease holds its instance until released")
    }

    /// When dropped, the instance is recycled for the next lease (`reuse`: the
    /// engine returns it to a state fit for any tenant, as after an execution) or
    /// retired; `done` hears when the recycle or the teardown has finished.
    pub(crate) fn end_on_drop(&self, reuse: bool, done: tokio::sync::oneshot::Sender<()>) {
        *self.ending.lock() = Some(Ending { reuse, done });
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(inst) = self.instance.take() else {
            return;
        };
        match self.ending.lock().take() {
            Some(Ending { reuse: true, done }) => {
                self.pool.finish(inst, Release::Reuse, Some(done));
            }
            Some(Ending { reuse: false, done }) => self.pool.retire(inst, true, Some(done)),
            None => self.pool.retire(inst, true, None),
        }
    }
}

use std::sync::atomic::Ordering::Relaxed;

impl EnginePool {
    pub(crate) fn new(
        engine: Arc<dyn Engine>,
        network: NetworkPolicy,
        disk: DiskKey,
        home: Option<&str>,
        config: PoolConfig,
        telemetry: Telemetry,
    ) -> Arc<EnginePool> {
        let mut spec = SandboxSpec {
            level: engine.capabilities().max_level,
            network: network.clone(),
            home: home.map(String::from),
            ..SandboxSpec::default()
        };
        spec.limits.disk_bytes = disk.bytes;
        spec.limits.disk_files = disk.files;
        Arc::new(EnginePool {
            kind: engine.name(),
            network,
            engine,
            spec,
            slots: Slots::new(config.max_size, config.max_waiting),
            config,
            breaker: parking_lot::Mutex::new(Breaker::default()),
            telemetry,
            created_total: Default::default(),
            retired_total: Default::default(),
            destroying: Default::default(),
            create_failures_total: Default::default(),
            touched: parking_lot::Mutex::new(std::time::Instant::now()),
            demand: parking_lot::Mutex::new(Demand::new()),
        })
    }

    /// How many instances the pool keeps idle now: `min_idle`, or as many as were in
    /// use at once lately (within `idle_timeout_ms`), up to `burst_idle_max`; never
    /// more than `max_size`. Nothing with `min_idle = 0`.
    fn idle_target(&self) -> usize {
        let min = self.config.min_idle;
        if min == 0 {
            return 0;
        }
        let window = Duration::from_millis(self.config.idle_timeout_ms);
        let burst = self.demand.lock().recent_peak(window);
        min.max(burst.min(self.config.burst_idle_max))
            .min(self.slots.max_size())
    }

    /// Notes that work was routed to the pool now.
    pub(crate) fn touch(&self) {
        *self.touched.lock() = std::time::Instant::now();
    }

    /// How long ago work was last routed to the pool.
    pub(crate) fn idle_for(&self) -> std::time::Duration {
        self.touched.lock().elapsed()
    }

    pub(crate) fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    /// Whether the pool holds no instance and no caller waits on it.
    pub(crate) fn is_unused(&self) -> bool {
        let c = self.slots.counts();
        c.size() == 0 && c.waiting == 0
    }

    pub(crate) fn stats(&self) -> PoolStats {
        let c = self.slots.counts();
        let b = self.breaker.lock();
        let degraded = b.open_until.is_some();
        PoolStats {
            engine: self.kind.clone(),
            network: self.network.name().to_string(),
            size: c.size(),
            idle: c.idle,
            busy: c.busy,
            creating: c.creating,
            waiting: c.waiting,
            max_size: self.slots.max_size(),
            degraded,
            degraded_cause: if degraded {
                b.last_error.as_ref().map(|e| e.to_string())
            } else {
                None
            },
            created_total: self.created_total.load(Relaxed),
            retired_total: self.retired_total.load(Relaxed),
            destroying: self.destroying.load(Relaxed),
            create_failures_total: self.create_failures_total.load(Relaxed),
            disk_bytes: self.spec.limits.disk_bytes,
            disk_files: self.spec.limits.disk_files,
        }
    }

    /// `ENGINE_FAILED` naming the cause while the breaker is open.
    fn check_breaker(&self) -> Result<(), Error> {
        let b = self.breaker.lock();
        match b.open_until {
            Some(until) if Instant::now() < until => {
                let cause = b
                    .last_error
                    .as_ref()
                    .map_or_else(|| "unknown".to_string(), |e| e.to_string());
                Err(Error::new(
                    ErrorCode::EngineFailed,
                    format!(
                        "the {} pool is degraded: creating instances failed {} times in a row (last: {cause}); retrying in {} ms",
                        self.kind,
                        b.consecutive_failures,
                        until.saturating_duration_since(Instant::now()).as_millis()
                    ),
                )
                .with_retry_after_ms(until.saturating_duration_since(Instant::now()).as_millis() as u64))
            }
            _ => Ok(()),
        }
    }

    fn record_create(&self, result: &Result<Instance, Error>) {
        let mut b = self.breaker.lock();
        match result {
            Ok(_) => {
                self.created_total.fetch_add(1, Relaxed);
                *b = Breaker::default();
            }
            Err(e) => {
                self.create_failures_total.fetch_add(1, Relaxed);
                b.consecutive_failures += 1;
                b.last_error = Some(e.clone());
                if b.consecutive_failures >= self.config.failure_threshold {
                    b.backoff = if b.backoff.is_zero() {
                        Duration::from_millis(self.config.backoff_initial_ms)
                    } else {
                        (b.backoff * 2).min(Duration::from_millis(self.config.backoff_max_ms))
                    };
                    b.open_until = Some(Instant::now() + b.backoff);
                    tracing::warn!(engine = %self.kind, failures = b.consecutive_failures, error = %e, "pool degraded");
                }
            }
        }
    }

    async fn create_instance(&self) -> Result<Instance, Error> {
        let limit = Duration::from_millis(self.config.create_timeout_ms);
        let create = crate::creation::create(
            self.engine.clone(),
            self.spec.clone(),
            self.destroying.clone(),
        );
        let result = match tokio::time::timeout(limit, create).await {
            Ok(r) => r,
            Err(_) => Err(Error::new(
                ErrorCode::EngineFailed,
                format!(
                    "creating a {} instance took longer than {} ms",
                    self.kind,
                    limit.as_millis()
                ),
            )),
        }
        .map(|sandbox| {
            let now = Instant::now();
            let actor = EngineActor::new(sandbox.clone());
            let tainted = actor.tainted();
            Instance {
                actor: actor.start(),
                sandbox,
                tainted,
                created: now,
                last_used: now,
                executions: 0,
            }
        });
        self.record_create(&result);
        result
    }

    /// Leases an instance: idle, freshly created, or handed over after waiting.
    pub(crate) async fn acquire(self: &Arc<Self>, cancel: &CancelToken) -> Result<Lease, Error> {
        let result = self.acquire_inner(cancel).await;
        let label = match &result {
            Ok(_) => labels::acquire::OK,
            Err(e) if e.code == ErrorCode::PoolExhausted && e.message.starts_with("no ") => {
                labels::acquire::TIMEOUT
            }
            Err(e) if e.code == ErrorCode::PoolExhausted => labels::acquire::EXHAUSTED,
            Err(e) if e.code == ErrorCode::Cancelled => "cancelled",
            Err(_) => labels::acquire::FAILED,
        };
        self.telemetry
            .record_pool_acquisition(crate::pipeline::engine_label(&self.kind), label);
        result
    }

    async fn acquire_inner(self: &Arc<Self>, cancel: &CancelToken) -> Result<Lease, Error> {
        self.check_breaker()?;

        let max_age = Duration::from_millis(self.config.max_age_ms);
        let mut retired = Vec::new();
        let step = self
            .slots
            .acquire(|i| i.created.elapsed() < max_age, &mut retired);
        for inst in retired {
            self.destroy(inst, None);
        }
        let instance = match step {
            Acquire::Ready(inst) => inst,
            Acquire::Create => {
                let guard = CreateGuard {
                    pool: self,
                    armed: true,
                };
                let created = self.create_instance().await;
                let mut guard = guard;
                guard.armed = false;
                match created {
                    Ok(inst) => {
                        self.slots.created();
                        inst
                    }
                    Err(e) => {
                        if self.slots.create_failed() {
                            self.replenish();
                        }
                        return Err(e);
                    }
                }
            }
            Acquire::Wait(waiter) => {
                let wait = WaitFor {
                    pool: self,
                    waiter: Some(waiter),
                };
                let timeout = Duration::from_millis(self.config.acquire_timeout_ms);
                tokio::select! {
                    got = wait => match got {
                        Some(inst) => inst,
                        None => return Err(Error::new(ErrorCode::EngineDisposed, "the pool is shutting down; no new executions are accepted")),
                    },
                    _ = tokio::time::sleep(timeout) => {
                        return Err(self.exhausted(format!("no {} instance became free within {} ms", self.kind, timeout.as_millis())));
                    }
                    _ = cancel.cancelled() => {
                        return Err(Error::new(ErrorCode::Cancelled, "cancelled while waiting for an engine instance"));
                    }
                }
            }
            Acquire::Full => {
                if self.slots.is_closed() {
                    return Err(Error::new(
                        ErrorCode::EngineDisposed,
                        "the pool is shutting down; no new executions are accepted",
                    ));
                }
                return Err(self.exhausted(format!(
                    "all {} {} instances are busy and {} callers are already waiting",
                    self.slots.max_size(),
                    self.kind,
                    self.config.max_waiting
                )));
            }
        };
        // How many are leased now, this one included: the pool keeps as many ready
        // for the next burst, and refills now, not at the next maintenance tick.
        let busy = self.slots.counts().busy;
        self.demand
            .lock()
            .note(busy, Duration::from_millis(self.config.idle_timeout_ms));
        self.prewarm();
        // Outside the engine actor, so under a panic capture of its own: a panic
        // taints the instance (retired when the lease ends), as in the actor.
        let leased = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            instance.sandbox.leased();
        }));
        if leased.is_err() {
            tracing::warn!(engine = %self.kind, "an engine panicked in `leased`; its instance is retired after this lease");
            instance
                .tainted
                .store(true, std::sync::atomic::Ordering::Release);
        }
        Ok(Lease {
            pool: self.clone(),
            instance: Some(instance),
            ending: parking_lot::Mutex::new(None),
        })
    }

    fn exhausted(&self, why: String) -> Error {
        Error::new(
            ErrorCode::PoolExhausted,
            format!("{why}; retry later or raise pool.max_size / pool.acquire_timeout_ms"),
        )
        .with_retry_after_ms(100)
    }

    /// Ends a lease. A clean instance is recycled (in the background) and reused,
    /// unless it reached its execution or age limit.
    pub(crate) fn release(self: &Arc<Self>, mut lease: Lease, how: Release) {
        let Some(inst) = lease.instance.take() else {
            return;
        };
        self.finish(inst, how, None);
    }

    /// Ends the lease of `inst` as [`EnginePool::release`] does; `done` hears when
    /// the instance is back in the pool or gone.
    fn finish(
        self: &Arc<Self>,
        mut inst: Instance,
        how: Release,
        done: Option<tokio::sync::oneshot::Sender<()>>,
    ) {
        inst.executions += 1;
        inst.last_used = Instant::now();
        let worn_out = inst.executions >= self.config.max_executions_per_engine
            || inst.created.elapsed() >= Duration::from_millis(self.config.max_age_ms);
        let tainted = inst.tainted.load(std::sync::atomic::Ordering::Acquire);
        if how == Release::Retire || worn_out || tainted {
            self.retire(inst, how == Release::Retire || tainted, done);
            return;
        }
        let pool = self.clone();
        let limit = Duration::from_millis(self.config.recycle_timeout_ms);
        actix::spawn(async move {
            match tokio::time::timeout(limit, inst.actor.send(Recycle))
                .await
                .unwrap_or(Ok(Err(Error::new(
                    ErrorCode::EngineFailed,
                    format!("recycling took longer than {} ms", limit.as_millis()),
                )))) {
                Ok(Ok(())) => {
                    if let Some(inst) = pool.slots.release(inst) {
                        // Closed meanwhile.
                        pool.destroy(inst, done);
                    } else if let Some(done) = done {
                        let _ = done.send(());
                    }
                }
                Ok(Err(e)) => {
                    tracing::info!(engine = %pool.kind, error = %e, "recycle failed; retiring the instance");
                    pool.retire(inst, true, done);
                }
                Err(_) => pool.retire(inst, true, done),
            }
        });
    }

    /// Removes a leased instance for good and, if callers wait, creates a replacement.
    fn retire(
        self: &Arc<Self>,
        inst: Instance,
        tainted: bool,
        done: Option<tokio::sync::oneshot::Sender<()>>,
    ) {
        tracing::debug!(engine = %self.kind, tainted, executions = inst.executions, "retiring an instance");
        let waiters = self.slots.retire_busy();
        self.destroy(inst, done);
        if waiters {
            self.replenish();
        } else {
            self.prewarm();
        }
    }

    /// Destroys `inst` in the background; `done` hears when it is gone.
    fn destroy(&self, inst: Instance, done: Option<tokio::sync::oneshot::Sender<()>>) {
        self.retired_total.fetch_add(1, Relaxed);
        let actor = inst.actor.clone();
        let sandbox = inst.sandbox.clone();
        // Counted until done, so shutdown can wait for every destruction to finish.
        let destroying = self.destroying.clone();
        destroying.fetch_add(1, Relaxed);
        actix::spawn(async move {
            if actor.send(DestroyInstance).await.is_err() {
                let _ = sandbox.destroy().await;
            }
            destroying.fetch_sub(1, Relaxed);
            if let Some(done) = done {
                let _ = done.send(());
            }
        });
    }

    /// Creates an instance for a queued caller if there is room.
    fn replenish(self: &Arc<Self>) {
        if self.check_breaker().is_err() || !self.slots.reserve_for_waiter() {
            return;
        }
        let pool = self.clone();
        actix::spawn(async move {
            match pool.create_instance().await {
                Ok(inst) => {
                    if let Some(inst) = pool.slots.add_prewarmed(inst) {
                        pool.destroy(inst, None);
                    }
                }
                Err(_) => {
                    pool.slots.create_failed();
                }
            }
        });
    }

    /// Creates instances in the background until the idle target (`min_idle`, or
    /// the last burst's size: see `idle_target`) are idle or being created.
    pub(crate) fn prewarm(self: &Arc<Self>) {
        let target = self.idle_target();
        while self.check_breaker().is_ok() && self.slots.reserve_prewarm(target) {
            let pool = self.clone();
            actix::spawn(async move {
                match pool.create_instance().await {
                    Ok(inst) => {
                        if let Some(inst) = pool.slots.add_prewarmed(inst) {
                            pool.destroy(inst, None);
                        }
                    }
                    Err(e) => {
                        tracing::info!(engine = %pool.kind, error = %e, "prewarming failed");
                        pool.slots.create_failed();
                    }
                }
            });
        }
    }

    /// Reaps idle instances past `idle_timeout` (down to the idle target) or
    /// `max_age`, then tops the pool back up to the target.
    pub(crate) fn maintain(self: &Arc<Self>) {
        let idle_timeout = Duration::from_millis(self.config.idle_timeout_ms);
        let max_age = Duration::from_millis(self.config.max_age_ms);
        let reaped = self.slots.reap_idle(self.idle_target(), |i| {
            i.last_used.elapsed() >= idle_timeout || i.created.elapsed() >= max_age
        });
        for inst in reaped {
            self.destroy(inst, None);
        }
        self.prewarm();
    }

    /// Closes the pool and destroys its idle instances; leased ones are destroyed as
    /// they come back.
    pub(crate) fn close(&self) {
        for inst in self.slots.close() {
            self.destroy(inst, None);
        }
    }
}

/// Gives a reservation back if the creating caller goes away midway.
struct CreateGuard<'a> {
    pool: &'a EnginePool,
    armed: bool,
}

impl Drop for CreateGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.pool.slots.create_failed();
        }
    }
}

/// Waits to be handed an instance; aborting gives it back.
struct WaitFor<'a> {
    pool: &'a EnginePool,
    waiter: Option<Waiter<Instance>>,
}

impl Future for WaitFor<'_> {
    type Output = Option<Instance>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Instance>> {
        let Some(waiter) = self.waiter.as_ref() else {
            return Poll::Ready(None);
        };
        match self.pool.slots.poll_waiter(waiter, cx) {
            Poll::Ready(got) => {
                self.waiter = None;
                Poll::Ready(got)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for WaitFor<'_> {
    fn drop(&mut self) {
        if let Some(waiter) = self.waiter.take() {
            if let Some(inst) = self.pool.slots.abort_waiter(&waiter) {
                // The pool closed while the instance was handed over.
                self.pool.destroy(inst, None);
            }
        }
    }
}

/// Pool occupancy for the telemetry gauges, read at collection time.
#[derive(Debug)]
pub(crate) struct Gauges(pub(crate) std::sync::Weak<EnginePool>);

impl PoolGaugeSource for Gauges {
    fn snapshot(&self) -> PoolSnapshot {
        match self.0.upgrade() {
            Some(pool) => {
                let c = pool.slots.counts();
                PoolSnapshot {
                    size: c.size() as u64,
                    idle: c.idle as u64,
                    busy: c.busy as u64,
                    waiting: c.waiting as u64,
                }
            }
            None => PoolSnapshot::default(),
        }
    }
}
