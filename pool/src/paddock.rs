//! The `Paddock` handle: the scheduler for plain async Rust.
//!
//! [`Paddock::builder`] starts an actix system on its own thread with the supervisor,
//! limiter, streamer and audit actors, and returns a cloneable, `Send + Sync` handle
//! whose methods work from any tokio runtime.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use paddock_core::{
    Engine, EngineName, Error, ErrorCode, ExecRequest, ExecResult, ExecutionId, FileEntry,
    OutputChunk, PaddockConfig, SandboxSpec, SandboxStatus,
};

use crate::audit::{
    Audit, AuditConfig, AuditEntry, AuditLog, AuditQuery, AuditStats, OperatorAccess,
};
use crate::caller::Caller;
use crate::clock::SystemClock;
use crate::limiter::{Limiter, LimiterConfig, LimiterCore};
use crate::messages::*;
use crate::policy::{Policy, PolicyConfig};
use crate::shares::Shares;
use crate::streamer::{CloseStream, Streamer, StreamerConfig, Subscribe, Subscription};
use crate::supervisor::{access_record, cancel_running, Shared, Supervisor, SupervisorParts};
use paddock_telemetry::Telemetry;

/// The engines to run, by name: the built-ins the config enables that neither
/// `without` nor a registered engine of the same name displaces, then the registered
/// ones; and the default engine.
fn register_engines(
    config: &PaddockConfig,
    registered: Vec<Arc<dyn Engine>>,
    without: &[EngineName],
    default_engine: Option<EngineName>,
) -> Result<(Vec<Arc<dyn Engine>>, EngineName), Error> {
    let mut names = std::collections::BTreeSet::new();
    for engine in &registered {
        if !names.insert(engine.name()) {
            return Err(Error::invalid_config(
                "engines",
                format!(
                    "two engines are registered as `{}`; give each engine its own name",
                    engine.name()
                ),
            ));
        }
    }
    let first_registered = registered.first().map(|e| e.name());
    let builtin = paddock_engines::builtin(config, |name| {
        !without.contains(name) && !names.contains(name)
    })?;
    let first_builtin = builtin.engines.first().map(|e| e.name());
    let mut engines = builtin.engines;
    engines.extend(registered);
    let Some(first) = first_registered.or(first_builtin) else {
        if !builtin.unavailable.is_empty() {
            let why: Vec<&str> = builtin
                .unavailable
                .iter()
                .map(|(_, why)| why.as_str())
                .collect();
            return Err(Error::new(
                ErrorCode::EngineFailed,
                format!(
                    "no engine can run: {}; run `paddock doctor`",
                    why.join("; ")
                ),
            ));
        }
        return Err(Error::invalid_config(
            "engines",
            "no engine is enabled; enable the subprocess engine or add one",
        ));
    };
    let has = |name: &EngineName| engines.iter().any(|e| e.name() == *name);
    let default_engine = match default_engine {
        Some(name) if !has(&name) => {
            return Err(Error::invalid_config(
                "default_engine",
                format!("`{name}` is not among the configured engines"),
            ))
        }
        Some(name) => name,
        None if has(&EngineName::SUBPROCESS) => EngineName::SUBPROCESS,
        None => first,
    };
    Ok((engines, default_engine))
}

/// Configures and starts Paddock.
#[must_use]
pub struct PaddockBuilder {
    config: PaddockConfig,
    engines: Vec<Arc<dyn Engine>>,
    default_engine: Option<EngineName>,
    without: Vec<EngineName>,
    policy: Option<PolicyConfig>,
    limiter: Option<LimiterConfig>,
    audit: Option<AuditConfig>,
    on_audit: Option<crate::audit::OnLog>,
    streamer: StreamerConfig,
    telemetry: Option<Telemetry>,
    spin: Duration,
    access: Option<paddock_core::AccessRules>,
}

impl std::fmt::Debug for PaddockBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PaddockBuilder")
            .field("config", &self.config)
            .field("engines", &self.engines)
            .finish_non_exhaustive()
    }
}

impl Default for PaddockBuilder {
    fn default() -> Self {
        PaddockBuilder {
            config: PaddockConfig::default(),
            engines: Vec::new(),
            default_engine: None,
            without: Vec::new(),
            policy: None,
            limiter: None,
            audit: None,
            on_audit: None,
            streamer: StreamerConfig::default(),
            telemetry: None,
            spin: Duration::from_micros(200),
            access: None,
        }
    }
}

impl PaddockBuilder {
    /// The configuration (limits, pool sizing, the subprocess engine). Default: the
    /// embedded defaults.
    pub fn config(mut self, config: PaddockConfig) -> Self {
        self.config = config;
        self
    }

    /// Registers an engine under its [`name`](Engine::name). Requests choose it by
    /// that name (`"engine": "<name>"`), and its pools, metrics and audit entries
    /// carry it.
    ///
    /// The built-in engines (`subprocess`, `isolate`, `container`) are ordinary
    /// entries, made from the config by [`paddock_engines::builtin`] unless the config
    /// disables them or [`without`](Self::without) names them. An engine registered
    /// here under a built-in name takes that name's place: to give isolates Rust host
    /// functions, register an `IsolateEngine::with_modules(…)`. Two engines registered
    /// under one name are refused at [`start`](Self::start) with `INVALID_CONFIG`.
    pub fn engine(mut self, engine: Arc<dyn Engine>) -> Self {
        self.engines.push(engine);
        self
    }

    /// Does not make the built-in engine `name`.
    pub fn without(mut self, name: EngineName) -> Self {
        self.without.push(name);
        self
    }

    /// Does not start the built-in subprocess engine.
    pub fn without_subprocess(self) -> Self {
        self.without(EngineName::SUBPROCESS)
    }

    /// Does not start the built-in QuickJS isolate engine.
    pub fn without_isolate(self) -> Self {
        self.without(EngineName::ISOLATE)
    }

    /// Does not start the built-in OCI container engine. (Without this, the engine is
    /// started when the config enables it and the host has a runtime that can run a
    /// container; a host without one runs without it, and `paddock doctor` says why.)
    pub fn without_container(self) -> Self {
        self.without(EngineName::CONTAINER)
    }

    /// The engine used when a request names none and the engine provides the
    /// requested isolation level (otherwise the engine with the weakest level that
    /// provides it is chosen). Default: `subprocess` when it is registered, else the
    /// first engine registered with [`engine`](Self::engine), else the first built-in.
    pub fn default_engine(mut self, kind: EngineName) -> Self {
        self.default_engine = Some(kind);
        self
    }

    /// Policy rules. Default: the config's `[policy]` section (the built-in rules and
    /// a 100,000-character cap).
    pub fn policy(mut self, policy: PolicyConfig) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Rate and concurrency limits. Default: the config's `[limiter]` section (no
    /// limits).
    pub fn limiter(mut self, limiter: LimiterConfig) -> Self {
        self.limiter = Some(limiter);
        self
    }

    /// The audit log. Default: the config's `[audit]` section (an in-memory ring of
    /// 10,000 entries, no file).
    pub fn audit(mut self, audit: AuditConfig) -> Self {
        self.audit = Some(audit);
        self
    }

    /// A callback invoked once for every audit entry.
    pub fn on_audit(mut self, f: impl Fn(&AuditEntry) + Send + Sync + 'static) -> Self {
        self.on_audit = Some(Arc::new(f));
        self
    }

    /// Output streaming buffers.
    pub fn streamer(mut self, streamer: StreamerConfig) -> Self {
        self.streamer = streamer;
        self
    }

    /// The telemetry handle the scheduler records into. Default: a Prometheus
    /// exporter (render it with [`Paddock::telemetry`]).
    pub fn telemetry(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = Some(telemetry);
        self
    }

    /// Which isolation levels and network policies each tenant may use. Default: the
    /// config's `[server]` rules (`ServerConfig::access_rules`): everything without
    /// API keys; with them, every level but `none` and every network but
    /// `unrestricted`, unless the operator allows them.
    pub fn access(mut self, rules: paddock_core::AccessRules) -> Self {
        self.access = Some(rules);
        self
    }

    /// How long a call through the handle polls for its answer before parking, while
    /// recent answers came back within that time (see `spin.rs`). Default 200 µs;
    /// zero turns it off.
    pub fn spin_before_park(mut self, budget: Duration) -> Self {
        self.spin = budget;
        self
    }

    /// Validates everything, starts the actors on their own thread and returns the
    /// handle.
    pub fn start(self) -> Result<Paddock, Error> {
        self.config.validate()?;
        let limiter = self.limiter.unwrap_or_else(|| self.config.limiter.clone());
        limiter.validate()?;
        let audit = self.audit.unwrap_or_else(|| self.config.audit.clone());
        audit.validate()?;
        let policy = Arc::new(Policy::new(
            self.policy.unwrap_or_else(|| self.config.policy.clone()),
        )?);
        let (engines, default_engine) = register_engines(
            &self.config,
            self.engines,
            &self.without,
            self.default_engine,
        )?;
        let mut names: Vec<EngineName> = engines.iter().map(|e| e.name()).collect();
        names.sort_unstable();
        let names: Arc<[EngineName]> = names.into();
        let mut audit_log = AuditLog::new(audit)?;
        if let Some(cb) = self.on_audit {
            audit_log.set_on_log(cb);
        }
        let shares = Shares::new(&limiter);
        let limiter_core = LimiterCore::new(limiter, Arc::new(SystemClock))?;
        let shared = Arc::new(Shared::default());
        let parts_shared = shared.clone();
        let pool_config = self.config.pool.clone();
        let defaults = self.config.limits.effective_defaults();
        let ceilings = self.config.limits.ceilings();
        let access = self
            .access
            .unwrap_or_else(|| self.config.server.access_rules());
        let parts_access = access.clone();
        let access = Arc::new(access);

        let streamer_config = self.streamer;
        let self_spin = self.spin.min(Duration::from_millis(1));
        let telemetry = match self.telemetry {
            Some(t) => t,
            None => Telemetry::prometheus()
                .map_err(|e| Error::new(ErrorCode::InvalidConfig, format!("telemetry: {e}")))?,
        };
        let parts_telemetry = telemetry.clone();

        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("paddock-actors".into())
            .spawn(move || {
                let system = actix::System::new();
                system.block_on(async move {
                    let limiter = Limiter::new(limiter_core).start();
                    let audit = Audit::new(audit_log).start();
                    let streamer = Streamer::new(streamer_config).start();
                    let supervisor = Supervisor::from_parts(SupervisorParts {
                        engines,
                        default_engine,
                        pool_config,
                        defaults,
                        policy,
                        limiter,
                        audit: audit.clone(),
                        streamer: streamer.clone(),
                        shared: parts_shared,
                        telemetry: parts_telemetry,
                        ceilings,
                        access: parts_access,
                        shares,
                    })
                    .start();
                    let _ = tx.send((
                        supervisor,
                        streamer,
                        audit.clone(),
                        actix::System::current(),
                        actix::Arbiter::current(),
                    ));
                });
                let _ = system.run();
            })
            .map_err(|e| Error::engine_io("starting the actor thread", e))?;
        let (supervisor, streamer, audit, system, arbiter) = rx
            .recv()
            .map_err(|_| Error::new(ErrorCode::EngineFailed, "the actor thread failed to start"))?;
        Ok(Paddock {
            supervisor,
            streamer,
            audit,
            shared,
            access,
            telemetry,
            engines: names,
            runtime: Arc::new(RuntimeHandle {
                spin: paddock_core::spin::Spin::new(self_spin),
                system,
                arbiter,
                thread: parking_lot::Mutex::new(Some(thread)),
            }),
        })
    }
}

#[derive(Debug)]
struct RuntimeHandle {
    spin: paddock_core::spin::Spin,
    system: actix::System,
    arbiter: actix::ArbiterHandle,
    thread: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// A handle on a running Paddock. Cheap to clone, `Send + Sync`, usable from any tokio
/// runtime.
#[derive(Debug, Clone)]
pub struct Paddock {
    supervisor: Addr<Supervisor>,
    streamer: Addr<Streamer>,
    audit: Addr<Audit>,
    shared: Arc<Shared>,
    telemetry: Telemetry,
    access: Arc<paddock_core::AccessRules>,
    engines: Arc<[EngineName]>,
    runtime: Arc<RuntimeHandle>,
}

fn gone(e: MailboxError) -> Error {
    Error::new(
        ErrorCode::EngineDisposed,
        format!("Paddock is not running ({e}); start a new instance"),
    )
}

impl Paddock {
    /// A builder with the embedded defaults.
    pub fn builder() -> PaddockBuilder {
        PaddockBuilder::default()
    }

    /// The supervisor's address, for actix actors that drive Paddock by messages.
    pub fn supervisor(&self) -> Addr<Supervisor> {
        self.supervisor.clone()
    }

    /// The arbiter the supervisor runs on. An actor started there
    /// (`MyActor::start_in_arbiter(&paddock.arbiter(), ...)`) talks to the supervisor
    /// without a thread hand-off.
    pub fn arbiter(&self) -> actix::ArbiterHandle {
        self.runtime.arbiter.clone()
    }

    /// Which isolation levels and network policies each tenant may use.
    pub fn access_rules(&self) -> &paddock_core::AccessRules {
        &self.access
    }

    /// The names of the engines this instance runs, sorted: requests may choose any
    /// of them.
    pub fn engines(&self) -> &[EngineName] {
        &self.engines
    }

    /// The telemetry handle (metrics in Prometheus text with `render_prometheus`).
    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    /// Runs one execution on the default engine.
    pub async fn execute(&self, request: ExecRequest) -> Result<ExecResult, Error> {
        self.execute_with(Execute::new(request)).await
    }

    /// Runs one execution with full control over engine, level and network.
    pub async fn execute_with(&self, msg: Execute) -> Result<ExecResult, Error> {
        self.runtime
            .spin
            .run(self.supervisor.send(msg))
            .await
            .map_err(gone)?
    }

    /// Runs one execution and streams its output: chunks as they are produced, then
    /// the final result.
    pub async fn execute_stream(&self, msg: Execute) -> Result<ExecutionStream, Error> {
        let subscription = self
            .streamer
            .send(Subscribe(msg.request.id.clone()))
            .await
            .map_err(gone)??;
        let supervisor = self.supervisor.clone();
        let streamer = self.streamer.clone();
        let id = msg.request.id.clone();
        let result: PendingResult = Box::pin(async move {
            let r = supervisor.send(msg).await.map_err(gone)?;
            if r.is_err() {
                // Refused before it ran: nothing else will close the stream we opened.
                let _ = streamer.send(CloseStream(id)).await;
            }
            r
        });
        Ok(ExecutionStream {
            subscription: Some(subscription),
            result: Some(result),
            finished: None,
        })
    }

    /// Subscribes to an execution's output by id: before it starts (nothing is missed)
    /// or late (what is still buffered). The subscription ends when the output does.
    pub async fn subscribe(&self, id: ExecutionId) -> Result<Subscription, Error> {
        self.streamer.send(Subscribe(id)).await.map_err(gone)?
    }

    /// Cancels a queued or running execution on behalf of `caller`. Returns whether
    /// this call cancelled it: `false` for an unknown or finished id, and for another
    /// tenant's execution, which is left running.
    pub fn cancel(&self, caller: &Caller, id: &ExecutionId) -> bool {
        let cancelled = cancel_running(&self.shared, caller, id);
        self.note_operator(caller, "execution.cancel", Some(id.to_string()));
        cancelled
    }

    /// Whether `caller` may see an execution accounted to `owner`. Surfaces that keep
    /// results of their own (the HTTP API's result store) use it so that their
    /// lookups by id follow the same rule as the facade's; an operator's look at
    /// another tenant's execution is recorded.
    pub fn may_see(&self, caller: &Caller, owner: Option<&str>, id: &ExecutionId) -> bool {
        if !caller.sees(owner) {
            return false;
        }
        self.note_operator(caller, "execution.get", Some(id.to_string()));
        true
    }

    /// Records an operator's use of its key, on the actors' arbiter.
    fn note_operator(&self, caller: &Caller, action: &str, target: Option<String>) {
        if let Some(record) = access_record(caller, action, target) {
            let audit = self.audit.clone();
            self.runtime.arbiter.spawn(async move {
                let _ = audit.send(record).await;
            });
        }
    }

    /// The tenant of a queued or running execution, when `caller` may see it.
    pub fn running_tenant(&self, caller: &Caller, id: &ExecutionId) -> Option<Option<String>> {
        let r = self.shared.running.get(id)?;
        caller.sees(r.tenant.as_deref()).then(|| r.tenant.clone())
    }

    /// An open sandbox by id, on behalf of `caller`: another tenant's is `NOT_FOUND`,
    /// exactly like an id that never existed; one of the caller's that was destroyed
    /// is `ENGINE_DISPOSED`.
    pub async fn sandbox(&self, caller: &Caller, id: &str) -> Result<SandboxHandle, Error> {
        self.sandbox_for(caller, id, "sandbox.access").await
    }

    /// [`sandbox`](Self::sandbox), naming what the caller is about to do with it
    /// (`sandbox.exec`, `sandbox.files.read`, …) for the record of an operator's uses.
    pub async fn sandbox_for(
        &self,
        caller: &Caller,
        id: &str,
        action: &'static str,
    ) -> Result<SandboxHandle, Error> {
        let info = self
            .supervisor
            .send(GetSandbox {
                caller: caller.clone(),
                id: id.to_string(),
                action,
            })
            .await
            .map_err(gone)??;
        Ok(SandboxHandle {
            paddock: self.clone(),
            info,
            caller: caller.clone(),
        })
    }

    /// Opens a sandbox session on the default engine (or `engine`).
    pub async fn open_sandbox(
        &self,
        spec: SandboxSpec,
        engine: Option<EngineName>,
    ) -> Result<SandboxHandle, Error> {
        let info = self
            .supervisor
            .send(OpenSandbox {
                engine,
                spec: spec.clone(),
            })
            .await
            .map_err(gone)??;
        Ok(SandboxHandle {
            paddock: self.clone(),
            info,
            caller: Caller::Tenant(spec.tenant),
        })
    }

    /// Searches the audit log (newest first) on behalf of `caller`: a tenant gets
    /// only its own entries, whatever `query.tenant` says.
    pub async fn audit(
        &self,
        caller: &Caller,
        query: AuditQuery,
    ) -> Result<Vec<AuditEntry>, Error> {
        self.supervisor
            .send(SearchAudit {
                caller: caller.clone(),
                query,
            })
            .await
            .map_err(gone)
    }

    /// Audit statistics as `caller` may see them (a tenant's cover its own entries
    /// still in the ring).
    pub async fn audit_statistics(&self, caller: &Caller) -> Result<AuditStats, Error> {
        self.supervisor
            .send(AuditStatistics {
                caller: caller.clone(),
            })
            .await
            .map_err(gone)
    }

    /// The most recent uses of operator keys (operators and the embedder only).
    pub async fn operator_accesses(
        &self,
        caller: &Caller,
        limit: usize,
    ) -> Result<Vec<OperatorAccess>, Error> {
        self.supervisor
            .send(OperatorAccesses {
                caller: caller.clone(),
                limit,
            })
            .await
            .map_err(gone)?
    }

    /// Scheduler statistics: every tenant's, for the embedder.
    pub async fn stats(&self) -> Result<Stats, Error> {
        self.stats_for(&Caller::Embedder).await
    }

    /// Scheduler statistics as `caller` may see them: a tenant gets the pools'
    /// sizes and its own figures.
    pub async fn stats_for(&self, caller: &Caller) -> Result<Stats, Error> {
        self.supervisor
            .send(GetStats {
                caller: caller.clone(),
            })
            .await
            .map_err(gone)
    }

    /// Graceful shutdown: stop admitting, drain in-flight executions for up to
    /// `drain`, cancel the rest, destroy every engine instance and session, flush the
    /// audit log, and stop the actor thread.
    pub async fn shutdown(&self, drain: Duration) -> Result<ShutdownReport, Error> {
        let report = self
            .supervisor
            .send(Shutdown { drain })
            .await
            .map_err(gone)?;
        // Let instance destruction (spawned on the arbiter) finish before stopping:
        // stopping drops what is still running, workdirs and all.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let stats = self.stats().await?;
            let done = stats.pools.iter().all(|p| p.size == 0 && p.destroying == 0);
            if done || std::time::Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.runtime.system.stop();
        let thread = self.runtime.thread.lock().take();
        if let Some(t) = thread {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        Ok(report)
    }
}

type PendingResult = Pin<Box<dyn Future<Output = Result<ExecResult, Error>> + Send>>;

/// Output of a streamed execution, then its result.
pub struct ExecutionStream {
    subscription: Option<Subscription>,
    result: Option<PendingResult>,
    finished: Option<Result<ExecResult, Error>>,
}

impl std::fmt::Debug for ExecutionStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutionStream").finish_non_exhaustive()
    }
}

/// One item of an [`ExecutionStream`].
#[derive(Debug)]
pub enum StreamEvent {
    /// Output as it was produced.
    Output(OutputChunk),
    /// The final result; the stream ends after it.
    Finished(Box<Result<ExecResult, Error>>),
}

impl ExecutionStream {
    /// A stream over an existing subscription and the execution's pending answer.
    pub(crate) fn from_parts(subscription: Subscription, result: PendingResult) -> ExecutionStream {
        ExecutionStream {
            subscription: Some(subscription),
            result: Some(result),
            finished: None,
        }
    }

    /// The next event, or `None` after [`StreamEvent::Finished`].
    pub async fn next(&mut self) -> Option<StreamEvent> {
        loop {
            if let Some(sub) = self.subscription.as_mut() {
                match self.result.as_mut() {
                    Some(result) => {
                        tokio::select! {
                            chunk = sub.next() => match chunk {
                                Some(c) => return Some(StreamEvent::Output(c)),
                                None => self.subscription = None,
                            },
                            r = result => {
                                self.result = None;
                                if r.is_err() {
                                    // A refusal produces no output: end now.
                                    self.subscription = None;
                                }
                                self.finished = Some(r);
                            }
                        }
                    }
                    None => match sub.next().await {
                        Some(c) => return Some(StreamEvent::Output(c)),
                        None => self.subscription = None,
                    },
                }
                continue;
            }
            if let Some(r) = self.finished.take() {
                return Some(StreamEvent::Finished(Box::new(r)));
            }
            if let Some(result) = self.result.take() {
                return Some(StreamEvent::Finished(Box::new(result.await)));
            }
            return None;
        }
    }
}

/// A sandbox session, opened with [`Paddock::open_sandbox`] or looked up with
/// [`Paddock::sandbox`]. Every call through it runs on behalf of the caller it was
/// obtained for (the tenant it was opened for): the supervisor checks that caller
/// again on each call.
#[derive(Debug, Clone)]
pub struct SandboxHandle {
    paddock: Paddock,
    info: SandboxInfo,
    caller: Caller,
}

impl SandboxHandle {
    /// The session id.
    pub fn id(&self) -> &str {
        &self.info.id
    }

    /// The session's description as opened.
    pub fn info(&self) -> &SandboxInfo {
        &self.info
    }

    /// Runs an execution in the session.
    pub async fn exec(&self, request: ExecRequest) -> Result<ExecResult, Error> {
        self.paddock
            .supervisor
            .send(SandboxExec {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                request,
                sink: None,
            })
            .await
            .map_err(gone)?
    }

    /// Runs an execution in the session and streams its output: chunks as they are
    /// produced, then the result.
    pub async fn exec_stream(&self, request: ExecRequest) -> Result<ExecutionStream, Error> {
        let subscription = self
            .paddock
            .streamer
            .send(Subscribe(request.id.clone()))
            .await
            .map_err(gone)??;
        let supervisor = self.paddock.supervisor.clone();
        let streamer = self.paddock.streamer.clone();
        let id = request.id.clone();
        let msg = SandboxExec {
            caller: self.caller.clone(),
            sandbox: self.info.id.clone(),
            request,
            sink: None,
        };
        let result: PendingResult = Box::pin(async move {
            let r = supervisor.send(msg).await.map_err(gone)?;
            if r.is_err() {
                // Refused before it ran: nothing else will close the stream we opened.
                let _ = streamer.send(CloseStream(id)).await;
            }
            r
        });
        Ok(ExecutionStream::from_parts(subscription, result))
    }

    /// Writes a file, creating parent directories.
    pub async fn write_file(&self, path: &str, data: &[u8]) -> Result<(), Error> {
        self.paddock
            .supervisor
            .send(WriteFile {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                path: path.into(),
                data: data.to_vec(),
            })
            .await
            .map_err(gone)?
    }

    /// Reads a file.
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>, Error> {
        self.paddock
            .supervisor
            .send(ReadFile {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                path: path.into(),
            })
            .await
            .map_err(gone)?
    }

    /// Opens a file for a streaming read: its size and its bytes, through one bounded
    /// buffer whatever the size (engines that stream; others read it whole).
    pub async fn open_read(&self, path: &str) -> Result<paddock_core::FileReader, Error> {
        self.paddock
            .supervisor
            .send(OpenRead {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                path: path.into(),
            })
            .await
            .map_err(gone)?
    }

    /// Writes a file from `source`, taking at most `max_bytes` (`LIMITS_EXCEEDED`
    /// beyond, and no file is left); returns the bytes written.
    pub async fn write_from(
        &self,
        path: &str,
        source: paddock_core::ByteSource,
        max_bytes: u64,
    ) -> Result<u64, Error> {
        self.paddock
            .supervisor
            .send(WriteFrom {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                path: path.into(),
                source,
                max_bytes,
            })
            .await
            .map_err(gone)?
    }

    /// Lists a directory (absolute paths with sizes; missing lists as empty).
    pub async fn list_files(&self, path: &str) -> Result<Vec<FileEntry>, Error> {
        self.paddock
            .supervisor
            .send(ListFiles {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                path: path.into(),
            })
            .await
            .map_err(gone)?
    }

    /// Freezes the session's processes in place until [`unpause`](Self::unpause);
    /// executions are refused with `SANDBOX_PAUSED` meanwhile. Engines without the
    /// `pause` feature answer `CAPABILITY_NOT_SUPPORTED`.
    pub async fn pause(&self) -> Result<(), Error> {
        self.paddock
            .supervisor
            .send(PauseSandbox {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
            })
            .await
            .map_err(gone)?
    }

    /// Thaws a paused session.
    pub async fn unpause(&self) -> Result<(), Error> {
        self.paddock
            .supervisor
            .send(UnpauseSandbox {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
            })
            .await
            .map_err(gone)?
    }

    /// Starts a background process that outlives the call (engines with the
    /// `process` feature). The policy checks its command; it is audited when it ends;
    /// destroying the session kills it.
    pub async fn start_process(
        &self,
        spec: paddock_core::ProcessSpec,
    ) -> Result<crate::messages::Started, Error> {
        self.paddock
            .supervisor
            .send(StartProcess {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                spec,
            })
            .await
            .map_err(gone)?
    }

    /// Opens a terminal (engines with the `terminal` feature); as
    /// [`start_process`](Self::start_process) otherwise.
    pub async fn open_terminal(
        &self,
        spec: paddock_core::TerminalSpec,
    ) -> Result<crate::messages::Started, Error> {
        self.paddock
            .supervisor
            .send(OpenTerminal {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                spec,
            })
            .await
            .map_err(gone)?
    }

    /// Opens a TCP stream to a service on the guest's loopback (engines with the
    /// `tcp` feature); other hosts are refused with `INVALID_OPTIONS`.
    pub async fn open_tcp_connection(
        &self,
        target: paddock_core::TcpTarget,
    ) -> Result<paddock_core::TcpConnection, Error> {
        self.paddock
            .supervisor
            .send(OpenTcpConnection {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                target,
            })
            .await
            .map_err(gone)?
    }

    /// A process or terminal of the session by id.
    pub async fn process(&self, id: &str) -> Result<crate::messages::Started, Error> {
        self.paddock
            .supervisor
            .send(GetProcess {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                process: id.into(),
            })
            .await
            .map_err(gone)?
    }

    /// The session's processes and terminals.
    pub async fn processes(&self) -> Result<Vec<crate::messages::ProcessInfo>, Error> {
        self.paddock
            .supervisor
            .send(ListProcesses {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
            })
            .await
            .map_err(gone)?
    }

    /// The session's status.
    pub async fn status(&self) -> Result<SandboxStatus, Error> {
        self.paddock
            .supervisor
            .send(GetSandboxStatus {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
            })
            .await
            .map_err(gone)?
    }

    /// Destroys the session. Idempotent; every later call is refused.
    pub async fn destroy(&self) -> Result<(), Error> {
        self.paddock
            .supervisor
            .send(DestroySandbox {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
            })
            .await
            .map_err(gone)?
    }
}
