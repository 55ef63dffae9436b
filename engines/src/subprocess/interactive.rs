//! Background processes, terminals and TCP streams of a subprocess sandbox.
//!
//! Each process or terminal runs as a host process in its own session, in a cgroup of
//! its own inside the sandbox's (so the sandbox's memory and pids limits cover it
//! together with the executions; no CPU-time limit or deadline: it is meant to outlive
//! the call), in the sandbox's network namespace and workdir. When it exits,
//! whatever it left running is killed with it.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use paddock_core::interactive::DEFAULT_OUTPUT_BUFFER;
use paddock_core::{
    Error, Limits, ProcessHandle, ProcessSpec, Result, TcpConnection, TcpTarget, TerminalHandle,
    TerminalSpec,
};

use super::sandbox::SubprocessSandbox;
use crate::host::cgroup::Cgroup;
use crate::host::pty;
use crate::host::spawn::spawn_async;
use crate::interactive::{adopt, pipes, ProcessOps, Wiring};
use crate::sandbox::WorkdirBacked;
use crate::task::blocking;

impl SubprocessSandbox {
    /// The limits a long-lived process runs under: the sandbox's, without a deadline
    /// or a CPU-time limit.
    fn process_limits(&self) -> Limits {
        let mut limits = self.spec.limits.or(&self.engine.defaults);
        limits.timeout_ms = None;
        limits.cpu_ms = None;
        limits
    }

    /// A cgroup of the process's own, inside the sandbox's: the sandbox's memory and
    /// pids limits hold for its executions and background processes together (the
    /// limit in force is the last one written, by an execution or here), and the
    /// process's tree can be killed apart from the rest.
    async fn process_cgroup(&self, id: &str, limits: &Limits) -> Result<Option<Arc<Cgroup>>> {
        let (Some(_), Some(sandbox_group)) = (&self.engine.cgroups, self.cgroup.clone()) else {
            return Ok(None);
        };
        let engine = self.engine.clone();
        let name = format!("{}/{id}", self.id);
        let memory = limits.memory_bytes;
        let sandbox_limits = limits.clone();
        let group = blocking(move || {
            let Some(root) = &engine.cgroups else {
                return Ok(None);
            };
            // The sandbox's own limits, unless an execution set them already.
            sandbox_group
                .set_limits_if_unset(&sandbox_limits)
                .map_err(|e| {
                    crate::host::cgroup::limits_error(
                        e,
                        memory,
                        "setting the sandbox's cgroup limits",
                    )
                })?;
            let g = root
                .create_group(&name)
                .map_err(|e| Error::engine_io("creating the process's cgroup", e))?;
            Ok(Some(Arc::new(g)))
        })
        .await?;
        Ok(group)
    }
}

impl ProcessOps for SubprocessSandbox {
    async fn start_process(&self, spec: ProcessSpec) -> Result<ProcessHandle> {
        let _op = self.enter()?;
        spec.validate()?;
        let place = self.processes.reserve("p")?;
        self.touched_by(None);
        let id = place.id.clone();
        let limits = self.process_limits();
        let cgroup = self.process_cgroup(&id, &limits).await?;
        let started = async {
            let (ends, wiring) = pipes(spec.stdin)?;
            let spawn_spec = self.spawn_spec(
                spec.argv.clone(),
                &spec.env,
                spec.cwd.as_deref(),
                &limits,
                ends,
                cgroup.as_deref(),
            )?;
            // Our copies of the child's ends go with the spec, so EOF means the
            // child closed them.
            let child = spawn_async(spawn_spec)
                .await
                .map_err(|e| spawn_failed(&spec.argv[0], e))?;
            Ok::<_, Error>((child, wiring))
        }
        .await;
        let (child, wiring) = match started {
            Ok(s) => s,
            Err(e) => {
                release(cgroup).await;
                return Err(e);
            }
        };
        let shared = adopt(place, child, wiring, cgroup, DEFAULT_OUTPUT_BUFFER)?;
        Ok(ProcessHandle::new(shared))
    }

    async fn open_terminal(&self, spec: TerminalSpec) -> Result<TerminalHandle> {
        let _op = self.enter()?;
        spec.validate()?;
        let place = self.processes.reserve("t")?;
        self.touched_by(None);
        let id = place.id.clone();
        let limits = self.process_limits();
        let cgroup = self.process_cgroup(&id, &limits).await?;
        let started = async {
            let (master, slave) =
                pty::open(spec.size).map_err(|e| Error::engine_io("opening a terminal", e))?;
            let dup = |fd: &OwnedFd| {
                fd.try_clone()
                    .map_err(|e| Error::engine_io("opening a terminal", e))
            };
            let stdio = [dup(&slave)?, dup(&slave)?, slave];
            let mut env = spec.env.clone();
            env.entry("TERM".into())
                .or_insert_with(|| "xterm-256color".into());
            let argv = spec.argv();
            let mut spawn_spec = self.spawn_spec(
                argv.clone(),
                &env,
                spec.cwd.as_deref(),
                &limits,
                stdio,
                cgroup.as_deref(),
            )?;
            spawn_spec.controlling_tty = true;
            // The slave's last copy on this side goes with the spec: when the command
            // and all it started have closed theirs, the master reads the end.
            let child = spawn_async(spawn_spec)
                .await
                .map_err(|e| spawn_failed(&argv[0], e))?;
            Ok::<_, Error>((child, Wiring::Pty(master)))
        }
        .await;
        let (child, wiring) = match started {
            Ok(s) => s,
            Err(e) => {
                release(cgroup).await;
                return Err(e);
            }
        };
        let shared = adopt(place, child, wiring, cgroup, DEFAULT_OUTPUT_BUFFER)?;
        Ok(TerminalHandle::new(shared))
    }

    async fn open_tcp_connection(&self, target: TcpTarget) -> Result<TcpConnection> {
        let _op = self.enter()?;
        target.loopback_addr()?;
        // Without a namespace of its own (network `unrestricted`) the sandbox's
        // loopback is the host's: a stream "into the guest" would reach the host's
        // own services, which is not what the caller was given.
        // An allowlist's namespace is its gateway's (held while the stream opens).
        let gateway = self.egress.lock().clone();
        crate::interactive::refuse_gateway_port(&target, gateway.is_some())?;
        let netns = self
            .netns
            .as_ref()
            .map(|fd| fd.as_raw_fd())
            .or_else(|| gateway.as_ref().map(|g| g.netns().as_raw_fd()));
        let Some(netns) = netns else {
            return Err(Error::new(
                paddock_core::ErrorCode::CapabilityNotSupported,
                "a TCP stream into the guest needs a sandbox with network `none` or `allowlist` (its own loopback); this one shares the host's network",
            ));
        };
        crate::interactive::connect(Some(netns), &target).await
    }
}

fn spawn_failed(program: &str, e: crate::host::spawn::SpawnError) -> Error {
    Error::new(
        paddock_core::ErrorCode::SpawnFailed,
        format!(
            "{} `{program}` failed: {}",
            e.stage.map_or("starting", |s| s.describe()),
            e.error
        ),
    )
}

async fn release(cgroup: Option<Arc<Cgroup>>) {
    if let Some(g) = cgroup {
        let _ = blocking(move || {
            g.remove()
                .map_err(|e| Error::engine_io("removing the process's cgroup", e))
        })
        .await;
    }
}
