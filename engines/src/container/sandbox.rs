//! A container sandbox: a workdir bound at `/workspace`, a cgroup the sandbox's
//! containers live under, and one container per execution.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use paddock_core::lifecycle::{DestroyRole, Lifecycle, OpGuard, Phase};
use paddock_core::{
    unix_ms, CancelToken, EngineName, Error, ErrorCode, ExecRequest, ExecResult, FileEntry,
    Language, LimitKind, Limits, Outcome, OutputSink, Program, Result, Sandbox, SandboxSpec,
    SandboxStatus, StreamKind, Timings, Usage,
};
use tokio::io::Interest;
use tokio::sync::{watch, Mutex, Notify};
use tokio::time::Instant;

use super::bundle::{self, BundleSpec, CONTAINER_PATH, WORKSPACE};
use super::warm::WarmContainer;
use super::EngineInner;
use crate::capture::{pump, Captured};
use crate::host::sys;
use crate::host::workdir::Workdir;
use crate::task::{blocking, feed_stdin, sleep_until_opt};

/// A host file bound read-only into the container: (host path, path inside).
type FileMount = (String, String);

/// How long output pipes may stay open after the runtime has exited.
const DRAIN_GRACE: Duration = Duration::from_millis(200);
/// How long the runtime has to exit after its container was killed before it is
/// killed too.
const RUNTIME_GRACE: Duration = Duration::from_secs(5);
/// Sources longer than this are bound into the container from a file.
const MAX_INLINE_SOURCE: usize = 96 * 1024;

/// A sandbox of the container engine. Executions run one at a time, each in its own
/// container over the sandbox's workdir.
#[derive(Debug)]
pub struct ContainerSandbox {
    pub(super) id: String,
    pub(super) engine: Arc<EngineInner>,
    spec: SandboxSpec,
    workdir: Arc<Workdir>,
    /// The sandbox's cgroup path; containers are its children.
    cgroup: String,
    run_lock: Mutex<()>,
    active: AtomicUsize,
    lifecycle: Lifecycle,
    destroy_signal: Notify,
    teardown_error: parking_lot::Mutex<Option<Error>>,
    next_container: AtomicU64,
    /// The warm container (taken out while it serves a turn).
    warm: parking_lot::Mutex<Option<WarmContainer>>,
    /// Whether the sandbox is paused (its containers frozen).
    paused: std::sync::atomic::AtomicBool,
    /// Background processes and terminals (in the warm container).
    pub(super) processes: crate::interactive::Processes,
    /// The current warm container's agent and pid file, also while it serves a turn.
    pub(super) guest: parking_lot::Mutex<Option<super::interactive::Guest>>,
    /// Whether a process or terminal ran since the last recycle (the warm container
    /// is then replaced, as after an execution).
    interactive_used: std::sync::atomic::AtomicBool,
}

/// Why the wait for the container ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Exited,
    Deadline,
    Cancelled,
    Destroyed,
}

impl ContainerSandbox {
    pub(super) async fn create(engine: Arc<EngineInner>, spec: &SandboxSpec) -> Result<Self> {
        engine
            .caps
            .check_level(&EngineName::CONTAINER, spec.level)?;
        engine
            .caps
            .check_network(&EngineName::CONTAINER, &spec.network)?;
        spec.limits.validate("limits", false)?;
        let n = engine.next_sandbox.fetch_add(1, Ordering::Relaxed);
        let id = format!(
            "ct-{}-{n}",
            &uuid::Uuid::now_v7().simple().to_string()[..20]
        );
        let cgroup = format!("{}/{id}", engine.cgroup_base);
        let eng = engine.clone();
        let (id2, cg2) = (id.clone(), cgroup.clone());
        let workdir = tokio::task::spawn_blocking(move || -> Result<Workdir> {
            let workdir = Workdir::create(&eng.root.join("sandboxes"), &id2)
                .map_err(|e| Error::engine_io("creating the sandbox workdir", e))?;
            // The sandbox's memory group: the containers' parent, with their limit.
            if let Some(dir) = eng.cgroup_dir("memory", &cg2) {
                if let Err(e) = std::fs::create_dir_all(&dir) {
                    let _ = workdir.remove();
                    return Err(Error::engine_io("creating the sandbox cgroup", e));
                }
            }
            Ok(workdir)
        })
        .await
        .map_err(|e| {
            Error::new(
                ErrorCode::EngineFailed,
                format!("sandbox setup failed: {e}"),
            )
        })??;
        Ok(ContainerSandbox {
            id,
            engine,
            spec: spec.clone(),
            workdir: Arc::new(workdir),
            cgroup,
            run_lock: Mutex::new(()),
            active: AtomicUsize::new(0),
            lifecycle: Lifecycle::new(),
            destroy_signal: Notify::new(),
            teardown_error: parking_lot::Mutex::new(None),
            next_container: AtomicU64::new(0),
            warm: parking_lot::Mutex::new(None),
            paused: std::sync::atomic::AtomicBool::new(false),
            processes: Default::default(),
            guest: parking_lot::Mutex::new(None),
            interactive_used: std::sync::atomic::AtomicBool::new(false),
        })
        .inspect(|sandbox| sandbox.prewarm())
    }

    pub(super) fn refuse_if_paused(&self) -> Result<()> {
        if self.paused.load(Ordering::Acquire) {
            return Err(Error::new(
                ErrorCode::SandboxPaused,
                format!("sandbox {} is paused; unpause it, then retry", self.id),
            ));
        }
        Ok(())
    }

    /// Freezes (or thaws) the sandbox's freezer group: every container of the
    /// sandbox, and any started while it is frozen.
    async fn set_frozen(&self, frozen: bool) -> Result<()> {
        let Some(dir) = self.engine.cgroup_dir("freezer", &self.cgroup) else {
            return Err(Error::new(
                ErrorCode::CapabilityNotSupported,
                "pausing needs the cgroup v1 freezer, which is not mounted",
            ));
        };
        blocking(move || {
            std::fs::create_dir_all(&dir)
                .map_err(|e| Error::engine_io("creating the sandbox's freezer group", e))?;
            crate::host::cgroup::set_frozen(&dir, frozen).map_err(|e| {
                Error::engine_io(
                    if frozen {
                        "freezing the sandbox"
                    } else {
                        "thawing the sandbox"
                    },
                    e,
                )
            })
        })
        .await
    }

    /// The runtime's id of the sandbox's warm container, while it has an idle one.
    pub fn warm_container_id(&self) -> Option<String> {
        self.warm.lock().as_ref().map(|w| w.id.clone())
    }

    /// Starts the warm container, when the engine has an agent; a failure leaves the
    /// sandbox cold (each execution then starts its own container).
    fn prewarm(&self) {
        if self.engine.agent.is_err() {
            return;
        }
        match self.start_warm() {
            Ok(wc) => *self.warm.lock() = Some(wc),
            Err(e) => tracing::warn!(sandbox = %self.id, error = %e, "no warm container"),
        }
    }

    pub(super) fn start_warm(&self) -> Result<WarmContainer> {
        let k = self.next_container.fetch_add(1, Ordering::Relaxed);
        let limits = self.spec.limits.or(&self.engine.defaults);
        let wc = WarmContainer::start(
            &self.engine,
            &self.cgroup,
            self.workdir.root(),
            (format!("{}-w{k}", self.id), format!("w{k}")),
            &limits,
        )?;
        *self.guest.lock() = Some(super::interactive::Guest {
            control: wc.control.clone(),
            pid_file: wc.pid_file(),
            cgroup: wc.cgroup.clone(),
        });
        Ok(wc)
    }

    /// Whether `request` can run in the warm container exactly as it would in a
    /// fresh one: rlimits count a process's whole life, so a request with its own
    /// CPU, file-size or open-files limit gets a container of its own, as does a
    /// source too long to pass as an argument.
    fn warm_fits(&self, request: &ExecRequest) -> bool {
        let l = &request.limits;
        let short = match &request.program {
            Program::Code { source, .. } => source.len() <= MAX_INLINE_SOURCE,
            _ => true,
        };
        short && l.cpu_ms.is_none() && l.file_size_bytes.is_none() && l.open_files.is_none()
    }

    /// The working directory inside the container for `cwd`, and the environment.
    ///
    /// The environment is an allow-list, never the host's: the host variables
    /// `container.env_passthrough` names, then the container's own `PATH`, `HOME`,
    /// `PWD` and `TMPDIR`, then `extra` (the request's `env`).
    pub(super) fn guest_env(
        &self,
        cwd: Option<&str>,
        extra: &std::collections::BTreeMap<String, String>,
    ) -> Result<(String, std::collections::BTreeMap<String, String>)> {
        let cwd = match cwd {
            Some(c) => self.guest_cwd(c)?,
            None => WORKSPACE.to_string(),
        };
        let vars = guest_vars(&self.engine.passthrough_env, &cwd, extra);
        Ok((cwd, vars))
    }

    /// The container path of the working directory `cwd`: `/workspace/…` as the
    /// program sees it, or a path relative to the workdir (or a host path inside
    /// it). It is resolved on the host beneath the workdir (see
    /// [`Workdir::resolve_dir`]): it must exist, and a symlink out of the workdir is
    /// refused with `PATH_ESCAPE`, as the files API refuses it.
    fn guest_cwd(&self, cwd: &str) -> Result<String> {
        let inside = match cwd.strip_prefix(WORKSPACE) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => rest.trim_start_matches('/'),
            _ => cwd,
        };
        let dir = self.workdir.resolve_dir_as(inside, cwd)?;
        let rel = dir
            .strip_prefix(self.workdir.root())
            .unwrap_or(Path::new(""));
        Ok(if rel.as_os_str().is_empty() {
            WORKSPACE.to_string()
        } else {
            format!("{WORKSPACE}/{}", rel.to_string_lossy())
        })
    }

    /// Notes that a process or terminal ran in the warm container.
    pub(super) fn mark_used(&self) {
        self.interactive_used.store(true, Ordering::Release);
    }

    pub(super) fn enter(&self) -> Result<OpGuard<'_>> {
        self.lifecycle
            .enter()
            .ok_or_else(|| Error::disposed(&format!("sandbox {}", self.id)))
    }

    fn destroying(&self) -> bool {
        self.lifecycle.phase() != Phase::Live
    }

    async fn file_op<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Workdir) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let _op = self.enter()?;
        let workdir = self.workdir.clone();
        blocking(move || op(&workdir)).await
    }

    /// The argv to run inside the container, and files to bind for it.
    fn argv(
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
                    std::fs::write(&host, source)
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

    async fn run(
        &self,
        request: ExecRequest,
        sink: &dyn OutputSink,
        cancel: CancelToken,
    ) -> Result<ExecResult> {
        let queued_at_ms = unix_ms();
        let _op = self.enter()?;
        self.refuse_if_paused()?;
        request.validate()?;
        self.engine
            .caps
            .check_program(&EngineName::CONTAINER, request.program.kind())?;
        let limits = request
            .limits
            .or(&self.spec.limits)
            .or(&self.engine.defaults);
        self.active.fetch_add(1, Ordering::AcqRel);
        let _active = ActiveGuard(self);
        let _run = self.run_lock.lock().await;
        let destroyed = self.destroy_signal.notified();
        tokio::pin!(destroyed);
        destroyed.as_mut().enable();
        if self.destroying() {
            return Err(Error::disposed(&format!("sandbox {}", self.id)));
        }
        self.refuse_if_paused()?;

        let (cwd, vars) = self.guest_env(request.cwd.as_deref(), &request.env)?;

        if self.warm_fits(&request) {
            if let Some(wc) = self.take_warm().await {
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
        let config = bundle::config(&BundleSpec {
            args: &args,
            env: &env,
            cwd: &cwd,
            rootfs: &self.engine.rootfs,
            host_usr: self.engine.host_usr,
            workdir: self.workdir.root(),
            files: &files,
            cgroups_path: &container_cgroup,
            memory_bytes: limits.memory_bytes,
            pids: limits.pids,
            cpu_quota_us: self.engine.cpu_quota_us,
            rlimits: &rlimits,
            seccomp: self.engine.seccomp,
            hostname: "paddock",
        });
        std::fs::write(
            bundle_dir.join("config.json"),
            serde_json::to_vec(&config).map_err(|e| {
                Error::new(
                    ErrorCode::EngineFailed,
                    format!("encoding config.json: {e}"),
                )
            })?,
        )
        .map_err(|e| Error::engine_io("writing config.json", e))?;

        // The container's own group has the limit; the sandbox group (its parent,
        // which outlives it) only has its peak reset, to tell an OOM kill apart.
        let memory_dir = self.engine.cgroup_dir("memory", &self.cgroup);
        if let Some(dir) = &memory_dir {
            let _ = std::fs::write(dir.join("memory.max_usage_in_bytes"), "0");
        }
        let cpuacct = self.engine.cgroup_dir("cpuacct", &self.cgroup);
        let cpu_before = cpuacct.as_deref().map_or(0, cpu_usage_ns);
        let ooms_before = global_oom_kills();

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
            let exit = sys::async_fd(pidfd, Interest::READABLE)
                .map_err(|e| Error::engine_io("watching the runtime", e))?;
            let ending = tokio::select! {
                biased;
                _ = cancel.cancelled() => Ending::Cancelled,
                _ = &mut destroyed => Ending::Destroyed,
                _ = sleep_until_opt(deadline) => Ending::Deadline,
                r = exit.readable() => { let _ready = r.map_err(|e| Error::engine_io("waiting for the runtime", e))?; Ending::Exited }
            };
            if ending != Ending::Exited {
                // Every process of the container dies; its init's death ends the
                // container and the runtime removes it.
                self.kill_container(&container_cgroup).await;
                if tokio::time::timeout(RUNTIME_GRACE, exit.readable())
                    .await
                    .is_err()
                {
                    sys::kill_group(pid, libc::SIGKILL);
                    let _ = exit.readable().await;
                }
            }
            sys::kill_group(pid, libc::SIGKILL);
            let status = sys::reap(pid).map_err(|e| Error::engine_io("reaping the runtime", e))?;
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

        let peak = memory_dir
            .as_deref()
            .map_or(0, |d| read_u64(&d.join("memory.max_usage_in_bytes")));
        let oom = limits
            .memory_bytes
            .is_some_and(|limit| global_oom_kills() > ooms_before && peak + (1 << 20) >= limit);
        let cpu_ms = cpuacct
            .as_deref()
            .map_or(0, cpu_usage_ns)
            .saturating_sub(cpu_before)
            / 1_000_000;
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
            engine: EngineName::CONTAINER,
            instance_id: self.id.clone(),
            timings: Timings {
                queued_at_ms,
                started_at_ms,
                finished_at_ms: unix_ms(),
            },
            // The runtime removed the container's group, which counted the forks its
            // pids limit refused, with the container: there is nothing to read.
            warnings: Vec::new(),
        })
    }

    /// Tears `wc` down and starts its replacement (unless the sandbox is going).
    async fn replace_warm(&self, wc: WarmContainer) {
        let _ = blocking(move || {
            wc.close();
            Ok(())
        })
        .await;
        if !self.destroying() {
            self.prewarm();
        }
    }

    /// The warm container, alive (one that died while idle is replaced first), or
    /// `None` when the sandbox has none.
    async fn take_warm(&self) -> Option<WarmContainer> {
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
    async fn run_warm(
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
        if !wc.wait_ready().await {
            self.replace_warm(wc).await;
            return Err(Error::new(
                ErrorCode::EngineFailed,
                format!(
                    "the sandbox's warm container did not start ({}); retry",
                    self.engine.info.kind.as_str()
                ),
            ));
        }
        let memory = wc.dir("memory");
        let wanted = (limits.memory_bytes, limits.pids);
        if wc.applied != Some(wanted) {
            let set = (|| -> std::io::Result<()> {
                if let Some(dir) = &memory {
                    crate::host::cgroup::write_memory_limit(dir, limits.memory_bytes)?;
                    // The peak is the turn's own.
                    let _ = std::fs::write(dir.join("memory.max_usage_in_bytes"), "0");
                }
                if let Some(dir) = wc.dir("pids") {
                    let value = limits
                        .pids
                        .map_or_else(|| "max".to_string(), |p| p.to_string());
                    std::fs::write(dir.join("pids.max"), value)?;
                }
                Ok(())
            })();
            if let Err(e) = set {
                // A limit below what the container holds (its /tmp, say) cannot be
                // set: this container goes, a fresh one takes its place.
                self.replace_warm(wc).await;
                return Err(Error::new(
                    ErrorCode::LimitsExceeded,
                    format!("setting the warm container's limits failed ({e}); the container was replaced, retry"),
                ));
            }
            wc.applied = Some(wanted);
        } else {
            // The peak is the turn's own.
            wc.counters().reset_peak();
        }
        let cpu_before = wc.counters().cpu_ns();
        let ooms_before = wc.ooms_seen;
        wc.used = true;

        let input = serde_json::json!({
            "argv": argv,
            "env": vars,
            "cwd": cwd,
            "stdin": request.stdin,
            "max_output_bytes": limits.max_output_bytes,
        });
        let started = Instant::now();
        let started_at_ms = unix_ms();
        let timeout = limits.timeout().unwrap_or(Duration::from_secs(30));
        let cap =
            usize::try_from(limits.max_output_bytes.unwrap_or(u64::MAX)).unwrap_or(usize::MAX);
        // The agent is asked to cancel first; past the grace the worker is killed.
        let abort: std::pin::Pin<&mut (dyn std::future::Future<Output = ()> + Send)> = destroyed;
        let (_, turn) = wc
            .worker
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
        let wall_ms = started.elapsed().as_millis() as u64;
        let counters = wc.counters();
        let (ooms, peak, cpu_ns) = (counters.ooms(), counters.peak(), counters.cpu_ns());
        let pids_max = counters.pids_max_hits();
        let warnings = crate::host::cgroup::pids_warning(pids_max > wc.pids_max_seen, limits);
        wc.pids_max_seen = pids_max;
        wc.ooms_seen = ooms;
        let oom = ooms > ooms_before;
        let cpu_ms = cpu_ns.saturating_sub(cpu_before) / 1_000_000;
        use crate::subprocess::warm::{TurnEnd, TurnFault};
        let failed = |code: ErrorCode, message: String| Outcome::Failed {
            error: Error::new(code, message),
        };
        let mut outcome = match turn.end {
            Ok(TurnEnd::Output(out)) => {
                let code = out.get("exit_code").and_then(|c| c.as_i64()).unwrap_or(-1) as i32;
                let signal = out.get("signal").and_then(|s| s.as_i64()).map(|s| s as i32);
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
            Ok(TurnEnd::Error(e)) if e.code == "SPAWN_FAILED" => {
                // The container is fine; the program could not start.
                *self.warm.lock() = Some(wc);
                return Err(Error::new(ErrorCode::SpawnFailed, e.message));
            }
            Ok(TurnEnd::Error(e)) => failed(
                ErrorCode::WorkerFailed,
                format!("the container agent answered {}: {}", e.code, e.message),
            ),
            Ok(TurnEnd::Suspend(_)) => failed(
                ErrorCode::ProtocolError,
                "the container agent suspended, which it never does".into(),
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
        let clean = matches!(outcome, Outcome::Completed { .. });
        // Background processes live in this container: it stays while they run and
        // it is alive (the agent killed what the turn left behind).
        let keep = clean
            || (self.processes.has_live()
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
            value: None,
            usage: Usage {
                cpu_ms,
                wall_ms,
                peak_memory_bytes: peak,
            },
            engine: EngineName::CONTAINER,
            instance_id: self.id.clone(),
            timings: Timings {
                queued_at_ms,
                started_at_ms,
                finished_at_ms: unix_ms(),
            },
            warnings,
        })
    }

    /// Kills every process in the container's cgroup (see
    /// `EngineInner::kill_container`).
    async fn kill_container(&self, container_cgroup: &str) {
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

/// A container process's environment: `passthrough` (host variables the
/// configuration lists), then the variables the engine owns (`PATH`, `HOME`, `PWD`,
/// `TMPDIR`, see `paddock_core::config::CONTAINER_OWN_ENV`), then `extra`.
fn guest_vars(
    passthrough: &std::collections::BTreeMap<String, String>,
    cwd: &str,
    extra: &std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<String, String> {
    let mut vars = passthrough.clone();
    vars.insert("PATH".into(), CONTAINER_PATH.into());
    vars.insert("HOME".into(), WORKSPACE.into());
    vars.insert("PWD".into(), cwd.into());
    vars.insert("TMPDIR".into(), "/tmp".into());
    for (k, v) in extra {
        vars.insert(k.clone(), v.clone());
    }
    vars
}

/// Runs `argv` in a one-off container of a bundle like an execution's (the engine's
/// default limits), straight through `<runtime> run`; blocking.
fn run_once(
    engine: &EngineInner,
    argv: &[String],
    tag: &str,
) -> std::io::Result<(super::runtime::Finished, Duration)> {
    let id = format!("{tag}-{}", uuid::Uuid::now_v7().simple());
    let dir = engine.root.join("bundles").join(&id);
    std::fs::create_dir(&dir)?;
    let _remove = RemoveOnDrop(dir.clone());
    let workdir = engine.root.join("sandboxes");
    let cgroup = format!("{}/{id}", engine.cgroup_base);
    let env = vec![format!("PATH={CONTAINER_PATH}")];
    let limits = &engine.defaults;
    let config = bundle::config(&BundleSpec {
        args: argv,
        env: &env,
        cwd: "/",
        rootfs: &engine.rootfs,
        host_usr: engine.host_usr,
        workdir: &workdir,
        files: &[],
        cgroups_path: &cgroup,
        memory_bytes: limits.memory_bytes,
        pids: limits.pids,
        cpu_quota_us: engine.cpu_quota_us,
        rlimits: &[("RLIMIT_CORE", 0, 0)],
        seccomp: engine.seccomp,
        hostname: "paddock",
    });
    std::fs::write(dir.join("config.json"), config.to_string())?;
    let bundle = dir.to_string_lossy().into_owned();
    let started = std::time::Instant::now();
    let finished = engine
        .runtime
        .run_blocking(&["run", "--bundle", &bundle, &id], &dir);
    let took = started.elapsed();
    engine.remove_cgroup(&cgroup);
    finished.map(|f| (f, took))
}

/// See [`super::ContainerEngine::run_raw`].
pub(super) fn run_raw(
    engine: &EngineInner,
    argv: &[String],
) -> std::io::Result<(Option<i32>, Duration)> {
    run_once(engine, argv, "raw").map(|(f, took)| (f.code, took))
}

/// Runs a probe container (`sh -c 'exit 0'`) to see whether the runtime works here;
/// the error carries what the runtime printed.
pub(super) fn probe(engine: &EngineInner) -> std::result::Result<(), String> {
    let args = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        "exit 0".to_string(),
    ];
    let (finished, _) = run_once(engine, &args, "probe").map_err(|e| e.to_string())?;
    match finished.code {
        Some(0) => Ok(()),
        code => Err(format!(
            "`{} run` exited with {code:?}: {}",
            engine.runtime.kind.as_str(),
            finished.output.chars().take(500).collect::<String>()
        )),
    }
}

/// Kills the container and the runtime if the execution ends without reaping the
/// runtime (its future dropped midway, or an error), off-thread.
struct RuntimeGuard {
    child: Option<crate::host::spawn::SpawnedChild>,
    engine: Arc<EngineInner>,
    container_cgroup: String,
    container_id: String,
}

impl RuntimeGuard {
    fn reaped(&mut self) {
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

struct ActiveGuard<'a>(&'a ContainerSandbox);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

struct StopOnDrop<'a>(&'a watch::Sender<Option<Instant>>);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.send(Some(Instant::now() + DRAIN_GRACE));
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn read_u64(path: &Path) -> u64 {
    sys::read_small(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// CPU time used by the group and its descendants, in nanoseconds.
fn cpu_usage_ns(dir: &Path) -> u64 {
    read_u64(&dir.join("cpuacct.usage"))
}

/// OOM kills on the whole host so far (`/proc/vmstat`).
fn global_oom_kills() -> u64 {
    sys::read_small("/proc/vmstat").map_or(0, |s| crate::host::cgroup::oom_kill_count(&s))
}

/// Maps how the container ended to an outcome. The runtime exits with its init's
/// code, or 128 + the signal that killed it.
fn classify(ending: Ending, code: Option<i32>, oom: bool, limits: &Limits, cpu_ms: u64) -> Outcome {
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
    let code = code.unwrap_or(-1);
    let signal = (129..=128 + 64).contains(&code).then_some(code - 128);
    match signal {
        Some(libc::SIGXCPU) => Outcome::LimitExceeded {
            limit: LimitKind::Cpu,
        },
        Some(libc::SIGKILL)
            if limits.cpu_ms.is_some_and(|ms| {
                let limit = ms.div_ceil(1000) * 1000;
                cpu_ms + (limit / 20).max(50) >= limit
            }) =>
        {
            Outcome::LimitExceeded {
                limit: LimitKind::Cpu,
            }
        }
        Some(libc::SIGXFSZ) => Outcome::LimitExceeded {
            limit: LimitKind::FileSize,
        },
        signal => Outcome::Completed {
            exit_code: code,
            signal,
        },
    }
}

#[async_trait]
impl Sandbox for ContainerSandbox {
    fn id(&self) -> &str {
        &self.id
    }

    fn engine(&self) -> EngineName {
        EngineName::CONTAINER
    }

    fn root_dir(&self) -> &Path {
        self.workdir.root()
    }

    fn status(&self) -> SandboxStatus {
        if self.destroying() {
            SandboxStatus::Destroyed
        } else if self.paused.load(Ordering::Acquire) {
            SandboxStatus::Paused
        } else if self.active.load(Ordering::Acquire) > 0 {
            SandboxStatus::Busy
        } else {
            SandboxStatus::Ready
        }
    }

    async fn exec(
        &self,
        request: ExecRequest,
        sink: &dyn OutputSink,
        cancel: CancelToken,
    ) -> Result<ExecResult> {
        self.run(request, sink, cancel).await
    }

    async fn write_file(&self, path: &str, data: &[u8]) -> Result<()> {
        let (path, data) = (path.to_string(), data.to_vec());
        self.file_op(move |w| w.write_file(&path, &data)).await
    }

    async fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        let path = path.to_string();
        self.file_op(move |w| w.read_file(&path)).await
    }

    async fn open_read(&self, path: &str) -> Result<paddock_core::FileReader> {
        let _op = self.enter()?;
        self.workdir.open_read(path).await
    }

    async fn write_from(
        &self,
        path: &str,
        source: paddock_core::ByteSource,
        max_bytes: u64,
    ) -> Result<u64> {
        self.workdir
            .write_from(path, source, max_bytes, || self.enter())
            .await
    }

    async fn list_files(&self, path: &str) -> Result<Vec<FileEntry>> {
        let path = path.to_string();
        let mut entries = self.file_op(move |w| w.list_files(&path)).await?;
        // Paths as the program sees them: the workdir is /workspace inside.
        let host = self.workdir.root().to_string_lossy().into_owned();
        for e in &mut entries {
            if let Some(rest) = e.path.strip_prefix(&host) {
                e.path = format!("{WORKSPACE}{rest}");
            }
        }
        Ok(entries)
    }

    async fn recycle(&self) -> Result<()> {
        let _op = self.enter()?;
        let _guard = self.run_lock.lock().await;
        if self.destroying() {
            return Err(Error::disposed(&format!("sandbox {}", self.id)));
        }
        if self.paused.load(Ordering::Acquire) {
            self.set_frozen(false).await?;
            self.paused.store(false, Ordering::Release);
        }
        // A container an execution ran in may hold what it left in /tmp or in its
        // processes' memory: the next lease (maybe another tenant's) gets a fresh
        // one, started here, off that lease's path.
        let used = self.warm.lock().as_ref().is_some_and(|w| w.used)
            | self.interactive_used.swap(false, Ordering::AcqRel)
            | self.processes.has_live();
        if used {
            let old = self.warm.lock().take();
            if let Some(old) = old {
                blocking(move || {
                    old.close();
                    Ok(())
                })
                .await?;
            }
            self.prewarm();
        }
        // Closing the container ended its processes; their watchers finish now.
        self.processes.kill_all(false).await;
        let workdir = self.workdir.clone();
        if std::fs::read_dir(workdir.root())
            .map(|mut d| d.next().is_none())
            .unwrap_or(false)
        {
            return Ok(());
        }
        blocking(move || {
            workdir
                .clear()
                .map_err(|e| Error::engine_io("cleaning the sandbox workdir", e))
        })
        .await
    }

    async fn start_process(
        &self,
        spec: paddock_core::ProcessSpec,
    ) -> Result<paddock_core::ProcessHandle> {
        self.start_process_impl(spec).await
    }

    async fn open_terminal(
        &self,
        spec: paddock_core::TerminalSpec,
    ) -> Result<paddock_core::TerminalHandle> {
        self.open_terminal_impl(spec).await
    }

    async fn open_tcp_connection(
        &self,
        target: paddock_core::TcpTarget,
    ) -> Result<paddock_core::TcpConnection> {
        self.open_tcp_impl(target).await
    }

    async fn pause(&self) -> Result<()> {
        let _op = self.enter()?;
        // New executions are refused from here on; running ones freeze.
        if self.paused.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let frozen = self.set_frozen(true).await;
        if frozen.is_err() {
            let _ = self.set_frozen(false).await;
            self.paused.store(false, Ordering::Release);
        }
        frozen
    }

    async fn unpause(&self) -> Result<()> {
        let _op = self.enter()?;
        if !self.paused.load(Ordering::Acquire) {
            return Ok(());
        }
        self.set_frozen(false).await?;
        self.paused.store(false, Ordering::Release);
        Ok(())
    }

    async fn destroy(&self) -> Result<()> {
        match self.lifecycle.begin_destroy() {
            DestroyRole::Leader => {
                let mut guard = TeardownGuard {
                    sandbox: self,
                    done: false,
                };
                if self.paused.swap(false, Ordering::AcqRel) {
                    // Frozen tasks do not die until thawed, and a running execution
                    // must see the destroy.
                    let _ = self.set_frozen(false).await;
                }
                self.destroy_signal.notify_waiters();
                self.lifecycle.ops_drained().await;
                let engine = self.engine.clone();
                let cgroup = self.cgroup.clone();
                let workdir = self.workdir.clone();
                let warm = self.warm.lock().take();
                let result = blocking(move || {
                    if let Some(w) = warm {
                        w.close();
                    }
                    engine.remove_cgroup(&cgroup);
                    workdir
                        .remove()
                        .map_err(|e| Error::engine_io("removing the sandbox workdir", e))
                })
                .await;
                // The container's processes and terminals died with it: their exits
                // are known before destroy returns.
                self.processes.kill_all(true).await;
                if let Err(e) = &result {
                    *self.teardown_error.lock() = Some(e.clone());
                }
                guard.done = true;
                self.lifecycle.finish_destroy();
                result
            }
            DestroyRole::Follower => {
                self.lifecycle.destroyed().await;
                match self.teardown_error.lock().clone() {
                    Some(e) => Err(e),
                    None => Ok(()),
                }
            }
        }
    }
}

struct TeardownGuard<'a> {
    sandbox: &'a ContainerSandbox,
    done: bool,
}

impl Drop for TeardownGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.sandbox.teardown_now();
            self.sandbox.lifecycle.finish_destroy();
        }
    }
}

impl ContainerSandbox {
    fn teardown_now(&self) {
        if let Some(w) = self.warm.lock().take() {
            w.close();
        }
        self.processes.kill_now();
        self.engine.remove_cgroup(&self.cgroup);
        let _ = self.workdir.remove();
    }
}

impl Drop for ContainerSandbox {
    fn drop(&mut self) {
        if self.lifecycle.phase() != Phase::Destroyed {
            self.teardown_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_vars_are_the_listed_the_own_and_the_requested() {
        use std::collections::BTreeMap;
        let host = [
            ("DATABASE_URL", "postgres://u:pass@h/db"),
            ("PADDOCK_LEAK_PROBE", "x"),
            ("PATH", "/host/only/bin"),
            ("HOME", "/root"),
            ("LISTED", "yes"),
        ];
        let passthrough = crate::env::listed_env(host, &["LISTED".to_string()]);
        let extra = BTreeMap::from([("FROM_REQUEST".to_string(), "r".to_string())]);
        let vars = guest_vars(&passthrough, "/workspace/sub", &extra);
        let own: Vec<&str> = paddock_core::config::CONTAINER_OWN_ENV.to_vec();
        let mut names: Vec<&str> = vars.keys().map(String::as_str).collect();
        names.retain(|n| !own.contains(n));
        assert_eq!(names, ["FROM_REQUEST", "LISTED"], "{vars:?}");
        for name in own {
            assert!(vars.contains_key(name), "{name} is missing: {vars:?}");
        }
        assert_eq!(vars["PATH"], CONTAINER_PATH);
        assert_eq!(vars["HOME"], WORKSPACE);
        assert_eq!(vars["PWD"], "/workspace/sub");
        assert_eq!(vars["LISTED"], "yes");
        // A request may still set what the engine owns.
        let extra = BTreeMap::from([("PATH".to_string(), "/opt/bin".to_string())]);
        assert_eq!(
            guest_vars(&passthrough, WORKSPACE, &extra)["PATH"],
            "/opt/bin"
        );
    }

    #[test]
    fn exit_codes_and_signals_map_to_outcomes() {
        let l = Limits::default();
        assert_eq!(
            classify(Ending::Exited, Some(3), false, &l, 0),
            Outcome::Completed {
                exit_code: 3,
                signal: None
            }
        );
        assert_eq!(
            classify(Ending::Exited, Some(137), false, &l, 0),
            Outcome::Completed {
                exit_code: 137,
                signal: Some(9)
            }
        );
        assert_eq!(
            classify(Ending::Exited, Some(137), true, &l, 0),
            Outcome::LimitExceeded {
                limit: LimitKind::Memory
            }
        );
        assert_eq!(
            classify(Ending::Exited, Some(128 + libc::SIGXFSZ), false, &l, 0),
            Outcome::LimitExceeded {
                limit: LimitKind::FileSize
            }
        );
        let cpu = Limits {
            cpu_ms: Some(1000),
            ..Limits::default()
        };
        assert_eq!(
            classify(Ending::Exited, Some(137), false, &cpu, 990),
            Outcome::LimitExceeded {
                limit: LimitKind::Cpu
            }
        );
        assert_eq!(
            classify(Ending::Deadline, Some(137), true, &l, 0),
            Outcome::TimedOut
        );
        assert_eq!(
            classify(Ending::Destroyed, None, false, &l, 0),
            Outcome::Cancelled
        );
    }
}
