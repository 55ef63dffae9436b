//! Warm containers: one long-lived container per sandbox whose pid 1 is
//! `paddock-agent`, so that an execution costs a frame round trip instead of a
//! container start (see the `paddock_agent` crate for the agent's side, and
//! `agent.rs` for where its binary comes from). Here: starting and closing one, and a
//! warm execution (`ContainerSandbox::run_warm`); the cold path is in `exec.rs`, the
//! sandbox's life in `sandbox.rs`.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use paddock_core::{Error, ErrorCode, Limits, Result};

use super::bundle::{self, BundleSpec, CONTAINER_PATH};
use super::EngineInner;
use crate::subprocess::warm::{FramesOn, Worker};
use paddock_core::{
    unix_ms, CancelToken, ExecRequest, ExecResult, LimitKind, Outcome, OutputSink, Timings, Usage,
};
use std::time::Duration;
use tokio::time::Instant;

use super::sandbox::ContainerSandbox;
use crate::task::blocking;

/// How long a warm container may take to come up (gVisor's on a loaded host of two
/// cores has been seen to take more than 10 s).
const READY_PATIENCE: Duration = Duration::from_secs(20);

/// Where the agent binary is bound inside the container.
pub(crate) const AGENT_INSIDE: &str = "/tmp/.paddock-agent";

/// A running warm container and the agent speaking for it.
#[derive(Debug)]
pub(crate) struct WarmContainer {
    pub(crate) worker: Worker,
    pub(crate) id: String,
    /// The container's own cgroup path: it lives as long as the container, so its
    /// limits are set per turn and its OOM counter read directly.
    pub(crate) cgroup: String,
    engine: Arc<EngineInner>,
    bundle: PathBuf,
    /// Whether an execution ran in it (a used container is reset or replaced on
    /// recycle).
    pub(crate) used: bool,
    /// Set once torn down, so that drop has nothing left to do.
    closed: bool,
    /// Set once the runtime has created the container (its cgroup exists).
    ready: bool,
    /// The (memory, pids) limits last written to its cgroup.
    pub(crate) applied: Option<(Option<u64>, Option<u64>)>,
    /// Its cgroup's OOM-kill count as last read.
    pub(crate) ooms_seen: u64,
    /// The pids limit's refusals counted after the last turn.
    pub(crate) pids_max_seen: u64,
    /// The cgroup files every turn reads, kept open (one system call a read).
    counters: Option<Counters>,
    /// The agent's control channel (background processes and terminals).
    pub(crate) control: Arc<super::control::AgentControl>,
    /// Warm interpreters the agent started in it, by language (see `runner.rs`).
    pub(crate) runners:
        std::collections::BTreeMap<paddock_core::Language, super::runner::ContainerRunner>,
    /// Runners started in it so far (their ids).
    pub(crate) next_runner: u64,
    /// The tenant of the first execution in it, and whether another ran since.
    pub(crate) first_tenant: Option<Option<String>>,
    pub(crate) mixed: bool,
}

/// A warm container's cgroup counters, opened once.
#[derive(Debug)]
pub(crate) struct Counters {
    /// Whether these are v2 files (`memory.peak`, `cpu.stat`, `memory.events`).
    v2: bool,
    max_usage: Option<std::fs::File>,
    cpu: Option<std::fs::File>,
    oom: Option<std::fs::File>,
    pids_events: Option<std::fs::File>,
}

/// Reads a small kernel file from its start (cgroup files regenerate at offset 0).
fn read_at_start(file: &std::fs::File) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 512];
    let n = file.read_at(&mut buf, 0).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

impl Counters {
    /// Resets the peak memory usage, so that the next reading is the turn's own.
    pub(crate) fn reset_peak(&self) {
        use std::os::unix::fs::FileExt;
        if let Some(f) = &self.max_usage {
            let _ = f.write_at(b"0", 0);
        }
    }

    /// Peak memory usage since the last reset, in bytes.
    pub(crate) fn peak(&self) -> u64 {
        self.max_usage
            .as_ref()
            .and_then(read_at_start)
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// CPU time used so far, in nanoseconds.
    pub(crate) fn cpu_ns(&self) -> u64 {
        let text = self.cpu.as_ref().and_then(read_at_start);
        if self.v2 {
            return text.map_or(0, |t| crate::host::cgroup::v2_cpu_usage_ns(&t));
        }
        text.and_then(|s| s.trim().parse().ok()).unwrap_or(0)
    }

    /// Forks the group's pids limit refused so far.
    pub(crate) fn pids_max_hits(&self) -> u64 {
        self.pids_events
            .as_ref()
            .and_then(read_at_start)
            .map_or(0, |s| crate::host::cgroup::pids_max_count(&s))
    }

    /// OOM kills in the group so far.
    pub(crate) fn ooms(&self) -> u64 {
        self.oom
            .as_ref()
            .and_then(read_at_start)
            .map_or(0, |s| crate::host::cgroup::oom_kill_count(&s))
    }
}

/// The rlimits of a warm container, inherited by every program it runs: the
/// sandbox's file-size and open-files limits (per process, so each turn's program
/// gets them whole). Never a CPU-time limit, which would count the container's
/// whole life: executions with one run in a container of their own.
pub(crate) fn warm_rlimits(limits: &Limits) -> Vec<(&'static str, u64, u64)> {
    let clamp = |resource, want: u64| want.min(crate::host::sys::getrlimit(resource).1);
    let mut rlimits = vec![("RLIMIT_CORE", 0, 0)];
    if let Some(b) = limits.file_size_bytes {
        let b = clamp(libc::RLIMIT_FSIZE, b);
        rlimits.push(("RLIMIT_FSIZE", b, b));
    }
    let open_files = clamp(libc::RLIMIT_NOFILE, limits.open_files.unwrap_or(1024));
    rlimits.push(("RLIMIT_NOFILE", open_files, open_files));
    rlimits
}

impl WarmContainer {
    /// Starts a warm container for the sandbox whose cgroup is `sandbox_cgroup`,
    /// with `limits` until the first turn sets its own.
    pub(crate) fn start(
        engine: &Arc<EngineInner>,
        sandbox_cgroup: &str,
        (workdir, home, ids, netns): (&std::path::Path, &str, Option<(u32, u32)>, Option<&str>),
        (id, tag): (String, String),
        limits: &Limits,
    ) -> Result<WarmContainer> {
        let agent = engine.agent.as_ref().map_err(|why| {
            Error::new(
                ErrorCode::CapabilityNotSupported,
                format!("no warm containers: {why}"),
            )
        })?;
        let cgroup = format!("{sandbox_cgroup}/{tag}");
        let dir = engine.root.join("bundles").join(&id);
        std::fs::create_dir(&dir).map_err(|e| Error::engine_io("creating the bundle", e))?;
        let args = vec![AGENT_INSIDE.to_string()];
        let env = vec![format!("PATH={CONTAINER_PATH}")];
        let mut files = vec![(
            agent.to_string_lossy().into_owned(),
            AGENT_INSIDE.to_string(),
        )];
        if let Some(runners) = &engine.runners {
            files.extend(runners.mounts());
        }
        let config = bundle::config(&BundleSpec {
            args: &args,
            env: &env,
            cwd: home,
            rootfs: &engine.rootfs,
            host_usr: engine.host_usr,
            workdir,
            home,
            files: &files,
            cgroups_path: &cgroup,
            memory_bytes: limits.memory_bytes,
            pids: limits.pids,
            cpu_quota_us: super::exec::cpu_quota_us(engine, limits),
            rlimits: &warm_rlimits(limits),
            seccomp: engine.seccomp,
            hostname: "paddock",
            ids,
            user_space_kernel: engine.runtime.kind.user_space_kernel(),
            netns,
        });
        let written = bundle::write_config(&dir, &config);
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(Error::engine_io("writing config.json", e));
        }
        let bundle_arg = dir.to_string_lossy().into_owned();
        // The runtime writes it once the container (and every cgroup of it) exists.
        let pid_arg = dir.join("init.pid").to_string_lossy().into_owned();
        let null = || -> std::io::Result<std::os::fd::OwnedFd> {
            Ok(std::fs::File::open("/dev/null")?.into())
        };
        let started = (|| -> std::io::Result<(Worker, std::os::fd::OwnedFd)> {
            let stdio = [null()?, null()?, null()?];
            // The control channel reaches the agent as fd 3. runsc passes no
            // descriptor but stdio into its kernel (and a host descriptor could not
            // carry the agent's pipes or terminals back out): its agent serves turns
            // only, and the engine offers no processes, terminals or TCP there.
            let (ours, agents) = crate::host::sys::seqpacket_pair()?;
            let mut args = vec!["run", "--bundle", &bundle_arg, "--pid-file", &pid_arg];
            let control = !engine.runtime.kind.user_space_kernel();
            if control {
                args.extend(["--preserve-fds", "1"]);
            }
            args.push(&id);
            let mut spec = engine.runtime.spec(&args, stdio, &dir)?;
            if control {
                spec.fd3 = Some(agents);
            }
            Ok((Worker::start(spec, FramesOn::Stdout)?, ours))
        })();
        match started {
            Ok((worker, control)) => Ok(WarmContainer {
                worker,
                id,
                cgroup,
                engine: engine.clone(),
                bundle: dir,
                used: false,
                closed: false,
                ready: false,
                applied: None,
                ooms_seen: 0,
                pids_max_seen: 0,
                counters: None,
                control: super::control::AgentControl::new(control),
                runners: Default::default(),
                next_runner: 0,
                first_tenant: None,
                mixed: false,
            }),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(Error::new(
                    ErrorCode::SpawnFailed,
                    format!("starting a warm container failed: {e}"),
                ))
            }
        }
    }

    /// Waits (up to [`READY_PATIENCE`]) until the runtime has created the container
    /// (it writes the pid file then), so that its cgroups can be set; why not when it
    /// did not come up.
    pub(crate) async fn wait_ready(&mut self) -> std::result::Result<(), String> {
        if self.ready {
            return Ok(());
        }
        let pid_file = self.bundle.join("init.pid");
        let deadline = tokio::time::Instant::now() + READY_PATIENCE;
        while tokio::time::Instant::now() < deadline {
            if std::fs::metadata(&pid_file).is_ok_and(|m| m.len() > 0) {
                self.ready = true;
                return Ok(());
            }
            if let Some(status) = self.worker.exited_within(std::time::Duration::ZERO).await {
                return Err(format!("the runtime exited first (status {status})"));
            }
            tokio::time::sleep(std::time::Duration::from_micros(500)).await;
        }
        Err(format!("it was not up within {READY_PATIENCE:?}"))
    }

    /// The cgroup counters, opened on first use (once the container exists).
    pub(crate) fn counters(&mut self) -> &Counters {
        if self.counters.is_none() {
            let open = |controller: &str, file: &str, write: bool| {
                let path = self.dir(controller)?.join(file);
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(write)
                    .open(path)
                    .ok()
            };
            // v2: `memory.peak` is reset through the descriptor that reads it.
            self.counters = Some(if self.engine.v2 {
                Counters {
                    v2: true,
                    // Writable (for the reset) from kernel 6.12 on; read-only before.
                    max_usage: open("memory", "memory.peak", true)
                        .or_else(|| open("memory", "memory.peak", false)),
                    cpu: open("cpu", "cpu.stat", false),
                    oom: open("memory", "memory.events", false),
                    pids_events: open("pids", "pids.events", false),
                }
            } else {
                Counters {
                    v2: false,
                    max_usage: open("memory", "memory.max_usage_in_bytes", true),
                    cpu: open("cpuacct", "cpuacct.usage", false),
                    oom: open("memory", "memory.oom_control", false),
                    pids_events: open("pids", "pids.events", false),
                }
            });
        }
        self.counters.as_ref().expect("just set")
    }

    /// The container's init process as the host sees it (from the runtime's pid
    /// file), once the container exists.
    pub(crate) fn pid_file(&self) -> PathBuf {
        self.bundle.join("init.pid")
    }

    /// The container cgroup's directory for `controller`.
    pub(crate) fn dir(&self, controller: &str) -> Option<PathBuf> {
        self.engine.cgroup_dir(controller, &self.cgroup)
    }

    /// Takes out the runners started ahead of need that served no turn (for the
    /// caller to drop, which kills them).
    pub(crate) fn retire_unused_runners(&mut self) -> Vec<super::runner::ContainerRunner> {
        let unused: Vec<paddock_core::Language> = self
            .runners
            .iter()
            .filter(|(_, r)| r.tenant.is_none() && r.worker.turns == 0)
            .map(|(l, _)| *l)
            .collect();
        unused
            .iter()
            .filter_map(|l| self.runners.remove(l))
            .collect()
    }

    /// Writes `limits`' memory and pids limits to the container's cgroup when they
    /// differ from the last written, and resets its peak memory (so that the next
    /// reading is the turn's own).
    pub(crate) fn apply_limits(&mut self, limits: &Limits) -> std::io::Result<()> {
        let memory = self.dir("memory");
        let wanted = (limits.memory_bytes, limits.pids);
        if self.applied == Some(wanted) {
            self.counters().reset_peak();
            return Ok(());
        }
        if self.engine.v2 {
            // v2: the one group holds the memory and pids limits.
            if let Some(dir) = &memory {
                crate::host::cgroup::write_v2_limits(dir, limits.memory_bytes, limits.pids)?;
            }
            self.applied = Some(wanted);
            self.counters().reset_peak();
            return Ok(());
        }
        if let Some(dir) = &memory {
            crate::host::cgroup::write_memory_limit(dir, limits.memory_bytes)?;
            let _ = std::fs::write(dir.join("memory.max_usage_in_bytes"), "0");
        }
        if let Some(dir) = self.dir("pids") {
            let value = limits
                .pids
                .map_or_else(|| "max".to_string(), |p| p.to_string());
            std::fs::write(dir.join("pids.max"), value)?;
        }
        self.applied = Some(wanted);
        Ok(())
    }
}

impl WarmContainer {
    /// Kills the container and removes its cgroup, runtime state and bundle, now
    /// (blocking).
    pub(crate) fn close(self) {
        self.kill().remove();
    }

    /// Kills every process of the container (blocking, quick); what remains to
    /// remove is returned.
    pub(crate) fn kill(mut self) -> Remains {
        self.closed = true;
        self.worker.kill();
        let _ = self.engine.kill_container(&self.cgroup);
        Remains {
            engine: self.engine.clone(),
            cgroup: std::mem::take(&mut self.cgroup),
            id: std::mem::take(&mut self.id),
            bundle: std::mem::take(&mut self.bundle),
        }
    }
}

/// What is left of a killed warm container: its runtime state, cgroup and bundle.
#[derive(Debug)]
pub(crate) struct Remains {
    engine: Arc<EngineInner>,
    cgroup: String,
    id: String,
    bundle: PathBuf,
}

impl Remains {
    /// Removes it (blocking: `runsc delete` of a killed container takes 1.5–2 s).
    pub(crate) fn remove(self) {
        teardown(&self.engine, &self.cgroup, &self.id, &self.bundle);
    }
}

/// Kills every process of the container through its cgroup, then removes what the
/// runtime and the engine made for it.
fn teardown(engine: &EngineInner, cgroup: &str, id: &str, bundle: &std::path::Path) {
    let _ = engine.kill_container(cgroup);
    // The runtime exits once its container has ended and removes it; if it was
    // killed first, its state is removed here.
    let _ = engine
        .runtime
        .run_blocking(&["delete", "--force", id], &engine.root);
    engine.remove_cgroup(cgroup);
    let _ = std::fs::remove_dir_all(bundle);
}

impl Drop for WarmContainer {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        let engine = self.engine.clone();
        let (cgroup, id, bundle) = (self.cgroup.clone(), self.id.clone(), self.bundle.clone());
        std::thread::spawn(move || teardown(&engine, &cgroup, &id, &bundle));
    }
}

impl ContainerSandbox {
    /// Kills `wc`, starts its replacement (unless the sandbox is going), and removes
    /// what is left of `wc` off the caller's path: the runtime's `delete` may take
    /// seconds (runsc's does), and an execution's answer must not wait for it. The
    /// sandbox's teardown waits for these removals.
    pub(super) async fn replace_warm(&self, wc: WarmContainer) {
        let remains = blocking(move || Ok(wc.kill())).await;
        if let Ok(remains) = remains {
            let mut removing = self.removing.lock();
            removing.retain(|h| !h.is_finished());
            removing.push(std::thread::spawn(move || remains.remove()));
        }
        if !self.destroying() {
            self.prewarm();
        }
    }

    /// Returns the used warm container to a fresh one's state for the next lease
    /// (maybe another tenant's): reset in place by its agent when it can be (see
    /// [`Self::reset_in_place`]), else closed and replaced by a new one, as before
    /// resets existed. Counted in the engine's `warm_resets`.
    pub(super) async fn renew_warm(&self) {
        let Some(mut wc) = self.warm.lock().take() else {
            // It could not start before: another try.
            self.prewarm();
            return;
        };
        match self.reset_in_place(&mut wc).await {
            Ok(()) => {
                tracing::debug!(sandbox = %self.id, container = %wc.id, "warm container reset in place");
                self.engine.warm_resets.0.fetch_add(1, Ordering::Relaxed);
                *self.warm.lock() = Some(wc);
            }
            Err(why) => {
                tracing::debug!(sandbox = %self.id, container = %wc.id, reason = %why, "warm container replaced");
                self.engine.warm_resets.1.fetch_add(1, Ordering::Relaxed);
                let _ = blocking(move || {
                    wc.close();
                    Ok(())
                })
                .await;
                self.prewarm();
            }
        }
    }

    /// Has the agent of `wc` reset it to the state it started in (every process
    /// killed, IPC objects removed, `/tmp`, `/dev/shm`, `/dev` as they were: see the
    /// `paddock_agent` crate), and forgets what referred to the processes that
    /// died: the runners, the tenants that ran code in it. Why not, when it was not
    /// (the container must then be replaced): gVisor's agent has no control
    /// channel; a container that has ended or is frozen is not asked; an agent
    /// that cannot prove the container clean says so.
    async fn reset_in_place(&self, wc: &mut WarmContainer) -> std::result::Result<(), String> {
        if self.engine.runtime.kind.user_space_kernel() {
            return Err("gVisor's agent has no control channel to reset through".into());
        }
        if let Err(why) = wc.wait_ready().await {
            return Err(format!("the container did not come up: {why}"));
        }
        if wc.worker.exited_within(Duration::ZERO).await.is_some() {
            return Err("the container has ended".into());
        }
        if self.frozen(wc) {
            return Err("the container is frozen".into());
        }
        // The runners die with the reset: their pipes and pidfds here go first.
        wc.runners.clear();
        // Processes and terminals die first through their handles, and the handles
        // the sandbox keeps go (ended ones too), so that a terminal's master held
        // here is closed before the agent looks for open terminals.
        self.processes.kill_all(false).await;
        let id = paddock_core::ids::tagged("reset");
        wc.control.reset(&id).await.map_err(|e| e.message)?;
        wc.used = false;
        wc.first_tenant = None;
        wc.mixed = false;
        wc.counters().reset_peak();
        Ok(())
    }

    /// Whether `wc`'s cgroup is frozen (or freezing): its agent could not answer.
    fn frozen(&self, wc: &WarmContainer) -> bool {
        if self.engine.v2 {
            return wc
                .dir("memory")
                .and_then(|d| std::fs::read_to_string(d.join("cgroup.events")).ok())
                .is_some_and(|t| t.lines().any(|l| l.trim() == "frozen 1"));
        }
        wc.dir("freezer")
            .and_then(|d| std::fs::read_to_string(d.join("freezer.state")).ok())
            .is_some_and(|t| t.trim() != "THAWED")
    }

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
        use crate::subprocess::warm::{TurnEnd, TurnFault};
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
