//! A warm execution: the sandbox's warm container taken alive, and one turn run
//! in it through its agent (or a warm runner), measured and classified.

use std::time::Duration;

use paddock_core::{
    unix_ms, CancelToken, Error, ErrorCode, ExecRequest, ExecResult, LimitKind, Limits, Outcome,
    OutputSink, Result, Timings, Usage,
};
use tokio::time::Instant;

use super::sandbox::ContainerSandbox;
use super::warm::WarmContainer;
use crate::task::blocking;

impl ContainerSandbox {
    /// The warm container, alive (one that died while idle is replaced first), or
    /// `None` when the sandbox has none.
    pub(super) async fn take_warm(&self) -> Option<WarmContainer> {
        let mut wc = self.warm.lock().take()?;
        if wc
            .worker
            .exited_within(std::time::Duration::ZERO)
            .await
            .is_some()
        {
            let dead = wc;
            let _ = blocking(move || {
                dead.close();
                Ok(())
            })
            .await;
            wc = match self.start_warm() {
                Ok(fresh) => fresh,
                Err(e) => {
                    tracing::warn!(sandbox = %self.id, error = %e, "no warm container");
                    return None;
                }
            };
        }
        Some(wc)
    }

    /// Runs `request` in the warm container: one `invoke` frame to its agent.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_warm(
        &self,
        mut wc: WarmContainer,
        request: ExecRequest,
        limits: &Limits,
        (cwd, vars): (String, std::collections::BTreeMap<String, String>),
        sink: &dyn OutputSink,
        cancel: CancelToken,
        destroyed: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
        queued_at_ms: u64,
    ) -> Result<ExecResult> {
        let (argv, _) = self.argv(&request.program, None)?;
        if let Err(why) = wc.wait_ready().await {
            self.replace_warm(wc).await;
            return Err(Error::new(
                ErrorCode::EngineFailed,
                format!(
                    "the sandbox's warm container did not start ({}: {why}); retry",
                    self.engine.info.kind.as_str()
                ),
            ));
        }
        let mut applied = wc.apply_limits(limits);
        if applied.is_err() && !wc.runners.is_empty() {
            // Idle runners hold memory the new limit may not leave room for: they
            // go (killed through their pidfds), and the limit is tried again.
            wc.runners.clear();
            tokio::time::sleep(Duration::from_millis(20)).await;
            applied = wc.apply_limits(limits);
        }
        if let Err(e) = applied {
            // A limit below what the container holds (its /tmp, say) cannot be
            // set: this container goes, a fresh one takes its place.
            self.replace_warm(wc).await;
            return Err(Error::new(
                ErrorCode::LimitsExceeded,
                format!("setting the warm container's limits failed ({e}); the container was replaced, retry"),
            ));
        }
        let cpu_before = wc.counters().cpu_ns();
        let ooms_before = wc.ooms_seen;
        // Only this turn's tenant ran code in the container so far (and no
        // process, whose tenant is not known here): a runner started there ahead of
        // need may serve it (see `runner.rs`).
        let fresh = !wc.mixed
            && !self
                .interactive_used
                .load(std::sync::atomic::Ordering::Acquire)
            && wc
                .first_tenant
                .as_ref()
                .is_none_or(|t| *t == request.tenant);
        match &wc.first_tenant {
            None => wc.first_tenant = Some(request.tenant.clone()),
            Some(t) if *t != request.tenant => wc.mixed = true,
            Some(_) => {}
        }
        wc.used = true;

        // A snippet runs on the warm runner of its language when one can run it
        // exactly; the agent starts it on first use. Anything else (or a runner
        // that would not start) runs as a program, through the agent.
        let target = self.runner_target(&request);
        if let Some((lang, _)) = &target {
            self.lease_snippets.lock().insert(*lang);
        }
        let mut runner = None;
        if let Some((lang, _)) = &target {
            match self
                .take_runner(&mut wc, *lang, (&request.tenant, fresh), (&cwd, &vars))
                .await
            {
                Ok(r) => runner = Some((*lang, r)),
                Err(e) => {
                    tracing::debug!(sandbox = %self.id, error = %e, "no warm runner; the snippet runs as a program")
                }
            }
        }
        let mark = runner.as_ref().map(|(_, r)| r.worker.usage_mark());
        let started = Instant::now();
        let started_at_ms = unix_ms();
        let timeout = limits.timeout().unwrap_or(Duration::from_secs(30));
        let cap =
            usize::try_from(limits.max_output_bytes.unwrap_or(u64::MAX)).unwrap_or(usize::MAX);
        // The agent is asked to cancel first; past the grace the worker is killed.
        let abort: std::pin::Pin<&mut (dyn std::future::Future<Output = ()> + Send)> = destroyed;
        let (worker, input) = match (&mut runner, target) {
            (Some((_, r)), Some((_, source))) => {
                (&mut r.worker, serde_json::json!({ "code": source }))
            }
            _ => (
                &mut wc.worker,
                serde_json::json!({
                    "argv": argv,
                    "env": vars,
                    "cwd": cwd,
                    "stdin": request.stdin,
                    "max_output_bytes": limits.max_output_bytes,
                }),
            ),
        };
        let (_, turn) = worker
            .invoke(
                request.id.to_string(),
                input,
                sink,
                &cancel,
                started + timeout,
                cap,
                abort,
            )
            .await;
        let who = if runner.is_some() {
            "the container's warm runner"
        } else {
            "the container agent"
        };
        let mut value = None;
        let wall_ms = started.elapsed().as_millis() as u64;
        let counters = wc.counters();
        let (ooms, peak, cpu_ns) = (counters.ooms(), counters.peak(), counters.cpu_ns());
        let pids_max = counters.pids_max_hits();
        let warnings = crate::host::cgroup::pids_warning(pids_max > wc.pids_max_seen, limits);
        wc.pids_max_seen = pids_max;
        wc.ooms_seen = ooms;
        let oom = ooms > ooms_before;
        let cpu_ms = cpu_ns.saturating_sub(cpu_before) / 1_000_000;
        use crate::warm::worker::{TurnEnd, TurnFault};
        let failed = |code: ErrorCode, message: String| Outcome::Failed {
            error: Error::new(code, message),
        };
        let mut outcome = match turn.end {
            Ok(TurnEnd::Output(out)) => {
                let code = out.get("exit_code").and_then(|c| c.as_i64()).unwrap_or(-1) as i32;
                let signal = out.get("signal").and_then(|s| s.as_i64()).map(|s| s as i32);
                // A runner answers with the snippet's value, as the subprocess
                // engine's do.
                if runner.is_some() && code == 0 && !oom {
                    value = out.get("value").cloned();
                }
                if oom {
                    Outcome::LimitExceeded {
                        limit: LimitKind::Memory,
                    }
                } else {
                    Outcome::Completed {
                        exit_code: code,
                        signal,
                    }
                }
            }
            Ok(TurnEnd::Error(e)) if e.code == "CANCELLED" => Outcome::Cancelled,
            Ok(TurnEnd::Error(e)) if e.code == "SPAWN_FAILED" && runner.is_none() => {
                // The container is fine; the program could not start.
                *self.warm.lock() = Some(wc);
                return Err(Error::new(ErrorCode::SpawnFailed, e.message));
            }
            Ok(TurnEnd::Error(e)) => failed(
                ErrorCode::WorkerFailed,
                format!("{who} answered {}: {}", e.code, e.message),
            ),
            Ok(TurnEnd::Suspend(_)) => failed(
                ErrorCode::ProtocolError,
                format!("{who} suspended, which it never does"),
            ),
            Err(TurnFault::TimedOut) => Outcome::TimedOut,
            Err(TurnFault::Cancelled) => Outcome::Cancelled,
            Err(_) if oom => Outcome::LimitExceeded {
                limit: LimitKind::Memory,
            },
            Err(TurnFault::Protocol(e)) => Outcome::Failed { error: e.into() },
            Err(TurnFault::Died(why)) => failed(
                ErrorCode::WorkerFailed,
                format!("the warm container ended during the execution: {why}"),
            ),
        };
        // A container whose turn did not end cleanly (or whose memory ran out) is
        // replaced; the new one starts now, off the next execution's path.
        let mut clean = matches!(outcome, Outcome::Completed { .. });
        let mut unswept = false;
        if let (Some((lang, r)), Some(mark)) = (runner, mark) {
            // A runner stays after a turn that completed with code 0 and left its
            // memory below `max_rss_bytes`; otherwise it goes (killed through its
            // pidfd; the agent reaps it and kills the rest of its session).
            let max_rss = self
                .engine
                .runners
                .as_ref()
                .map_or(0, |s| s.config.max_rss_bytes);
            let mut healthy = matches!(outcome, Outcome::Completed { exit_code: 0, .. })
                && r.worker.usage_since(mark).rss_bytes <= max_rss;
            // What the snippet left running dies with its turn, and the runner with
            // it first (its children, zombies included, are the agent's then): the
            // agent's sweep kills the rest, sparing the other runners and the
            // sandbox's background processes.
            let left = self.left_running(&wc, &r);
            healthy &= !left;
            if healthy {
                wc.runners.insert(lang, r);
            } else if left {
                // Dead before the sweep, which then reaps it and its children.
                let mut r = r;
                r.worker.kill_and_wait(Duration::from_secs(1)).await;
            } else {
                drop(r);
            }
            // Whatever the turn's outcome: a container kept for its background
            // processes must not keep what the snippet started too.
            if left {
                if let Err(e) = wc.control.sweep("turn").await {
                    tracing::warn!(sandbox = %self.id, error = %e, "what a snippet left running could not be killed; the warm container is replaced");
                    clean = false;
                    unswept = true;
                }
            }
        }
        // Background processes live in this container: it stays while they run and
        // it is alive (the agent killed what the turn left behind), unless what a
        // snippet left could not be killed.
        let keep = clean
            || (!unswept
                && self.processes.has_live()
                && wc
                    .worker
                    .exited_within(std::time::Duration::ZERO)
                    .await
                    .is_none());
        if keep {
            *self.warm.lock() = Some(wc);
        } else {
            self.replace_warm(wc).await;
        }
        if outcome != Outcome::Cancelled && !cancel.finish() {
            outcome = Outcome::Cancelled;
        }
        Ok(ExecResult {
            id: request.id,
            outcome,
            stdout_truncated: turn.stdout.truncated,
            stderr_truncated: turn.stderr.truncated,
            stdout: turn.stdout.into_string(),
            stderr: turn.stderr.into_string(),
            value,
            usage: Usage {
                cpu_ms,
                wall_ms,
                peak_memory_bytes: peak,
            },
            engine: self.engine.name.clone(),
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
