//! A cold execution of the container engine: one container per execution, created
//! by the OCI runtime over the sandbox's workdir, watched, killed and classified (the
//! accounting and the classification are in `usage.rs`; the one-off containers of
//! `run_raw` and the engine's probe in `probe.rs`).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use paddock_core::ValidRequest;
use paddock_core::{
    unix_ms, CancelToken, Error, ErrorCode, ExecRequest, ExecResult, Language, Limits, Outcome,
    OutputSink, Program, Result, StreamKind, Timings, Usage,
};
use tokio::sync::watch;
use tokio::time::Instant;

use super::bundle::{self, BundleSpec};
use super::usage::{classify, cpu_quota_us, SandboxUsage};
use super::EngineInner;
use crate::capture::{pump, Captured};
use crate::child::{Ending, StopOnDrop, Watched};
use crate::host::sys;
use crate::sandbox::WorkdirBacked;
use crate::task::{blocking, feed_stdin};

use super::sandbox::{ContainerSandbox, FileMount, MAX_INLINE_SOURCE, RUNTIME_GRACE};

impl ContainerSandbox {
    /// The argv to run inside the container, and files to bind for it.
    pub(super) fn argv(
        &self,
        program: &Program,
        bundle_dir: Option<&Path>,
    ) -> Result<(Vec<String>, Vec<FileMount>)> {
        match program {
            Program::Command { argv } => Ok((argv.clone(), Vec::new())),
            Program::Code { language, source } => {
                let interp = self.engine.interpreters.get(language).ok_or_else(|| {
                    Error::new(
                        ErrorCode::CapabilityNotSupported,
                        format!(
                            "{language} code cannot run in this container root: no interpreter was found in it"
                        ),
                    )
                })?;
                let (flag, ext) = match language {
                    Language::Python => ("-c", "py"),
                    Language::Javascript => ("-e", "js"),
                    Language::Shell => ("-c", "sh"),
                };
                if source.len() <= MAX_INLINE_SOURCE {
                    Ok((
                        vec![interp.clone(), flag.into(), source.clone()],
                        Vec::new(),
                    ))
                } else if let Some(bundle_dir) = bundle_dir {
                    // Too long for one argument: bound read-only from the bundle.
                    let host = bundle_dir.join(format!("source.{ext}"));
                    self.write_source(&host, source)
                        .map_err(|e| Error::engine_io("writing the source file", e))?;
                    let inside = format!("/tmp/.paddock-source.{ext}");
                    Ok((
                        vec![interp.clone(), inside.clone()],
                        vec![(host.to_string_lossy().into_owned(), inside)],
                    ))
                } else {
                    Err(Error::new(
                        ErrorCode::EngineFailed,
                        "a long source needs a container of its own",
                    ))
                }
            }
            Program::Invoke { .. } | Program::Resume { .. } => Err(Error::new(
                ErrorCode::CapabilityNotSupported,
                "the container engine runs commands and code, not json-stdio handlers",
            )),
        }
    }

    /// Writes a long source for the container to read: only this process's user
    /// and the container's root (its mapped host id, with a user namespace) may.
    fn write_source(&self, host: &Path, source: &str) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(host)?;
        if let Some((first, _)) = self.ids() {
            std::os::unix::fs::fchown(&file, Some(first), Some(first))?;
        }
        file.write_all(source.as_bytes())
    }

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
        self.refuse_if_paused()?;
        let request = request.into_inner();
        self.engine
            .caps
            .check_program(&self.engine.name, request.program.kind())?;
        let limits = request
            .limits
            .or(&self.spec.limits)
            .or(&self.engine.defaults);
        self.active.fetch_add(1, Ordering::AcqRel);
        let _active = ActiveGuard(self);
        let _run = self.run_lock.lock().await;
        // An allowlist's decisions from here to the end are this execution's.
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
        self.refuse_if_paused()?;

        let (cwd, vars) = self.guest_env(request.cwd.as_deref(), &request.env)?;

        if self.warm_fits(&request) {
            if let Some(mut wc) = self.take_warm().await {
                match wc.wait_ready().await {
                    Ok(()) => {
                        return self
                            .run_warm(
                                wc,
                                request,
                                &limits,
                                (cwd, vars),
                                sink,
                                cancel,
                                destroyed,
                                queued_at_ms,
                            )
                            .await;
                    }
                    Err(why) => {
                        // The warm container never came up (seen: runsc exiting at
                        // start under load): nothing ran in it, so the execution
                        // runs cold instead, and a new warm container is started.
                        tracing::warn!(sandbox = %self.id, %why, "a warm container did not start; running cold");
                        self.replace_warm(wc).await;
                    }
                }
            }
        }

        let k = self.next_container.fetch_add(1, Ordering::Relaxed);
        let container_id = format!("{}-{k}", self.id);
        let container_cgroup = format!("{}/c{k}", self.cgroup);
        let bundle_dir = self.engine.root.join("bundles").join(&container_id);
        std::fs::create_dir(&bundle_dir)
            .map_err(|e| Error::engine_io("creating the container bundle", e))?;
        let _bundle = RemoveOnDrop(bundle_dir.clone());
        let (args, files) = self.argv(&request.program, Some(&bundle_dir))?;
        let args = super::with_init(&self.engine, args);
        let env: Vec<String> = vars.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut rlimits: Vec<(&'static str, u64, u64)> = vec![("RLIMIT_CORE", 0, 0)];
        let clamp = |resource, want: u64| want.min(sys::getrlimit(resource).1);
        if let Some(ms) = limits.cpu_ms {
            let (soft, hard) = sys::cpu_rlimit(ms);
            rlimits.push(("RLIMIT_CPU", soft, hard));
        }
        if let Some(b) = limits.file_size_bytes {
            let b = clamp(libc::RLIMIT_FSIZE, b);
            rlimits.push(("RLIMIT_FSIZE", b, b));
        }
        let open_files = clamp(libc::RLIMIT_NOFILE, limits.open_files.unwrap_or(1024));
        rlimits.push(("RLIMIT_NOFILE", open_files, open_files));
        let netns = self.netns_path()?;
        let config = bundle::config(&BundleSpec {
            args: &args,
            env: &env,
            cwd: &cwd,
            rootfs: &self.engine.rootfs,
            host_usr: self.engine.host_usr,
            workdir: self.workdir.root(),
            home: self.home(),
            files: &files,
            cgroups_path: &container_cgroup,
            memory_bytes: limits.memory_bytes,
            pids: limits.pids,
            cpu_quota_us: cpu_quota_us(&self.engine, &limits),
            rlimits: &rlimits,
            seccomp: self.engine.seccomp,
            hostname: "paddock",
            ids: self.ids(),
            user_space_kernel: self.engine.runtime.kind.user_space_kernel(),
            netns: netns.as_deref(),
        });
        bundle::write_config(&bundle_dir, &config)
            .map_err(|e| Error::engine_io("writing config.json", e))?;

        // The container's own group has the limit; the sandbox group (its parent,
        // which outlives it) only has its peak reset, to tell an OOM kill apart.
        let usage = SandboxUsage::start(&self.engine, &self.cgroup);

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
        let pid_file = bundle_dir.join("init.pid");
        let bundle_arg = bundle_dir.to_string_lossy().into_owned();
        let pid_arg = pid_file.to_string_lossy().into_owned();
        let child = self
            .engine
            .runtime
            .start(
                &[
                    "run",
                    "--bundle",
                    &bundle_arg,
                    "--pid-file",
                    &pid_arg,
                    &container_id,
                ],
                [in_r, out_w, err_w],
                &bundle_dir,
            )
            .map_err(|e| {
                Error::new(
                    ErrorCode::SpawnFailed,
                    format!("starting {} failed: {e}", self.engine.info.kind.as_str()),
                )
            })?;
        let started = Instant::now();
        let started_at_ms = unix_ms();
        let mut guard = RuntimeGuard {
            child: Some(child),
            engine: self.engine.clone(),
            container_cgroup: container_cgroup.clone(),
            container_id: container_id.clone(),
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
        let stderr = pump(err_r, StreamKind::Stderr, cap, sink, stop_rx.clone());
        let feed = feed_stdin(in_w, request.stdin.clone().map(String::into_bytes), stop_rx);
        let deadline = limits.timeout().map(|t| started + t);

        let waiter = async {
            let _stop = StopOnDrop(&stop_tx);
            let runtime = Watched::new(pid, pidfd, "the runtime")?;
            let ending = runtime
                .ending(&cancel, destroyed.as_mut(), deadline)
                .await?;
            // Every process of the container dies; its init's death ends the
            // container and the runtime removes it (the runtime's group is killed if
            // it does not exit within its grace).
            let kill = self.kill_container(&container_cgroup);
            let status = runtime
                .stop_and_reap(ending, kill, Some(RUNTIME_GRACE))
                .await?;
            Ok::<_, Error>((ending, status))
        };
        let (waited, out, err, ()) = tokio::join!(waiter, stdout, stderr, feed);
        let (ending, status) = waited?;
        // Reaped: the guard only needs to make sure the container is gone.
        guard.reaped();
        let wall_ms = started.elapsed().as_millis() as u64;
        let out = out.unwrap_or_default();
        let err = err.unwrap_or_default();
        let container_started = pid_file.exists();
        if !container_started && ending == Ending::Exited {
            let why = String::from_utf8_lossy(&err.data);
            return Err(Error::new(
                ErrorCode::SpawnFailed,
                format!(
                    "{} could not start the container (exit {:?}): {}",
                    self.engine.info.kind.as_str(),
                    status.code,
                    why.trim().chars().take(2000).collect::<String>()
                ),
            ));
        }

        let (peak, oom, cpu_ms) = usage.finish(limits.memory_bytes);
        let mut outcome = classify(ending, status.code, oom, &limits, cpu_ms);
        if ending != Ending::Cancelled && !cancel.finish() {
            outcome = Outcome::Cancelled;
        }
        Ok(ExecResult {
            id: request.id,
            outcome,
            stdout_truncated: out.truncated,
            stderr_truncated: err.truncated,
            stdout: Captured::into_string(out),
            stderr: Captured::into_string(err),
            value: None,
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
            // The runtime removed the container's group, which counted the forks its
            // pids limit refused, with the container: there is nothing to read.
            warnings: Vec::new(),
            egress: None,
        })
    }

    /// Kills every process in the container's cgroup (see
    /// `EngineInner::kill_container`).
    pub(super) async fn kill_container(&self, container_cgroup: &str) {
        let engine = self.engine.clone();
        let cgroup = container_cgroup.to_string();
        let _ = blocking(move || {
            engine
                .kill_container(&cgroup)
                .map_err(|e| Error::engine_io("killing the container", e))
        })
        .await;
    }
}

/// Kills the container and the runtime if the execution ends without reaping the
/// runtime (its future dropped midway, or an error), off-thread.
pub(super) struct RuntimeGuard {
    child: Option<crate::host::spawn::SpawnedChild>,
    engine: Arc<EngineInner>,
    container_cgroup: String,
    container_id: String,
}

impl RuntimeGuard {
    pub(super) fn reaped(&mut self) {
        self.child = None;
    }
}

impl Drop for RuntimeGuard {
    fn drop(&mut self) {
        let Some(child) = self.child.take() else {
            return;
        };
        let engine = self.engine.clone();
        let cgroup = std::mem::take(&mut self.container_cgroup);
        let id = std::mem::take(&mut self.container_id);
        std::thread::spawn(move || {
            let _ = engine.kill_container(&cgroup);
            sys::kill_group(child.pid, libc::SIGKILL);
            let _ = sys::reap(child.pid);
            let _ = engine
                .runtime
                .run_blocking(&["delete", "--force", &id], &engine.root);
            engine.remove_cgroup(&cgroup);
            drop(child);
        });
    }
}

pub(super) struct ActiveGuard<'a>(&'a ContainerSandbox);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

pub(super) struct RemoveOnDrop(pub(super) PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
