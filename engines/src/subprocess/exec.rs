//! One execution in a subprocess sandbox.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;

use paddock_core::ValidRequest;
use paddock_core::{
    unix_ms, CancelToken, EngineName, Error, ErrorCode, ExecRequest, ExecResult, Language,
    LimitKind, Limits, Outcome, OutputSink, Program, Result, StreamKind, Timings, Usage,
};
use tokio::sync::watch;
use tokio::time::Instant;

use super::sandbox::SubprocessSandbox;
use crate::capture::{pump, Captured};
use crate::child::{Ending, StopOnDrop, Watched};
use crate::env::resolve_program;
use crate::host::spawn::{spawn_async, SpawnSpec, SpawnedChild};
use crate::host::sys::{self, cstring, ExitStatus};
use crate::sandbox::WorkdirBacked;
use crate::task::feed_stdin;

/// Sources longer than this go through a file instead of an argument.
const MAX_INLINE_SOURCE: usize = 96 * 1024;

/// Decrements the active count however the execution ends.
struct ActiveGuard<'a>(&'a SubprocessSandbox);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Kills the whole tree (group and cgroup) and reaps the child if the execution ends
/// without reaping it: its future dropped midway, or an error in the waiter.
struct ChildGuard {
    child: Option<SpawnedChild>,
    /// Set once `wait4` collected the child: its pid may be reused from then on, so
    /// the guard must not signal or wait for it.
    reaped: std::sync::atomic::AtomicBool,
    cgroup: Option<std::sync::Arc<crate::host::cgroup::Cgroup>>,
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let Some(child) = self.child.take() else {
            return;
        };
        let reaped = self.reaped.load(Ordering::Acquire);
        if !reaped {
            let _ = sys::pidfd_send_signal(&child.pidfd, libc::SIGKILL);
            sys::kill_group(child.pid, libc::SIGKILL);
        }
        let cgroup = self.cgroup.clone();
        // Off-thread: the freezer kill and wait4 may take a moment.
        std::thread::spawn(move || {
            if let Some(g) = cgroup {
                let _ = g.kill_all();
            }
            if !reaped {
                let _ = sys::reap(child.pid);
            }
            drop(child);
        });
    }
}

impl SubprocessSandbox {
    /// Runs a validated request (the proof made by the scheduler, or by
    /// [`Sandbox::exec`](paddock_core::Sandbox::exec) for a direct caller).
    pub(super) async fn run(
        &self,
        request: ValidRequest,
        sink: &dyn OutputSink,
        cancel: CancelToken,
    ) -> Result<ExecResult> {
        let queued_at_ms = unix_ms();
        let _op = self.enter()?;
        let request = request.into_inner();
        self.engine
            .caps
            .check_program(&EngineName::SUBPROCESS, request.program.kind())?;
        let limits = request
            .limits
            .or(&self.spec.limits)
            .or(&self.engine.defaults);

        self.active.fetch_add(1, Ordering::AcqRel);
        let _active = ActiveGuard(self);
        let _run = self.run_lock.lock().await;
        self.touched_by(Some(&request.tenant));

        // An allowlist's decisions from here to the end are this execution's (one
        // runs at a time; a background process's fall in the window too).
        let gateway = self.egress.lock().clone();
        paddock_egress::Gateway::recording(
            gateway,
            self.run_held(request, limits, sink, cancel, queued_at_ms),
        )
        .await
    }

    /// [`run`](Self::run), with the sandbox's run lock held.
    async fn run_held(
        &self,
        request: ExecRequest,
        limits: Limits,
        sink: &dyn OutputSink,
        cancel: CancelToken,
        queued_at_ms: u64,
    ) -> Result<ExecResult> {
        let destroyed = self.destroy_signal.notified();
        tokio::pin!(destroyed);
        destroyed.as_mut().enable();
        if self.destroying() {
            return Err(Error::disposed(&format!("sandbox {}", self.id)));
        }
        if let Program::Resume { token_id, value } = &request.program {
            let (token_id, value) = (token_id.clone(), value.clone());
            return self
                .resume_warm(&request, &token_id, value, sink, cancel, destroyed)
                .await;
        }
        if self.warm_target(&request).is_some() {
            return self
                .run_warm(request, limits, sink, cancel, queued_at_ms, destroyed)
                .await;
        }

        let (out_r, out_w) = sys::pipe().map_err(|e| Error::engine_io("creating a pipe", e))?;
        let (err_r, err_w) = sys::pipe().map_err(|e| Error::engine_io("creating a pipe", e))?;
        let (in_r, in_w) = match &request.stdin {
            Some(_) => {
                let (r, w) = sys::pipe().map_err(|e| Error::engine_io("creating a pipe", e))?;
                (r, Some(w))
            }
            None => (
                std::fs::File::open("/dev/null")
                    .map_err(|e| Error::engine_io("opening /dev/null", e))?
                    .into(),
                None,
            ),
        };
        let spec = self.prepare(&request, &limits, [in_r, out_w, err_w])?;
        let stdin_data = request.stdin.clone().map(String::into_bytes);

        if let Some(g) = &self.cgroup {
            g.set_limits(&limits).map_err(|e| {
                crate::host::cgroup::limits_error(e, limits.memory_bytes, "setting cgroup limits")
            })?;
        }

        // Off the actor thread; the spec (our copies of the child's ends) goes there.
        let child = spawn_async(spec).await.map_err(|e| {
            let stage = e.stage.map_or("starting the program", |s| s.describe());
            Error::new(
                ErrorCode::SpawnFailed,
                format!(
                    "{stage} failed: {}; check the program and its limits",
                    e.error
                ),
            )
        })?;
        let started = Instant::now();
        let started_at_ms = unix_ms();
        let mut guard = ChildGuard {
            child: Some(child),
            reaped: std::sync::atomic::AtomicBool::new(false),
            cgroup: self.cgroup.clone(),
        };
        let (pid, pidfd) = {
            let c = guard.child.as_ref().expect("just set");
            (
                c.pid,
                c.pidfd
                    .try_clone()
                    .map_err(|e| Error::engine_io("cloning the pidfd", e))?,
            )
        };

        let cap = limits.max_output_bytes.unwrap_or(u64::MAX);
        let (stop_tx, stop_rx) = watch::channel(None::<Instant>);
        let stdout = pump(out_r, StreamKind::Stdout, cap, sink, stop_rx.clone());
        let stop_rx_feed = stop_rx.clone();
        let stderr = pump(err_r, StreamKind::Stderr, cap, sink, stop_rx);
        let feed = feed_stdin(in_w, stdin_data, stop_rx_feed);
        let deadline = limits.timeout().map(|t| started + t);
        let reaped = &guard.reaped;

        let waiter = async {
            let _stop = StopOnDrop(&stop_tx);
            let child = Watched::new(pid, pidfd, "the child")?;
            let ending = child.ending(&cancel, destroyed.as_mut(), deadline).await?;
            // Then reap, then sweep what escaped the group.
            let kill = self.kill_everything(pid, child.pidfd());
            let status = child.stop_and_reap(ending, kill, None).await?;
            reaped.store(true, Ordering::Release);
            if let Some(g) = &self.cgroup {
                if g.is_populated() {
                    let g = g.clone();
                    crate::task::blocking(move || {
                        g.kill_all()
                            .map_err(|e| Error::engine_io("killing leftover processes", e))
                    })
                    .await?;
                }
            }
            Ok::<_, Error>((ending, status))
        };

        let (waited, out, err, ()) = tokio::join!(waiter, stdout, stderr, feed);
        // The child was reaped (or the waiter failed and the guard kills it).
        let (ending, status) = match waited {
            Ok(v) => {
                // Reaped and swept: nothing left for the guard to do.
                guard.child = None;
                v
            }
            // The guard kills what is left (cgroup included) and reaps if needed.
            Err(e) => return Err(e),
        };
        let wall_ms = started.elapsed().as_millis() as u64;
        let out = out.unwrap_or_default();
        let err = err.unwrap_or_default();

        let oom = self.cgroup.as_ref().is_some_and(|g| g.new_oom_kills() > 0);
        let mut outcome = classify(ending, &status, oom, &limits);
        // Exactly one terminal state: a cancel that won the race is reported as such.
        if ending != Ending::Cancelled && !cancel.finish() {
            outcome = Outcome::Cancelled;
        }
        let refused_forks = self
            .cgroup
            .as_ref()
            .is_some_and(|g| g.new_pids_max_hits() > 0);
        let warnings =
            crate::host::cgroup::pids_warning(refused_forks && ending == Ending::Exited, &limits);
        Ok(ExecResult {
            id: request.id,
            outcome,
            stdout_truncated: out.truncated,
            stderr_truncated: err.truncated,
            stdout: Captured::into_string(out),
            stderr: Captured::into_string(err),
            value: None,
            usage: Usage {
                cpu_ms: status.cpu_ms,
                wall_ms,
                peak_memory_bytes: status.max_rss_bytes,
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

    /// SIGKILL to the child, its group and (if any) everything in the cgroup.
    async fn kill_everything(&self, pid: libc::pid_t, pidfd: &OwnedFd) {
        let _ = sys::pidfd_send_signal(pidfd, libc::SIGKILL);
        sys::kill_group(pid, libc::SIGKILL);
        if let Some(g) = &self.cgroup {
            let g = g.clone();
            let _ = crate::task::blocking(move || {
                g.kill_all()
                    .map_err(|e| Error::engine_io("killing the sandbox's processes", e))
            })
            .await;
        }
    }

    /// Builds the spawn spec (argv, env, rlimits, cgroup, netns) for a request.
    fn prepare(
        &self,
        request: &ExecRequest,
        limits: &Limits,
        stdio: [OwnedFd; 3],
    ) -> Result<SpawnSpec> {
        let engine = &self.engine;
        let argv: Vec<String> = match &request.program {
            Program::Command { argv } => argv.clone(),
            Program::Code { language, source } => {
                let interp = match engine.support.interpreters.get(language) {
                    Some(Ok(p)) => p.path().to_string_lossy().into_owned(),
                    _ => return Err(super::missing_interpreter(engine, *language)),
                };
                let flag = match language {
                    Language::Python => "-c",
                    Language::Javascript => "-e",
                    Language::Shell => "-c",
                };
                if source.len() <= MAX_INLINE_SOURCE {
                    vec![interp, flag.into(), source.clone()]
                } else {
                    // Too long for one argument (the kernel caps each at 128 KiB).
                    let file = self.private_source_file(*language, source)?;
                    vec![interp, file]
                }
            }
            Program::Resume { .. } => {
                return Err(Error::new(
                    ErrorCode::CapabilityNotSupported,
                    "a resume runs on the sandbox's warm handler, not in a cold process",
                ))
            }
            Program::Invoke { handler, .. } => {
                return Err(Error::new(
                    ErrorCode::CapabilityNotSupported,
                    format!(
                        "no warm worker can run handler `{handler}`: name a handler configured in [subprocess.handlers], or `module:function` with the warm Python runner, and pass no stdin, env, cwd or rlimits of its own"
                    ),
                ))
            }
        };
        self.spawn_spec(
            argv,
            &request.env,
            request.cwd.as_deref(),
            limits,
            stdio,
            self.cgroup.as_deref(),
        )
    }

    /// The spawn spec for `argv` in this sandbox: sanitized environment plus `extra_env`,
    /// rlimits from `limits`, the given cgroup and the sandbox's network namespace.
    pub(super) fn spawn_spec(
        &self,
        argv: Vec<String>,
        extra_env: &std::collections::BTreeMap<String, String>,
        cwd: Option<&str>,
        limits: &Limits,
        stdio: [OwnedFd; 3],
        cgroup: Option<&crate::host::cgroup::Cgroup>,
    ) -> Result<SpawnSpec> {
        let engine = &self.engine;
        let root = self.workdir.root();
        // Beneath the workdir, checked by the kernel like a file path.
        let cwd = match cwd {
            Some(c) => self.workdir.resolve_dir(c)?,
            None => root.to_path_buf(),
        };
        // Where the program sees them: the same paths, or under the sandbox's home
        // in its own mount namespace.
        let shown = self.workdir.shown_root();
        let seen_cwd = match cwd.strip_prefix(root) {
            Ok(rel) if shown != root && rel.as_os_str().is_empty() => shown.to_path_buf(),
            Ok(rel) if shown != root => shown.join(rel),
            _ => cwd.clone(),
        };
        let mut env = engine.base_env.clone();
        // An allowlist's programs join its gateway's namespace, and are pointed at
        // its proxy (a request's own variables may say otherwise: the namespace's
        // rules hold either way). Without its gateway nothing runs (fail closed).
        let egress = self.egress.lock().clone();
        if matches!(
            self.spec.network,
            paddock_core::NetworkPolicy::Allowlist { .. }
        ) {
            if egress.is_none() {
                return Err(Error::disposed(&format!("sandbox {}", self.id)));
            }
            env.extend(paddock_egress::Gateway::proxy_env());
        }
        env.insert("HOME".into(), shown.to_string_lossy().into_owned());
        env.insert("PWD".into(), seen_cwd.to_string_lossy().into_owned());
        env.insert("TMPDIR".into(), shown.to_string_lossy().into_owned());
        for (k, v) in extra_env {
            env.insert(k.clone(), v.clone());
        }
        let path_var = env.get("PATH").cloned().unwrap_or_default();
        let program = resolve_program(&argv[0], &path_var, &cwd).ok_or_else(|| {
            Error::new(
                ErrorCode::SpawnFailed,
                format!(
                    "`{}` was not found or is not executable (PATH={path_var})",
                    argv[0]
                ),
            )
        })?;

        let io_err = |e: std::io::Error| Error::invalid_options("program", e.to_string());
        let mut rlimits = vec![(libc::RLIMIT_CORE, 0u64, 0u64)];
        let clamp = |resource, want: u64| {
            let (_, hard) = sys::getrlimit(resource);
            (resource, want.min(hard), want.min(hard))
        };
        if let Some(ms) = limits.cpu_ms {
            let (soft, hard) = crate::host::sys::cpu_rlimit(ms);
            rlimits.push((libc::RLIMIT_CPU, soft, hard));
        }
        if let Some(b) = limits.file_size_bytes {
            rlimits.push(clamp(libc::RLIMIT_FSIZE, b));
        }
        if let Some(n) = limits.open_files {
            rlimits.push(clamp(libc::RLIMIT_NOFILE, n));
        }
        if cgroup.is_none() {
            // Fallbacks without a cgroup: address space for memory (coarse: it counts
            // reservations) and RLIMIT_NPROC (binds nothing for root).
            if let Some(m) = limits.memory_bytes {
                rlimits.push(clamp(libc::RLIMIT_AS, m));
            }
            if let Some(p) = limits.pids {
                rlimits.push(clamp(libc::RLIMIT_NPROC, p));
            }
        }

        // A sandbox with a home runs nothing outside its namespace: once teardown has
        // dropped it, nothing spawns (fail closed).
        let mntns = self.mntns.lock().as_ref().map(|fd| fd.as_raw_fd());
        if self.spec.home.is_some() && mntns.is_none() {
            return Err(Error::disposed(&format!("sandbox {}", self.id)));
        }
        let spec = SpawnSpec {
            path: cstring(program.into_os_string().into_encoded_bytes()).map_err(io_err)?,
            argv: argv
                .into_iter()
                .map(cstring)
                .collect::<std::io::Result<_>>()
                .map_err(io_err)?,
            env: env
                .into_iter()
                .map(|(k, v)| cstring(format!("{k}={v}")))
                .collect::<std::io::Result<_>>()
                .map_err(io_err)?,
            cwd: cstring(seen_cwd.into_os_string().into_encoded_bytes()).map_err(io_err)?,
            stdio,
            fd3: None,
            rlimits,
            cgroup_procs: cgroup.map(|g| g.procs_files().to_vec()).unwrap_or_default(),
            // Held while the sandbox lives, like the mount namespace below.
            netns: self
                .netns
                .as_ref()
                .map(|fd| fd.as_raw_fd())
                .or_else(|| egress.as_ref().map(|g| g.netns().as_raw_fd())),
            // Held while the sandbox lives: teardown drops it only once no operation
            // (and so no spawn) is left.
            mntns,
            controlling_tty: false,
        };
        Ok(spec)
    }

    /// Three `/dev/null` descriptors, for a spec whose stdio the caller replaces.
    pub(super) fn placeholder_stdio(&self) -> Result<[OwnedFd; 3]> {
        let null = || -> Result<OwnedFd> {
            Ok(std::fs::File::open("/dev/null")
                .map_err(|e| Error::engine_io("opening /dev/null", e))?
                .into())
        };
        Ok([null()?, null()?, null()?])
    }

    /// Writes a long source to a file beside (not inside) the workdir.
    fn private_source_file(&self, language: Language, source: &str) -> Result<String> {
        let ext = match language {
            Language::Python => "py",
            Language::Javascript => "js",
            Language::Shell => "sh",
        };
        let path = self
            .engine
            .workdir_root
            .join(format!("{}.source.{ext}", self.id));
        std::fs::write(&path, source)
            .map_err(|e| Error::engine_io("writing the source file", e))?;
        Ok(path.to_string_lossy().into_owned())
    }
}

/// Maps how the program ended to an outcome.
fn classify(ending: Ending, status: &ExitStatus, oom: bool, limits: &Limits) -> Outcome {
    match ending {
        Ending::Cancelled | Ending::Destroyed => return Outcome::Cancelled,
        Ending::Deadline => return Outcome::TimedOut,
        Ending::Exited => {}
    }
    if oom {
        return Outcome::LimitExceeded {
            limit: LimitKind::Memory,
        };
    }
    match status.signal {
        Some(libc::SIGXCPU) => Outcome::LimitExceeded {
            limit: LimitKind::Cpu,
        },
        // The soft limit sends SIGXCPU; a program that ignores it is killed with
        // SIGKILL at the hard limit, a second later (`sys::cpu_rlimit`). The CPU time
        // wait4 reports for the dead child can fall a few percent short of what the
        // kernel's limit check counted (seen: 973 ms for a 1 s limit on a loaded
        // machine), so a SIGKILL within 5 % (at least 50 ms) of the limit is the limit.
        Some(libc::SIGKILL)
            if limits.cpu_ms.is_some_and(|ms| {
                let limit = ms.div_ceil(1000) * 1000;
                status.cpu_ms + (limit / 20).max(50) >= limit
            }) =>
        {
            Outcome::LimitExceeded {
                limit: LimitKind::Cpu,
            }
        }
        Some(libc::SIGXFSZ) => Outcome::LimitExceeded {
            limit: LimitKind::FileSize,
        },
        Some(sig) => Outcome::Completed {
            exit_code: 128 + sig,
            signal: Some(sig),
        },
        None => Outcome::Completed {
            exit_code: status.code.unwrap_or(-1),
            signal: None,
        },
    }
}
