//! Warm containers: one long-lived container per sandbox whose pid 1 is
//! `paddock-agent`, so that an execution costs a frame round trip instead of a
//! container start (see the `paddock_agent` crate for the agent's side, and
//! `agent.rs` for where its binary comes from). Here: starting and closing one; a
//! warm execution (`ContainerSandbox::run_warm`) is in `warm_turn.rs`, the renewal
//! between leases in `warm_reset.rs`, the cold path in `exec.rs`, the sandbox's life
//! in `sandbox.rs`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use paddock_core::{Error, ErrorCode, Limits, Result};

use super::bundle::{self, BundleSpec, CONTAINER_PATH};
use super::EngineInner;
use crate::warm::worker::{FramesOn, Worker};

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
    pub(crate) runners: std::collections::BTreeMap<paddock_core::Language, ContainerRunner>,
    /// Runners started in it so far (their ids).
    pub(crate) next_runner: u64,
    /// The tenant of the first execution in it, and whether another ran since.
    pub(crate) first_tenant: Option<Option<String>>,
    pub(crate) mixed: bool,
}

/// A runner inside a warm container, and the tenant it serves.
#[derive(Debug)]
pub(crate) struct ContainerRunner {
    pub(crate) worker: Worker,
    pub(crate) tenant: Option<String>,
}

/// The warm container a sandbox's processes run in, as the sandbox keeps it while the
/// container itself may be serving a turn.
#[derive(Debug, Clone)]
pub(crate) struct Guest {
    pub(crate) control: Arc<super::control::AgentControl>,
    /// Where the runtime writes the container's init pid (on the host).
    pub(crate) pid_file: PathBuf,
    /// The container's cgroup path: a pid read from the pid file is the container's
    /// only while it is in that group.
    pub(crate) cgroup: String,
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
            cpu_quota_us: super::usage::cpu_quota_us(engine, limits),
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
    pub(crate) fn retire_unused_runners(&mut self) -> Vec<ContainerRunner> {
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
