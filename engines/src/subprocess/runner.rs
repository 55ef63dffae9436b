//! Warm execution of `Code` in a subprocess sandbox: built-in runners kept running in
//! the sandbox's warm cgroup, one per language, each serving one turn at a time.
//!
//! A request runs warm only when warm mode can give it exactly what a cold process
//! would: no stdin, no extra environment, no working directory, and no CPU-time,
//! file-size or open-files limit of its own (the runner's rlimits are set when it
//! starts). Anything else runs cold.
//!
//! A worker belongs to one tenant: a request of another tenant replaces it first, so
//! untrusted code never shares an interpreter across tenants. It is also replaced after
//! `max_turns` turns, past `max_age_ms`, when its resident memory passed
//! `max_rss_bytes`, and after any turn that did not complete with exit code 0 (an
//! exception, a timeout, a cancel, a limit, a protocol fault). Processes a snippet
//! left running are killed when its turn ends; the runner itself is spared.

use std::path::PathBuf;

use paddock_core::{
    unix_ms, CancelToken, EngineKind, Error, ErrorCode, ExecRequest, ExecResult, Language,
    LimitKind, Limits, Outcome, OutputSink, Program, Result, Timings, Usage, WarmConfig,
};
use serde_json::json;

use super::sandbox::SubprocessSandbox;
use super::warm::{FramesOn, TurnEnd, TurnFault, Worker};

/// The Python runner, written next to the engine's workdirs when warm mode is on.
const PYTHON_RUNNER: &str = include_str!("runners/python.py");
/// The Node runner, likewise.
const NODE_RUNNER: &str = include_str!("runners/node.js");

/// What the engine prepared for warm mode.
#[derive(Debug)]
pub(crate) struct WarmSetup {
    pub(crate) config: WarmConfig,
    /// Runner script per language.
    pub(crate) runners: Vec<(Language, PathBuf)>,
}

impl WarmSetup {
    /// Writes the runner scripts under `dir`.
    pub(crate) fn prepare(config: &WarmConfig, dir: &std::path::Path) -> Result<WarmSetup> {
        let dir = dir.join("runners");
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::engine_io("creating the runner directory", e))?;
        let mut runners = Vec::new();
        for lang in &config.languages {
            let (name, text) = match lang {
                Language::Python => ("python.py", PYTHON_RUNNER),
                Language::Javascript => ("node.js", NODE_RUNNER),
                other => {
                    return Err(Error::invalid_config(
                        "subprocess.warm.languages",
                        format!("there is no built-in warm runner for {other}"),
                    ))
                }
            };
            let path = dir.join(name);
            std::fs::write(&path, text)
                .map_err(|e| Error::engine_io("writing a warm runner", e))?;
            runners.push((*lang, path));
        }
        Ok(WarmSetup {
            config: config.clone(),
            runners,
        })
    }

    fn runner(&self, lang: Language) -> Option<&PathBuf> {
        self.runners
            .iter()
            .find(|(l, _)| *l == lang)
            .map(|(_, p)| p)
    }
}

/// A warm worker and whom it serves.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) worker: Worker,
    pub(crate) tenant: Option<String>,
}

impl SubprocessSandbox {
    /// The language to run `request` warm in, when warm mode can run it exactly.
    pub(super) fn warm_language(&self, request: &ExecRequest) -> Option<Language> {
        let setup = self.engine.warm.as_ref()?;
        let Program::Code { language, .. } = &request.program else {
            return None;
        };
        setup.runner(*language)?;
        let l = &request.limits;
        let plain = request.stdin.is_none()
            && request.env.is_empty()
            && request.cwd.is_none()
            && l.cpu_ms.is_none()
            && l.file_size_bytes.is_none()
            && l.open_files.is_none();
        plain.then_some(*language)
    }

    /// Starts a runner for `lang` serving `tenant`.
    pub(super) fn start_worker(&self, lang: Language, tenant: Option<String>) -> Result<Slot> {
        let setup = self
            .engine
            .warm
            .as_ref()
            .ok_or_else(|| Error::new(ErrorCode::EngineFailed, "warm mode is off"))?;
        let script = setup.runner(lang).ok_or_else(|| {
            Error::new(
                ErrorCode::CapabilityNotSupported,
                format!("no warm runner for {lang}"),
            )
        })?;
        let interp = match self.engine.support.interpreters.get(&lang) {
            Some(Ok(p)) => p.clone(),
            _ => return Err(super::missing_interpreter(&self.engine, lang)),
        };
        let argv = vec![
            interp.to_string_lossy().into_owned(),
            script.to_string_lossy().into_owned(),
        ];
        let stdio = self.placeholder_stdio()?;
        let spec = self.spawn_spec(
            argv,
            &Default::default(),
            None,
            &self.spec.limits.or(&self.engine.defaults),
            stdio,
            self.warm_cgroup.as_deref(),
        )?;
        let worker = Worker::start(spec, FramesOn::Fd3).map_err(|e| {
            Error::new(
                ErrorCode::SpawnFailed,
                format!("starting the warm {lang} runner failed: {e}"),
            )
        })?;
        Ok(Slot { worker, tenant })
    }

    /// Whether the slot may serve `tenant` now.
    fn fit(&self, slot: &Slot, tenant: &Option<String>, config: &WarmConfig) -> bool {
        slot.tenant == *tenant
            && slot.worker.turns < config.max_turns
            && slot.worker.started.elapsed().as_millis() < u128::from(config.max_age_ms)
    }

    /// Runs `request` on the warm worker for its language (see [`Self::warm_language`]).
    pub(super) async fn run_warm(
        &self,
        request: ExecRequest,
        limits: Limits,
        sink: &dyn OutputSink,
        cancel: CancelToken,
        queued_at_ms: u64,
        destroyed: std::pin::Pin<&mut (dyn std::future::Future<Output = ()> + Send)>,
    ) -> Result<ExecResult> {
        let (Some(setup), Some(lang)) = (self.engine.warm.as_ref(), self.warm_language(&request))
        else {
            return Err(Error::new(
                ErrorCode::EngineFailed,
                "this request cannot run on a warm worker",
            ));
        };
        let config = &setup.config;
        let taken = self.warm.lock().remove(&lang);
        let mut slot = match taken {
            Some(slot) if self.fit(&slot, &request.tenant, config) => slot,
            _ => self.start_worker(lang, request.tenant.clone())?,
        };
        if let Some(g) = &self.warm_cgroup {
            g.set_limits(limits.memory_bytes, limits.pids)
                .map_err(|e| Error::engine_io("setting cgroup limits", e))?;
        }
        let Program::Code { source, .. } = &request.program else {
            return Err(Error::new(
                ErrorCode::EngineFailed,
                "warm mode runs code only",
            ));
        };
        let started = tokio::time::Instant::now();
        let started_at_ms = unix_ms();
        let timeout = limits
            .timeout()
            .unwrap_or(std::time::Duration::from_secs(30));
        let cap =
            usize::try_from(limits.max_output_bytes.unwrap_or(u64::MAX)).unwrap_or(usize::MAX);
        let turn = slot
            .worker
            .invoke(
                json!({ "code": source }),
                sink,
                &cancel,
                started + timeout,
                cap,
                destroyed,
            )
            .await;
        let wall_ms = started.elapsed().as_millis() as u64;

        let oom = self
            .warm_cgroup
            .as_ref()
            .is_some_and(|g| g.new_oom_kills() > 0);
        let (mut outcome, value) = match turn.end {
            Ok(TurnEnd::Output(out)) => {
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
                            format!("the {lang} runner answered without an exit code: {out}"),
                        ),
                        None,
                    ),
                }
            }
            Ok(TurnEnd::Error(e)) if e.code == "CANCELLED" => (Outcome::Cancelled, None),
            Ok(TurnEnd::Error(e)) => (
                failed(
                    ErrorCode::WorkerFailed,
                    format!("the {lang} runner failed: {}: {}", e.code, e.message),
                ),
                None,
            ),
            Ok(TurnEnd::Suspend(token)) => (
                failed(
                    ErrorCode::ProtocolError,
                    format!(
                        "the {lang} runner suspended on `{token}`, which code snippets cannot do"
                    ),
                ),
                None,
            ),
            Err(TurnFault::TimedOut) => (Outcome::TimedOut, None),
            Err(TurnFault::Cancelled) => (Outcome::Cancelled, None),
            Err(_) if oom => (
                Outcome::LimitExceeded {
                    limit: LimitKind::Memory,
                },
                None,
            ),
            Err(TurnFault::Protocol(e)) => (Outcome::Failed { error: e.into() }, None),
            Err(TurnFault::Died(why)) => (
                failed(
                    ErrorCode::WorkerFailed,
                    format!("the warm {lang} runner died during the execution: {why}"),
                ),
                None,
            ),
        };
        let clean = matches!(outcome, Outcome::Completed { exit_code: 0, .. });
        let peak_memory = slot.worker.rss_bytes();
        let healthy = clean && peak_memory <= config.max_rss_bytes;
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
            let _ = super::sandbox::blocking(move || {
                g.kill_all_except(&keep)
                    .map(drop)
                    .map_err(|e| Error::engine_io("killing what the snippet left running", e))
            })
            .await;
        }
        if healthy {
            self.warm.lock().insert(lang, slot);
        } else {
            drop(slot);
            // Start the replacement now, off the next request's path.
            if let Ok(fresh) = self.start_worker(lang, request.tenant.clone()) {
                self.warm.lock().insert(lang, fresh);
            }
        }
        if outcome != Outcome::Cancelled && !cancel.finish() {
            outcome = Outcome::Cancelled;
        }
        Ok(ExecResult {
            id: request.id,
            outcome,
            stdout_truncated: turn.stdout.truncated,
            stderr_truncated: turn.stderr.truncated,
            stdout: turn.stdout.text(),
            stderr: turn.stderr.text(),
            value,
            usage: Usage {
                cpu_ms: 0,
                wall_ms,
                peak_memory_bytes: peak_memory,
            },
            engine: EngineKind::Subprocess,
            instance_id: self.id.clone(),
            timings: Timings {
                queued_at_ms,
                started_at_ms,
                finished_at_ms: unix_ms(),
            },
            warnings: Vec::new(),
        })
    }
}

fn failed(code: ErrorCode, message: String) -> Outcome {
    Outcome::Failed {
        error: Error::new(code, message),
    }
}
