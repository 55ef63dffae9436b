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
    EngineName, Error, ErrorCode, ExecRequest, ExecResult, ExecutionId, OutputChunk, SandboxSpec,
};

use crate::audit::{Audit, AuditEntry, AuditQuery, AuditStats, OperatorAccess};
use crate::caller::Caller;
use crate::federation::Federation;
use crate::messages::*;
use crate::streamer::{BufferSink, CloseStream, OpenStream, Streamer, Subscribe, Subscription};
use crate::supervisor::{access_record, cancel_running, Shared, Supervisor};
use paddock_telemetry::Telemetry;

mod builder;
mod handle;
mod registry;
mod sessions;

pub use builder::PaddockBuilder;
pub use handle::SandboxHandle;
pub use registry::{EngineRegistry, MadeEngines};

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
    capabilities: Arc<[(EngineName, paddock_core::Capabilities)]>,
    /// Engines the config enables that cannot run on this host, and why.
    unavailable: Arc<[(EngineName, String)]>,
    /// Whether pools keep ready instances (`pool.min_idle` > 0).
    prewarms: bool,
    /// `pool.max_size`: the most instances of one pool.
    max_pool_size: usize,
    /// The fleet one-shot executions are handed to, if any.
    federation: Option<Arc<dyn Federation>>,
    runtime: Arc<RuntimeHandle>,
}

fn gone(e: MailboxError) -> Error {
    Error::new(
        ErrorCode::EngineDisposed,
        format!("Paddock is not running ({e}); start a new instance"),
    )
}

impl Paddock {
    /// A builder with the embedded defaults and no engine but those registered with
    /// [`PaddockBuilder::engine`]. The `paddock` crate's `paddock::builder()` is this
    /// builder with the built-in engines' [registry](PaddockBuilder::registry).
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
    pub fn engines(&self) -> Vec<EngineName> {
        self.capabilities.iter().map(|(n, _)| n.clone()).collect()
    }

    /// What each engine this instance runs can do on this host, sorted by name: its
    /// strongest isolation level, the programs it runs, the network policies it
    /// enforces and the features it offers.
    pub fn capabilities(&self) -> &[(EngineName, paddock_core::Capabilities)] {
        &self.capabilities
    }

    /// The engines the configuration enables that cannot run on this host, each
    /// with why (a container engine without a usable OCI runtime, say). A request
    /// that names one is refused with `CAPABILITY_NOT_SUPPORTED` and that reason;
    /// none is ever replaced by a weaker engine.
    pub fn unavailable_engines(&self) -> &[(EngineName, String)] {
        &self.unavailable
    }

    /// Whether the engines' pools keep instances ready before they are asked for
    /// (`pool.min_idle` above 0).
    pub fn prewarms(&self) -> bool {
        self.prewarms
    }

    /// The most instances one engine's pool holds (`pool.max_size`).
    pub fn max_pool_size(&self) -> usize {
        self.max_pool_size
    }

    /// The engine a request would run on: `engine` when named, else the one this
    /// node chooses for `level`, the kind of program (`None`: a sandbox) and
    /// `tenant`; or why no engine can take it.
    pub async fn choose_engine(
        &self,
        engine: Option<EngineName>,
        level: paddock_core::IsolationLevel,
        program: Option<paddock_core::ProgramKind>,
        tenant: Option<String>,
    ) -> Result<EngineName, Error> {
        self.supervisor
            .send(ChooseEngine {
                engine,
                level,
                program,
                tenant,
            })
            .await
            .map_err(gone)?
    }

    /// Checks `msg` as this node's scheduler would before running it, without
    /// running it: the engine it would run on, or the refusal it would get (see
    /// [`CheckAdmission`]).
    pub async fn check_admission(&self, msg: &Execute) -> Result<EngineName, Error> {
        self.supervisor
            .send(CheckAdmission(msg.clone()))
            .await
            .map_err(gone)?
    }

    /// The telemetry handle (metrics in Prometheus text with `render_prometheus`).
    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    /// This handle, handing its one-shot executions (and their lookups, cancels and
    /// the audit search) to `federation`, which may run them on other nodes.
    /// Sessions, statistics and everything else stay on this node.
    pub fn federated(&self, federation: Arc<dyn Federation>) -> Paddock {
        let mut p = self.clone();
        p.federation = Some(federation);
        p
    }

    /// The federation this handle hands its one-shot executions to, if any.
    pub fn federation(&self) -> Option<&Arc<dyn Federation>> {
        self.federation.as_ref()
    }

    /// This handle without its federation: everything runs on this node (what a
    /// fleet node uses to run the work it took).
    pub fn local(&self) -> Paddock {
        let mut p = self.clone();
        p.federation = None;
        p
    }

    /// Runs one execution on the default engine.
    pub async fn execute(&self, request: ExecRequest) -> Result<ExecResult, Error> {
        self.execute_with(Execute::new(request)).await
    }

    /// Runs one execution with full control over engine, level and network.
    pub async fn execute_with(&self, msg: Execute) -> Result<ExecResult, Error> {
        if let Some(f) = &self.federation {
            return f.execute(msg, None).await;
        }
        self.runtime
            .spin
            .run(self.supervisor.send(msg))
            .await
            .map_err(gone)?
    }

    /// Runs one execution and streams its output: chunks as they are produced, then
    /// the final result.
    ///
    /// Answers once the request passed validation (its own fields and the
    /// operator's ceilings): a request wrong in itself is refused here, before any
    /// stream; a refusal after that (the engine's choice, the policy, the limiter,
    /// the pool) ends the stream with its error.
    pub async fn execute_stream(&self, msg: Execute) -> Result<ExecutionStream, Error> {
        if let Some(f) = &self.federation {
            return f.execute_stream(msg, None).await;
        }
        let subscription = self
            .streamer
            .send(Subscribe(msg.order.request.id.clone()))
            .await
            .map_err(gone)??;
        let id = msg.order.request.id.clone();
        let result = when_proven(self.supervisor.clone(), self.streamer.clone(), id, msg).await?;
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

    /// Opens (or joins) the output buffer of execution `id` for output produced
    /// elsewhere, such as on another node of a fleet: what is pushed into the relay
    /// reaches subscribers ([`subscribe`](Self::subscribe)) as if a local engine
    /// produced it.
    pub async fn relay(&self, id: ExecutionId) -> Result<OutputRelay, Error> {
        let buffer = self
            .streamer
            .send(OpenStream(id.clone()))
            .await
            .map_err(gone)??;
        Ok(OutputRelay {
            sink: BufferSink(buffer),
            id,
            streamer: self.streamer.clone(),
        })
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

    /// Opens a sandbox session on the default engine (or `engine`). In a fleet, the
    /// session first takes its place in the tenant's fleet-wide shares, and its owner
    /// is recorded before its id is answered, whichever surface opens it.
    pub async fn open_sandbox(
        &self,
        spec: SandboxSpec,
        engine: Option<EngineName>,
    ) -> Result<SandboxHandle, Error> {
        match self.federation.clone() {
            Some(f) => self.open_in_fleet(f, spec, engine).await,
            None => self.open_local(spec, engine).await,
        }
    }

    /// Opens a sandbox session on this node, outside any fleet's accounts.
    async fn open_local(
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
        if let Some(f) = &self.federation {
            return f.audit(caller, query).await;
        }
        self.supervisor
            .send(SearchAudit {
                caller: caller.clone(),
                query,
            })
            .await
            .map_err(gone)
    }

    /// The limiter's counters: permits alive, admissions and refusals (operators and
    /// the embedder only).
    pub async fn limiter_stats(
        &self,
        caller: &Caller,
    ) -> Result<crate::limiter::LimiterStats, Error> {
        self.supervisor
            .send(GetLimiterStats {
                caller: caller.clone(),
            })
            .await
            .map_err(gone)?
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

    /// Keeps `min_idle` instances ready for sandboxes of `spec` on `engine` (see
    /// [`WarmPool`](crate::messages::WarmPool)).
    pub async fn warm_pool(
        &self,
        engine: EngineName,
        spec: SandboxSpec,
        min_idle: usize,
    ) -> Result<(), Error> {
        self.supervisor
            .send(crate::messages::WarmPool {
                engine,
                spec,
                min_idle,
            })
            .await
            .map_err(gone)?
    }

    /// The ids of the sandboxes open on this node, every tenant's (for the embedder:
    /// nothing is recorded, and no sandbox's idle clock is reset).
    pub async fn open_sandbox_ids(&self) -> Result<Vec<String>, Error> {
        self.supervisor.send(OpenSandboxIds).await.map_err(gone)
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

/// Sends `msg` to the supervisor and answers once its request passed validation
/// (see [`Proven`]): the pending result, which the stream ends with, or the
/// refusal of a request wrong in itself, before any stream. A refused execution's
/// stream buffer (the one `id`'s subscription opened) is closed.
async fn when_proven<M>(
    supervisor: Addr<Supervisor>,
    streamer: Addr<Streamer>,
    id: ExecutionId,
    msg: M,
) -> Result<PendingResult, Error>
where
    M: Message<Result = Result<ExecResult, Error>> + Send + 'static,
    Supervisor: Handler<Proven<M>>,
{
    let (proven, mut validated) = tokio::sync::oneshot::channel();
    let mut result: PendingResult = Box::pin(async move {
        let r = supervisor.send(Proven { msg, proven }).await.map_err(gone)?;
        if r.is_err() {
            // Refused before it ran: nothing else will close the stream we opened.
            let _ = streamer.send(CloseStream(id)).await;
        }
        r
    });
    // The supervisor tells (or drops `proven`) before the execution's future
    // starts, so once the result is in, whether it passed is known either way.
    let (passed, done) = tokio::select! {
        biased;
        told = &mut validated => (told.is_ok(), None),
        done = &mut result => (validated.try_recv().is_ok(), Some(done)),
    };
    let done = match (passed, done) {
        (true, None) => return Ok(result),
        (_, Some(done)) => done,
        (false, None) => result.await,
    };
    match done {
        Err(e) if !passed => Err(e),
        done => Ok(Box::pin(std::future::ready(done))),
    }
}

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

/// Output of an execution produced elsewhere, pushed into this node's streamer:
/// [`Paddock::relay`].
#[derive(Debug)]
pub struct OutputRelay {
    sink: BufferSink,
    id: ExecutionId,
    streamer: Addr<Streamer>,
}

impl OutputRelay {
    /// Pushes one chunk; waits while the buffer is full (backpressure), and fails
    /// with `STREAM_CLOSED` once the stream was closed.
    pub async fn push(&self, chunk: OutputChunk) -> Result<(), Error> {
        use paddock_core::OutputSink;
        self.sink.chunk(chunk).await
    }

    /// Ends the output: subscribers read what is buffered, then the end.
    pub async fn close(&self) {
        let _ = self.streamer.send(CloseStream(self.id.clone())).await;
    }
}

impl ExecutionStream {
    /// A stream over a subscription to an execution's output (from
    /// [`Paddock::subscribe`]) and the future of its answer.
    pub fn new(
        subscription: Subscription,
        result: impl Future<Output = Result<ExecResult, Error>> + Send + 'static,
    ) -> ExecutionStream {
        ExecutionStream::from_parts(subscription, Box::pin(result))
    }

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
