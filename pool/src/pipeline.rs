//! The pipeline every execution goes through: policy → limiter → pool → engine →
//! streamer → audit. [`Pipeline::run`] shows each stage on a line of its own.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use async_trait::async_trait;
use paddock_core::AccessRules;
use paddock_core::{
    code_hash, unix_ms, CancelToken, EngineName, Error, ErrorCode, ExecRequest, ExecResult,
    ExecutionId, Limits, Outcome, OutputChunk, OutputSink, ValidRequest,
};

use crate::audit::{Audit, AuditEntry, Record};
use crate::engine_actor::RunExec;
use crate::engine_pool::{EnginePool, Lease, Release};
use crate::limiter::{Admit, Limiter};
use crate::parking::{Parking, Refused};
use crate::policy::Policy;
use crate::shares::Shares;
use crate::streamer::{BufferSink, CloseStream, OpenStream, Streamer};
use paddock_telemetry::{labels, Telemetry};
use tracing::Instrument;

use crate::shares::Share;
use crate::supervisor::{Busy, Running, Session, Shared};

/// Everything an execution needs after it left the supervisor's mailbox.
#[derive(Debug)]
pub(crate) struct Pipeline {
    pub(crate) shared: Arc<Shared>,
    pub(crate) telemetry: Telemetry,
    pub(crate) policy: Arc<Policy>,
    pub(crate) limiter: Addr<Limiter>,
    pub(crate) audit: Addr<Audit>,
    pub(crate) streamer: Addr<Streamer>,
    pub(crate) defaults: Limits,
    /// The operator's ceilings on what a request may ask for.
    pub(crate) ceilings: Limits,
    /// Which levels and networks each tenant may use.
    pub(crate) access: AccessRules,
    /// Per-tenant counts of open sandboxes and held pool slots.
    pub(crate) shares: Rc<RefCell<Shares>>,
    /// Instances of pooled executions that suspended, waiting for their resume.
    pub(crate) parking: RefCell<Parking>,
}

/// A sink that feeds the streamer's buffer and, optionally, the caller's own sink.
pub(crate) struct Tee {
    pub(crate) buffer: BufferSink,
    pub(crate) extra: Option<Arc<dyn OutputSink>>,
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
pub(crate) enum Target {
    Pool(Arc<EnginePool>),
    Session(Rc<Session>),
    /// The resume of a pooled execution that suspended: the instance parked for it.
    Parked,
}

impl Pipeline {
    /// Runs one accepted-or-refused execution to its end, one stage a line. Exactly
    /// one audit entry is recorded for every execution the limiter admitted; a
    /// refusal before that is counted and answered, never audited.
    ///
    /// The request comes validated, by [`check_request`](Self::check_request), which
    /// the supervisor runs before it routes the request (so that a streamed request
    /// wrong in itself is refused before its stream begins); the proof goes on to
    /// the engine, which does not validate it again.
    pub(crate) async fn run(
        self: Rc<Self>,
        target: Target,
        request: ValidRequest,
        engine: EngineName,
        sink: Option<Arc<dyn OutputSink>>,
        traceparent: Option<String>,
    ) -> Result<ExecResult, Error> {
        let queued_at_ms = unix_ms();
        let (id, tenant) = (request.id.clone(), request.tenant.clone());
        let refused = |e: Error| self.refused(e);
        self.accepting().map_err(refused)?; // not shutting down
        self.fits(&target, &engine, &request).map_err(refused)?; // the sandbox's limits, the engine's
        let warnings = self.policy(&request).map_err(refused)?; // the policy's rules
        let permit = self.limit(&tenant).await.map_err(refused)?; // the limiter's permit
        let share = self.share(&target, &tenant).map_err(refused)?; // the tenant's pool slot
        let token = self.register(&id, &tenant).map_err(refused)?; // cancel by id
        let hash = self.accept(&request);
        let span = execution_span(&id, &engine, &tenant, traceparent.as_deref());
        let run = Rc::clone(&self).run_accepted(target, request, engine.clone(), sink, token);
        let outcome = run.instrument(span).await; // pool → engine → streamer
        self.record_metrics(engine.clone(), &outcome); // telemetry
        self.close_stream(&id).await; // the streamer's buffer
        let audited = self.record_audit(&outcome, &id, engine, &tenant, hash, queued_at_ms);
        audited.await; // exactly one audit entry
        self.shared.running.remove(&id);
        drop((share, permit));
        outcome.map(|mut r| {
            r.timings.queued_at_ms = queued_at_ms;
            r.warnings.extend(warnings);
            r
        })
    }

    /// Counts a refusal and passes it on.
    fn refused(&self, e: Error) -> Error {
        self.shared.refused_total.fetch_add(1, Ordering::Relaxed);
        e
    }

    /// `ENGINE_DISPOSED` once shutdown has begun.
    fn accepting(&self) -> Result<(), Error> {
        if self.shared.stopping.load(Ordering::Acquire) {
            return Err(Error::new(
                ErrorCode::EngineDisposed,
                "Paddock is shutting down; no new executions are accepted",
            ));
        }
        Ok(())
    }

    /// The one validation of a request on the scheduler's path: the request's own
    /// fields ([`ValidRequest::new`], by `ExecRequest::validate`) and the operator's
    /// ceilings. The proof it answers travels to the engine.
    pub(crate) fn check_request(&self, request: ExecRequest) -> Result<ValidRequest, Error> {
        let valid = ValidRequest::new(request)?;
        paddock_core::tenancy::check_ceilings(&self.ceilings, &valid.limits, "limits")?;
        Ok(valid)
    }

    /// The validated request fits where it runs: in a sandbox, within the
    /// sandbox's own limits, and it asks for no limit the engine cannot enforce.
    /// (The engine checks the rest of what only it knows, and limits merged with
    /// its own defaults.)
    fn fits(&self, target: &Target, engine: &EngineName, request: &ExecRequest) -> Result<(), Error> {
        if let Target::Session(session) = target {
            // What the sandbox runs with: its own limits, and where it set none of
            // its memory, pids or CPU, the defaults its engine gave it.
            let mut ceiling = session.limits.clone();
            ceiling.memory_bytes = ceiling.memory_bytes.or(self.defaults.memory_bytes);
            ceiling.pids = ceiling.pids.or(self.defaults.pids);
            ceiling.cpu_millicores = ceiling.cpu_millicores.or(self.defaults.cpu_millicores);
            paddock_core::tenancy::check_within_sandbox(&ceiling, &request.limits, "limits")?;
        }
        let caps = match target {
            Target::Pool(pool) => Some(pool.engine().capabilities()),
            Target::Session(session) => Some(session.lease.engine().capabilities()),
            Target::Parked => None,
        };
        match caps {
            Some(caps) => caps.check_limits(engine, &request.limits, "limits"),
            None => Ok(()),
        }
    }

    /// The policy's verdict: refused, or admitted with its warnings.
    fn policy(&self, request: &ExecRequest) -> Result<Vec<String>, Error> {
        self.policy.check(&request.program).map_err(|r| {
            tracing::info!(rule = %r.rule, "policy refused an execution");
            self.telemetry.record_rule_block(&r.rule);
            r.error
        })
    }

    /// A permit from the limiter (rate and concurrency, per tenant).
    async fn limit(&self, tenant: &Option<String>) -> Result<crate::limiter::Permit, Error> {
        match self
            .limiter
            .send(Admit::tenant(tenant.clone().unwrap_or_default()))
            .await
        {
            Ok(result) => result,
            Err(e) => Err(mailbox_error("limiter", e)),
        }
    }

    /// A pooled execution holds one of its tenant's pool slots while it waits and
    /// runs; one in a session uses the session's.
    fn share(&self, target: &Target, tenant: &Option<String>) -> Result<Option<Share>, Error> {
        match target {
            Target::Pool(_) => Share::take(&self.shares, tenant, false).map(Some),
            Target::Session(_) | Target::Parked => Ok(None),
        }
    }

    /// Enters the execution in the running registry (where cancel by id finds it),
    /// refusing an id that is already running.
    fn register(&self, id: &ExecutionId, tenant: &Option<String>) -> Result<CancelToken, Error> {
        use dashmap::mapref::entry::Entry;
        match self.shared.running.entry(id.clone()) {
            Entry::Occupied(_) => Err(Error::invalid_options(
                "id",
                format!("an execution with id {id} is already running; use a fresh id"),
            )),
            Entry::Vacant(v) => {
                let token = CancelToken::new();
                v.insert(Running {
                    tenant: tenant.clone(),
                    token: token.clone(),
                });
                Ok(token)
            }
        }
    }

    /// Counts the execution accepted; returns the hash of its code for the audit.
    fn accept(&self, request: &ExecRequest) -> String {
        self.shared.accepted_total.fetch_add(1, Ordering::Relaxed);
        code_hash(&request.program.audit_text())
    }

    /// Closes the execution's stream buffer: queued without waiting for the answer
    /// when the mailbox has room; a full mailbox waits (bounded, never dropped).
    async fn close_stream(&self, id: &ExecutionId) {
        if let Err(SendError::Full(msg)) = self.streamer.try_send(CloseStream(id.clone())) {
            let _ = self.streamer.send(msg).await;
        }
    }

    /// Records the execution's one audit entry: queued in order (a later `Flush` or
    /// query sees it), waiting only when the mailbox is full.
    async fn record_audit(
        &self,
        outcome: &Result<ExecResult, Error>,
        id: &ExecutionId,
        engine: EngineName,
        tenant: &Option<String>,
        hash: String,
        queued_at_ms: u64,
    ) {
        let entry = match outcome {
            Ok(r) => AuditEntry::from_result(r, tenant.as_deref(), hash),
            Err(e) => {
                let mut failed = ExecResult::failed(id.clone(), engine, e.clone());
                failed.timings.queued_at_ms = queued_at_ms;
                AuditEntry::from_result(&failed, tenant.as_deref(), hash)
            }
        };
        match self.audit.try_send(Record(entry)) {
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
    }

    pub(crate) fn record_metrics(&self, engine: EngineName, outcome: &Result<ExecResult, Error>) {
        let t = &self.telemetry;
        let (name, wall_ms) = match outcome {
            Ok(r) => (r.outcome.name(), r.usage.wall_ms as f64),
            Err(_) => (labels::outcome::FAILED, 0.0),
        };
        t.record_execution(engine_label(&engine), name);
        t.record_duration(engine_label(&engine), name, wall_ms);
        if let Ok(r) = outcome {
            let reason = match &r.outcome {
                Outcome::TimedOut => Some(labels::kill::TIMEOUT),
                Outcome::Cancelled => Some(labels::kill::CANCEL),
                // The limit's wire name (`memory`, `pids`, `output`, `cpu`, …).
                Outcome::LimitExceeded { limit } => Some(limit.as_str()),
                _ => None,
            };
            if let Some(reason) = reason {
                t.record_kill(reason);
            }
            if let Some(egress) = &r.egress {
                t.record_egress(engine_label(&engine), "allowed", egress.allowed);
                t.record_egress(engine_label(&engine), "denied", egress.denied);
            }
        }
    }

    pub(crate) async fn run_accepted(
        self: Rc<Self>,
        target: Target,
        request: ValidRequest,
        engine: EngineName,
        sink: Option<Arc<dyn OutputSink>>,
        token: CancelToken,
    ) -> Result<ExecResult, Error> {
        let buffer = match self.streamer.send(OpenStream(request.id.clone())).await {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => return Err(e),
            Err(e) => return Err(mailbox_error("streamer", e)),
        };
        // The output it keeps while it runs counts against its tenant's budget.
        let allowance = self
            .shares
            .borrow()
            .memory
            .output_allowance(request.tenant.as_deref());
        let tee: Arc<dyn OutputSink> = Arc::new(crate::memory::Budgeted {
            inner: Arc::new(Tee {
                buffer: BufferSink(buffer),
                extra: sink,
            }),
            allowance: allowance.clone(),
        });
        let noted = |mut result: Result<ExecResult, Error>| {
            if let Ok(r) = &mut result {
                crate::memory::note_cut(r, &allowance);
            }
            result
        };
        let from = match target {
            Target::Session(session) => {
                let _busy = Busy::running(session.clone(), request.id.clone(), token.clone());
                let request = request.or_limits(&session.limits)?;
                let limits = request.limits.clone().or(&self.defaults);
                let grace = Duration::from_millis(session.lease.pool_config().watchdog_grace_ms);
                return noted(run_on(&session.lease, request, tee, token, &limits, grace).await);
            }
            Target::Pool(pool) => Some(pool),
            Target::Parked => None,
        };
        let (pool, lease) = match self.pooled_lease(from, &request, &token).await {
            Ok(Some(held)) => held,
            Ok(None) => return Ok(cancelled_result(request.id.clone(), engine)),
            Err(e) => return Err(e),
        };
        let limits = request.limits.clone().or(&self.defaults);
        let grace = Duration::from_millis(pool.config.watchdog_grace_ms);
        let tenant = request.tenant.clone();
        let mut result = noted(run_on(&lease, request, tee, token, &limits, grace).await);
        self.settle(pool, lease, tenant, &mut result);
        result
    }
}

impl Pipeline {
    /// The pooled instance an execution runs on, and its pool: a fresh lease from
    /// `from`, or (`None`), for the resume of a suspended execution, the instance
    /// parked for it (in the pool it was parked from, whatever the routing saw).
    /// `Ok(None)`: cancelled while it waited.
    async fn pooled_lease(
        &self,
        from: Option<Arc<EnginePool>>,
        request: &ExecRequest,
        token: &CancelToken,
    ) -> Result<Option<(Arc<EnginePool>, Lease)>, Error> {
        match from {
            Some(pool) => match pool.acquire(token).await {
                Ok(lease) => Ok(Some((pool, lease))),
                Err(e) if e.code == ErrorCode::Cancelled => Ok(None),
                Err(e) => Err(e),
            },
            None => {
                let paddock_core::Program::Resume { token_id, .. } = &request.program else {
                    return Err(Error::invalid_options(
                        "program",
                        "only a resume runs on a parked instance",
                    ));
                };
                let parked = self.parking.borrow_mut().take(&request.tenant, token_id)?;
                Ok(Some((parked.pool, parked.lease)))
            }
        }
    }

    /// Ends a pooled lease: an execution that suspended parks its instance for the
    /// resume; anything else goes back to the pool (retired unless clean).
    pub(crate) fn settle(
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
pub(crate) async fn run_on(
    lease: &Lease,
    request: ValidRequest,
    sink: Arc<dyn OutputSink>,
    cancel: CancelToken,
    limits: &Limits,
    grace: Duration,
) -> Result<ExecResult, Error> {
    let inst = lease.instance();
    let id = request.id.clone();
    let engine = inst.sandbox.engine();
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
pub(crate) fn release_for(result: &Result<ExecResult, Error>) -> Release {
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

/// The tracing span of one execution.
fn execution_span(
    id: &ExecutionId,
    engine: &EngineName,
    tenant: &Option<String>,
    traceparent: Option<&str>,
) -> tracing::Span {
    paddock_telemetry::execution_span(
        id,
        engine.as_str(),
        tenant.as_deref().unwrap_or(""),
        traceparent,
    )
}

/// `engine` as a metric attribute, without copying a built-in name.
pub(crate) fn engine_label(engine: &EngineName) -> paddock_telemetry::Label {
    match engine.as_static() {
        Some(name) => name.into(),
        None => engine.to_shared().into(),
    }
}

pub(crate) fn cancelled_result(id: ExecutionId, engine: EngineName) -> ExecResult {
    ExecResult::empty(id, Outcome::Cancelled, engine, "")
}

pub(crate) fn mailbox_error(what: &str, e: MailboxError) -> Error {
    Error::new(
        ErrorCode::EngineFailed,
        format!("the {what} actor did not answer ({e}); retry"),
    )
}
