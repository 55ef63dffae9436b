//! Warm containers: one long-lived container per sandbox whose pid 1 is
//! `paddock-agent`, so that an execution costs a frame round trip instead of a
//! container start (see `crate::agent` for the agent's side).

use std::path::PathBuf;
use std::sync::Arc;

use paddock_core::{Error, ErrorCode, Limits, Result};

use super::bundle::{self, BundleSpec, CONTAINER_PATH, WORKSPACE};
use super::EngineInner;
use crate::subprocess::warm::{FramesOn, Worker};

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
    /// Whether an execution ran in it (a used container is replaced on recycle).
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
}

/// A warm container's cgroup counters, opened once.
#[derive(Debug)]
pub(crate) struct Counters {
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
        self.cpu
            .as_ref()
            .and_then(read_at_start)
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
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

impl WarmContainer {
    /// Starts a warm container for the sandbox whose cgroup is `sandbox_cgroup`,
    /// with `limits` until the first turn sets its own.
    pub(crate) fn start(
        engine: &Arc<EngineInner>,
        sandbox_cgroup: &str,
        workdir: &std::path::Path,
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
        let files = vec![(
            agent.to_string_lossy().into_owned(),
            AGENT_INSIDE.to_string(),
        )];
        let config = bundle::config(&BundleSpec {
            args: &args,
            env: &env,
            cwd: WORKSPACE,
            rootfs: &engine.rootfs,
            host_usr: engine.host_usr,
            workdir,
            files: &files,
            cgroups_path: &cgroup,
            memory_bytes: limits.memory_bytes,
            pids: limits.pids,
            cpu_quota_us: engine.cpu_quota_us,
            rlimits: &[("RLIMIT_CORE", 0, 0), ("RLIMIT_NOFILE", 1024, 1024)],
            seccomp: engine.seccomp,
            hostname: "paddock",
        });
        let written = std::fs::write(dir.join("config.json"), config.to_string());
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
            // The control channel reaches the agent as fd 3.
            let (ours, agents) = crate::host::sys::seqpacket_pair()?;
            let mut spec = engine.runtime.spec(
                &[
                    "run",
                    "--bundle",
                    &bundle_arg,
                    "--pid-file",
                    &pid_arg,
                    "--preserve-fds",
                    "1",
                    &id,
                ],
                stdio,
                &dir,
            )?;
            spec.fd3 = Some(agents);
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

    /// Waits (up to 10 s) until the runtime has created the container (it writes the
    /// pid file then), so that its cgroups can be set; `false` when it did not come
    /// up.
    pub(crate) async fn wait_ready(&mut self) -> bool {
        if self.ready {
            return true;
        }
        let pid_file = self.bundle.join("init.pid");
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while tokio::time::Instant::now() < deadline {
            if std::fs::metadata(&pid_file).is_ok_and(|m| m.len() > 0) {
                self.ready = true;
                return true;
            }
            if self
                .worker
                .exited_within(std::time::Duration::ZERO)
                .await
                .is_some()
            {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_micros(500)).await;
        }
        false
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
            self.counters = Some(Counters {
                max_usage: open("memory", "memory.max_usage_in_bytes", true),
                cpu: open("cpuacct", "cpuacct.usage", false),
                oom: open("memory", "memory.oom_control", false),
                pids_events: open("pids", "pids.events", false),
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
}

impl WarmContainer {
    /// Kills the container and removes its cgroup, runtime state and bundle, now
    /// (blocking).
    pub(crate) fn close(mut self) {
        self.closed = true;
        self.worker.kill();
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
