//! Warm execution of `Code` in a subprocess sandbox: built-in runners kept running in
//! the sandbox's warm cgroup, one per language, each serving one turn at a time.
//!
//! A request runs warm only when warm mode can give it exactly what a cold process
//! would: no stdin, no extra environment, no working directory, no file-size or
//! open-files limit of its own (the runner's rlimits are set when it starts), and no
//! CPU-time limit at all, its own or the default (RLIMIT_CPU would count the
//! runner's whole life). Anything else runs cold.
//!
//! A worker belongs to one tenant: a request of another tenant replaces it first, so
//! untrusted code never shares an interpreter across tenants. The one exception is a
//! runner a pooled sandbox started for no tenant, which nothing has reached yet: the
//! first tenant to run code there takes it (see `untouched`), so that a freshly
//! opened sandbox's first snippet is warm too. It is also replaced after
//! `max_turns` turns, past `max_age_ms`, when its resident memory passed
//! `max_rss_bytes`, and after any turn that did not complete with exit code 0 (an
//! exception, a timeout, a cancel, a limit, a protocol fault). Processes a snippet
//! left running are killed when its turn ends; the runner itself is spared.

use std::path::PathBuf;

use paddock_core::{
    unix_ms, CancelToken, EngineName, Error, ErrorCode, ExecRequest, ExecResult, Language,
    LimitKind, Limits, Outcome, OutputSink, Program, Result, Timings, Usage,
};
use serde_json::json;

use super::sandbox::SubprocessSandbox;
use super::workers::{Slot, Suspension, WorkerKey};
use super::zygote::ForkRequest;
use crate::host::spawn::SpawnSpec;
use crate::warm::worker::{FramesOn, TurnEnd, TurnFault, Worker};
use crate::WarmConfig;

/// Suspended invocations one sandbox keeps at most.
const MAX_SUSPENDED: usize = 1024;
/// How long after a `suspend` frame a one-shot handler has to exit with code 42.
const SUSPEND_EXIT_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// What a warm turn sends.
enum TurnKind {
    Invoke(serde_json::Value),
    Resume {
        id: String,
        token_id: String,
        value: serde_json::Value,
    },
}

/// One warm turn to run.
struct WarmTurn {
    key: WorkerKey,
    tenant: Option<String>,
    kind: TurnKind,
    id: paddock_core::ExecutionId,
    limits: Limits,
    queued_at_ms: u64,
}

impl SubprocessSandbox {
    /// The worker to run `request` on and the `invoke` input to send it, when a warm
    /// worker can run it exactly.
    pub(super) fn warm_target(
        &self,
        request: &ExecRequest,
    ) -> Option<(WorkerKey, serde_json::Value)> {
        let setup = self.engine.warm.as_ref()?;
        let l = &request.limits;
        // RLIMIT_CPU would count the runner's whole life: any execution under a
        // CPU-time limit, its own or the default, runs cold.
        let cpu_limited = l
            .cpu_ms
            .or(self.spec.limits.cpu_ms)
            .or(self.engine.defaults.cpu_ms)
            .is_some();
        let plain = !cpu_limited
            && request.stdin.is_none()
            && request.env.is_empty()
            && request.cwd.is_none()
            && l.cpu_ms.is_none()
            && l.file_size_bytes.is_none()
            && l.open_files.is_none();
        if !plain {
            return None;
        }
        match &request.program {
            Program::Code { language, source } if setup.runner(*language).is_some() => {
                Some((WorkerKey::Runner(*language), json!({ "code": source })))
            }
            Program::Invoke { handler, input } if setup.handlers.contains_key(handler) => {
                Some((WorkerKey::Handler(handler.clone()), input.clone()))
            }
            Program::Invoke { handler, input }
                if handler.contains(':') && setup.runner(Language::Python).is_some() =>
            {
                Some((
                    WorkerKey::Runner(Language::Python),
                    json!({ "handler": handler, "input": input }),
                ))
            }
            _ => None,
        }
    }

    /// Starts the worker for `key` serving `tenant`.
    pub(super) async fn start_worker(
        &self,
        key: &WorkerKey,
        tenant: Option<String>,
    ) -> Result<Slot> {
        let setup = self
            .engine
            .warm
            .as_ref()
            .ok_or_else(|| Error::new(ErrorCode::EngineFailed, "warm mode is off"))?;
        // A Python runner the fork server can give: its interpreter and script.
        let mut forkable = None;
        let (argv, frames_on) = match key {
            WorkerKey::Runner(lang) => {
                let script = setup.runner(*lang).ok_or_else(|| {
                    Error::new(
                        ErrorCode::CapabilityNotSupported,
                        format!("no warm runner for {lang}"),
                    )
                })?;
                let interp = match self.engine.support.interpreters.get(lang) {
                    Some(Ok(p)) => p.path().to_path_buf(),
                    _ => return Err(super::missing_interpreter(&self.engine, *lang)),
                };
                if *lang == Language::Python && setup.config.fork_server {
                    forkable = Some((interp.clone(), script.clone()));
                }
                (
                    vec![
                        interp.to_string_lossy().into_owned(),
                        script.to_string_lossy().into_owned(),
                    ],
                    FramesOn::Fd3,
                )
            }
            WorkerKey::Handler(name) => {
                let handler = setup.handlers.get(name).ok_or_else(|| {
                    Error::new(
                        ErrorCode::NotFound,
                        format!("no handler `{name}` is configured"),
                    )
                })?;
                (handler.command.clone(), FramesOn::Stdout)
            }
        };
        let stdio = self.placeholder_stdio()?;
        // No CPU-time limit on the runner itself (see `warm_target`).
        let mut limits = self.spec.limits.or(&self.engine.defaults);
        limits.cpu_ms = None;
        let spec = self.spawn_spec(
            argv,
            &Default::default(),
            None,
            &limits,
            stdio,
            self.warm_cgroup.as_deref(),
        )?;
        if let Some((interp, script)) = forkable {
            match self.fork_runner(&spec, interp, script).await {
                Ok(worker) => {
                    return Ok(Slot {
                        worker,
                        tenant,
                        born: self.touch.lock().runs,
                    })
                }
                // Resting after it broke: said once, when it broke.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    tracing::warn!(sandbox = %self.id, error = %e, "the Python fork server gave no runner; starting an interpreter instead");
                }
            }
        }
        let worker = Worker::start_async(spec, frames_on).await.map_err(|e| {
            Error::new(
                ErrorCode::SpawnFailed,
                format!("starting the warm {key} failed: {e}"),
            )
        })?;
        Ok(Slot {
            worker,
            tenant,
            born: self.touch.lock().runs,
        })
    }

    /// A Python runner forked from the engine's fork server (see `zygote.rs`) into
    /// what `spec` describes: the same cgroups, namespaces, rlimits, working
    /// directory and environment a spawned runner gets.
    async fn fork_runner(
        &self,
        spec: &SpawnSpec,
        interp: PathBuf,
        script: PathBuf,
    ) -> std::io::Result<Worker> {
        let (child, ours) = Worker::runner_pipes()?;
        let [stdin, stdout, stderr] = child.stdio;
        let request = ForkRequest::from_spec(spec, [stdin, stdout, stderr, child.fd3])?;
        let engine = self.engine.clone();
        let pidfd = tokio::task::spawn_blocking(move || {
            engine
                .zygote
                .fork(&interp, &script, &engine.base_env, request)
        })
        .await
        .map_err(std::io::Error::other)??;
        Worker::adopt(pidfd, ours)
    }

    /// Whether the slot may serve `tenant` now: its own tenant's, or one that no
    /// code has reached (see [`Self::untouched`]).
    fn fit(&self, slot: &Slot, tenant: &Option<String>, config: &WarmConfig) -> bool {
        slot.worker.pid().is_some()
            && (slot.tenant == *tenant || self.untouched(slot, tenant))
            && slot.worker.turns < config.max_turns
            && slot.worker.started.elapsed().as_millis() < u128::from(config.max_age_ms)
    }

    /// Whether `tenant` may take a runner that the sandbox started for no tenant
    /// when it opened (a pooled sandbox's): it has taken no turn, and only `tenant`
    /// has run code in the sandbox since it opened (the execution asking now is
    /// counted before it gets here). A runner started for a tenant, one that served
    /// a turn, or one beside whose idle process another tenant's program ran (which
    /// could have reached into it as the same user), or a process of a tenant not
    /// known here, is replaced for `tenant` instead.
    fn untouched(&self, slot: &Slot, tenant: &Option<String>) -> bool {
        let touch = self.touch.lock();
        slot.tenant.is_none()
            && slot.worker.turns == 0
            && slot.born == 0
            && !touch.mixed
            && touch.first.as_ref() == Some(tenant)
    }

    /// Runs `request` on its warm worker (see [`Self::warm_target`]).
    pub(super) async fn run_warm(
        &self,
        request: ExecRequest,
        limits: Limits,
        sink: &dyn OutputSink,
        cancel: CancelToken,
        queued_at_ms: u64,
        destroyed: std::pin::Pin<&mut (dyn std::future::Future<Output = ()> + Send)>,
    ) -> Result<ExecResult> {
        let Some((key, input)) = self.warm_target(&request) else {
            return Err(Error::new(
                ErrorCode::EngineFailed,
                "this request cannot run on a warm worker",
            ));
        };
        let turn = WarmTurn {
            key,
            tenant: request.tenant.clone(),
            kind: TurnKind::Invoke(input),
            id: request.id,
            limits,
            queued_at_ms,
        };
        self.warm_turn(turn, sink, cancel, destroyed).await
    }

    /// Continues the invocation suspended on `token_id` with `value`, as the
    /// execution `request` (whose program is the resume).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn resume_warm(
        &self,
        request: &ExecRequest,
        token_id: &str,
        value: serde_json::Value,
        sink: &dyn OutputSink,
        cancel: CancelToken,
        destroyed: std::pin::Pin<&mut (dyn std::future::Future<Output = ()> + Send)>,
    ) -> Result<ExecResult> {
        let queued_at_ms = unix_ms();
        let s = {
            let mut suspended = self.suspended.lock();
            // Another tenant's token is not there for this caller.
            match suspended.get(token_id) {
                Some(s) if s.tenant == request.tenant => suspended.remove(token_id),
                _ => None,
            }
        };
        let Some(s) = s else {
            return Err(Error::new(
                ErrorCode::NotFound,
                format!(
                    "no invocation in sandbox {} is suspended on token `{token_id}`",
                    self.id
                ),
            ));
        };
        let turn = WarmTurn {
            key: s.key,
            tenant: s.tenant,
            kind: TurnKind::Resume {
                id: s.id,
                token_id: token_id.to_string(),
                value,
            },
            id: request.id.clone(),
            limits: request
                .limits
                .or(&self.spec.limits)
                .or(&self.engine.defaults),
            queued_at_ms,
        };
        self.warm_turn(turn, sink, cancel, destroyed).await
    }

    /// Runs one turn on the warm worker for `turn.key`.
    async fn warm_turn(
        &self,
        turn_req: WarmTurn,
        sink: &dyn OutputSink,
        cancel: CancelToken,
        destroyed: std::pin::Pin<&mut (dyn std::future::Future<Output = ()> + Send)>,
    ) -> Result<ExecResult> {
        let Some(setup) = self.engine.warm.as_ref() else {
            return Err(Error::new(ErrorCode::EngineFailed, "warm mode is off"));
        };
        let WarmTurn {
            key,
            tenant,
            kind,
            id: execution_id,
            limits,
            queued_at_ms,
        } = turn_req;
        let config = &setup.config;
        let taken = self.warm.lock().remove(&key);
        // A resume continues on the worker that suspended, however many turns or how
        // much age it has: its invocation lives there.
        let resuming = matches!(kind, TurnKind::Resume { .. });
        let mut slot = match taken {
            Some(mut slot)
                if (resuming && slot.tenant == tenant) || self.fit(&slot, &tenant, config) =>
            {
                // A worker that exited on its own since its last turn (a one-shot
                // handler, a crash while idle) is replaced before it is used.
                if slot
                    .worker
                    .exited_within(std::time::Duration::ZERO)
                    .await
                    .is_some()
                {
                    self.start_worker(&key, tenant.clone()).await?
                } else {
                    slot
                }
            }
            _ => self.start_worker(&key, tenant.clone()).await?,
        };
        // Its tenant's from this turn on (an untouched runner is adopted).
        slot.tenant = tenant.clone();
        if let Some(g) = &self.warm_cgroup {
            g.set_limits(&limits).map_err(|e| {
                crate::host::cgroup::limits_error(e, limits.memory_bytes, "setting cgroup limits")
            })?;
        }
        let mark = slot.worker.usage_mark();
        let started = tokio::time::Instant::now();
        let started_at_ms = unix_ms();
        let timeout = limits
            .timeout()
            .unwrap_or(std::time::Duration::from_secs(30));
        let cap =
            usize::try_from(limits.max_output_bytes.unwrap_or(u64::MAX)).unwrap_or(usize::MAX);
        let deadline = started + timeout;
        let (turn_id, turn) = match kind {
            TurnKind::Invoke(input) => {
                slot.worker
                    .invoke(
                        execution_id.to_string(),
                        input,
                        sink,
                        &cancel,
                        deadline,
                        cap,
                        destroyed,
                    )
                    .await
            }
            TurnKind::Resume {
                id,
                token_id,
                value,
            } => {
                let turn = slot
                    .worker
                    .resume(
                        &id, &token_id, value, sink, &cancel, deadline, cap, destroyed,
                    )
                    .await;
                (id, turn)
            }
        };
        let wall_ms = started.elapsed().as_millis() as u64;

        let oom = self
            .warm_cgroup
            .as_ref()
            .is_some_and(|g| g.new_oom_kills() > 0);
        // As a cold execution does: a fork the pids limit refused is worth a warning.
        let refused_forks = self
            .warm_cgroup
            .as_ref()
            .is_some_and(|g| g.new_pids_max_hits() > 0);
        let warnings =
            crate::host::cgroup::pids_warning(refused_forks && turn.end.is_ok(), &limits);
        let (mut outcome, value) = match (turn.end, &key) {
            // A runner answers like a process: `{exit_code, value}`.
            (Ok(TurnEnd::Output(out)), WorkerKey::Runner(_)) => {
                let code = out
                    .get("exit_code")
                    .and_then(|c| c.as_i64())
                    .and_then(|c| i32::try_from(c).ok());
                match code {
                    Some(exit_code) => (
                        Outcome::Completed {
                            exit_code,
                            signal: None,
                        },
                        out.get("value").cloned().filter(|_| exit_code == 0),
                    ),
                    None => (
                        failed(
                            ErrorCode::ProtocolError,
                            format!("the {key} answered without an exit code: {out}"),
                        ),
                        None,
                    ),
                }
            }
            // A handler's output is the value.
            (Ok(TurnEnd::Output(out)), WorkerKey::Handler(_)) => (
                Outcome::Completed {
                    exit_code: 0,
                    signal: None,
                },
                Some(out),
            ),
            (Ok(TurnEnd::Error(e)), _) if e.code == "CANCELLED" => (Outcome::Cancelled, None),
            (Ok(TurnEnd::Error(e)), _) => (
                failed(
                    ErrorCode::WorkerFailed,
                    format!("the {key} answered with error {}: {}", e.code, e.message),
                ),
                None,
            ),
            (Ok(TurnEnd::Suspend(token_id)), _) => (Outcome::Suspended { token_id }, None),
            (Err(TurnFault::TimedOut), _) => (Outcome::TimedOut, None),
            (Err(TurnFault::Cancelled), _) => (Outcome::Cancelled, None),
            (Err(_), _) if oom => (
                Outcome::LimitExceeded {
                    limit: LimitKind::Memory,
                },
                None,
            ),
            (Err(TurnFault::Protocol(e)), _) => (Outcome::Failed { error: e.into() }, None),
            (Err(TurnFault::Died(why)), _) => (
                failed(
                    ErrorCode::WorkerFailed,
                    format!("the warm {key} died during the execution: {why}"),
                ),
                None,
            ),
        };
        // A suspended invocation waits for its token. A one-shot handler exits with
        // code 42 now and is started again for the resume; a long-running one stays.
        let mut one_shot = false;
        if let Outcome::Suspended { token_id } = &outcome {
            match slot.worker.exited_within(SUSPEND_EXIT_WAIT).await {
                Some(code) if code == paddock_core::protocol::SUSPEND_EXIT_CODE => one_shot = true,
                Some(code) => {
                    outcome = failed(
                        ErrorCode::WorkerFailed,
                        format!("the {key} suspended on `{token_id}` and then exited with code {code}, not 42"),
                    );
                }
                None => {}
            }
            if let Outcome::Suspended { token_id } = &outcome {
                let mut suspended = self.suspended.lock();
                if suspended.contains_key(token_id) {
                    outcome = failed(
                        ErrorCode::WorkerFailed,
                        format!("the {key} suspended on token `{token_id}`, which another suspended invocation in this sandbox already holds; tokens must be unique"),
                    );
                } else if suspended.len() >= MAX_SUSPENDED {
                    outcome = failed(
                        ErrorCode::LimitsExceeded,
                        format!("the sandbox already holds {MAX_SUSPENDED} suspended invocations; resume or destroy some"),
                    );
                } else {
                    suspended.insert(
                        token_id.clone(),
                        Suspension {
                            key: key.clone(),
                            id: turn_id.clone(),
                            tenant: tenant.clone(),
                        },
                    );
                }
            }
        }
        let clean = matches!(
            outcome,
            Outcome::Completed { exit_code: 0, .. } | Outcome::Suspended { .. }
        );
        let usage = slot.worker.usage_since(mark);
        let healthy = clean && !one_shot && usage.rss_bytes <= config.max_rss_bytes;
        // Whatever the snippet left running dies with its turn; the sandbox's warm
        // workers (this one if it stays, and those of other languages) are spared.
        // The usual case (only workers left) is one read of `cgroup.procs`, done here.
        if !healthy {
            slot.worker.kill();
        }
        let mut keep: Vec<libc::pid_t> = self
            .warm
            .lock()
            .values()
            .filter_map(|s| s.worker.pid())
            .collect();
        if healthy {
            keep.extend(slot.worker.pid());
        }
        let leftovers = self
            .warm_cgroup
            .as_ref()
            .is_some_and(|g| g.has_other_than(&keep));
        if let (Some(g), true) = (self.warm_cgroup.clone(), leftovers) {
            let _ = crate::task::blocking(move || {
                g.kill_all_except(&keep)
                    .map(drop)
                    .map_err(|e| Error::engine_io("killing what the snippet left running", e))
            })
            .await;
        }
        if healthy {
            self.warm.lock().insert(key, slot);
        } else {
            drop(slot);
            // Start the replacement now, off the next request's path.
            if let Ok(fresh) = self.start_worker(&key, tenant.clone()).await {
                self.warm.lock().insert(key, fresh);
            }
        }
        if outcome != Outcome::Cancelled && !cancel.finish() {
            outcome = Outcome::Cancelled;
        }
        Ok(ExecResult {
            id: execution_id,
            outcome,
            stdout_truncated: turn.stdout.truncated,
            stderr_truncated: turn.stderr.truncated,
            stdout: turn.stdout.into_string(),
            stderr: turn.stderr.into_string(),
            value,
            usage: Usage {
                cpu_ms: usage.cpu_ms,
                wall_ms,
                peak_memory_bytes: usage.peak_memory_bytes,
            },
            engine: EngineName::SUBPROCESS,
            instance_id: self.id.clone(),
            timings: Timings {
                queued_at_ms,
                started_at_ms,
                finished_at_ms: unix_ms(),
            },
            warnings,
            egress: None,
        })
    }
}

fn failed(code: ErrorCode, message: String) -> Outcome {
    Outcome::Failed {
        error: Error::new(code, message),
    }
}
