//! Background processes, terminals and TCP streams of a container sandbox.
//!
//! They live in the sandbox's warm container: the agent starts them (see
//! [`super::control`]), the host keeps their pipes (or the terminal's master) and
//! reads them directly, and a TCP stream is a socket made inside the container's
//! network namespace. A sandbox without a warm container (warm mode off, or no agent)
//! cannot have them, and the engine does not advertise them then.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use paddock_core::interactive::DEFAULT_OUTPUT_BUFFER;
use paddock_core::{
    Error, ErrorCode, ProcessHandle, ProcessSpec, Result, TcpConnection, TcpTarget, TerminalHandle,
    TerminalSpec,
};

use super::control::RemoteLeader;
use super::sandbox::ContainerSandbox;
use super::warm::Guest;
use crate::host::sys;
use crate::interactive::{adopt_remote, pipes, ProcessOps, Signaller, Wiring};
use crate::sandbox::WorkdirBacked;

impl ContainerSandbox {
    pub(super) fn guest(&self) -> Result<Guest> {
        self.guest.lock().clone().ok_or_else(|| {
            Error::new(
                ErrorCode::EngineFailed,
                format!(
                    "sandbox {} has no warm container to run processes in (it could not start); retry, or check `paddock doctor`",
                    self.id
                ),
            )
        })
    }
}

impl ProcessOps for ContainerSandbox {
    async fn start_process(&self, spec: ProcessSpec) -> Result<ProcessHandle> {
        self.engine.caps.check_feature(
            &self.engine.name,
            paddock_core::interactive::FEATURE_PROCESS,
        )?;
        let _op = self.enter()?;
        self.refuse_if_paused()?;
        spec.validate()?;
        let guest = self.guest()?;
        let place = self.processes.reserve("p")?;
        let id = place.id.clone();
        let (cwd, env) = self.guest_env(spec.cwd.as_deref(), &spec.env)?;
        let (ends, wiring) = pipes(spec.stdin)?;
        let started = guest
            .control
            .spawn(
                &id,
                spec.argv.clone(),
                env,
                cwd,
                None,
                &ends.each_ref().map(|fd| fd.as_fd()),
            )
            .await?;
        // The container has its copies now; ours go, so EOF means the process's.
        drop(ends);
        self.mark_used();
        let shared = adopt_remote(
            place,
            wiring,
            Arc::new(RemoteLeader {
                control: guest.control.clone(),
                id,
            }),
            started.exit,
            DEFAULT_OUTPUT_BUFFER,
        )?;
        Ok(ProcessHandle::new(shared))
    }

    async fn open_terminal(&self, spec: TerminalSpec) -> Result<TerminalHandle> {
        self.engine.caps.check_feature(
            &self.engine.name,
            paddock_core::interactive::FEATURE_TERMINAL,
        )?;
        let _op = self.enter()?;
        self.refuse_if_paused()?;
        spec.validate()?;
        let guest = self.guest()?;
        let place = self.processes.reserve("t")?;
        let id = place.id.clone();
        let mut extra = spec.env.clone();
        extra
            .entry("TERM".into())
            .or_insert_with(|| "xterm-256color".into());
        let (cwd, env) = self.guest_env(spec.cwd.as_deref(), &extra)?;
        let started = guest
            .control
            .spawn(
                &id,
                spec.argv(),
                env,
                cwd,
                Some((spec.size.rows, spec.size.cols)),
                &[],
            )
            .await?;
        let Some(master) = started.master else {
            RemoteLeader {
                control: guest.control.clone(),
                id,
            }
            .signal(libc::SIGKILL);
            return Err(Error::new(
                ErrorCode::ProtocolError,
                "the container's agent started a terminal without handing over its master",
            ));
        };
        self.mark_used();
        let shared = adopt_remote(
            place,
            Wiring::Pty(master),
            Arc::new(RemoteLeader {
                control: guest.control.clone(),
                id,
            }),
            started.exit,
            DEFAULT_OUTPUT_BUFFER,
        )?;
        Ok(TerminalHandle::new(shared))
    }

    async fn open_tcp_connection(&self, target: TcpTarget) -> Result<TcpConnection> {
        self.engine
            .caps
            .check_feature(&self.engine.name, paddock_core::interactive::FEATURE_TCP)?;
        let _op = self.enter()?;
        self.refuse_if_paused()?;
        target.loopback_addr()?;
        crate::interactive::refuse_gateway_port(&target, self.egress.lock().is_some())?;
        let guest = self.guest()?;
        // The container's network namespace, through its init process.
        let pid_file = guest.pid_file.clone();
        let cgroup = guest.cgroup.clone();
        let netns: OwnedFd = crate::task::blocking(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let pid = loop {
                match std::fs::read_to_string(&pid_file) {
                    Ok(s) if !s.trim().is_empty() => break s.trim().to_string(),
                    _ if std::time::Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(2))
                    }
                    _ => {
                        return Err(Error::new(
                            ErrorCode::EngineFailed,
                            "the sandbox's warm container did not start; retry",
                        ))
                    }
                }
            };
            open_container_netns(&pid, &cgroup)
        })
        .await?;
        let conn = crate::interactive::connect(Some(netns.as_raw_fd()), &target).await;
        drop(netns);
        conn
    }
}

/// The network namespace of the container whose init has `pid`, checked: the pid is
/// pinned with a pidfd, it must sit in the container's cgroup, and it must still run
/// after the namespace was opened (so the namespace is that process's, not a later
/// process's that got the same pid after the container ended).
fn open_container_netns(pid: &str, cgroup: &str) -> Result<OwnedFd> {
    let gone = || {
        Error::new(
            ErrorCode::EngineFailed,
            "the sandbox's warm container is not running; retry, a fresh one is starting",
        )
    };
    let pid: libc::pid_t = pid.parse().map_err(|_| gone())?;
    let pidfd = sys::pidfd_open(pid).map_err(|_| gone())?;
    // Paths in /proc are relative to the reader's cgroup namespace: compare the
    // sandbox's and the container's own names, which are unique.
    let tail: Vec<&str> = cgroup.rsplit('/').take(2).collect();
    let suffix = format!(
        "/{}/{}",
        tail.get(1).unwrap_or(&""),
        tail.first().unwrap_or(&"")
    );
    let groups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    if !groups.lines().any(|l| l.ends_with(&suffix)) {
        return Err(gone());
    }
    let netns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .map(OwnedFd::from)
        .map_err(|e| Error::engine_io("entering the container's network namespace", e))?;
    if sys::pidfd_exited(&pidfd) {
        return Err(gone());
    }
    Ok(netns)
}
