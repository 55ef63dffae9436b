//! The watch over one program a cold execution starts: the subprocess engine's child,
//! or the container engine's runtime process. Both engines run the same loop: pump the
//! pipes, wait for the first of cancel, destroy, deadline and exit, kill, wait for the
//! exit, kill the process group, reap.

use std::future::Future;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::time::Duration;

use paddock_core::{CancelToken, Error, Result};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::futures::Notified;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::host::sys::{self, ExitStatus};
use crate::task::sleep_until_opt;

/// How long output pipes may stay open after the program has exited (a descendant
/// that holds them does not hold the execution).
pub(crate) const DRAIN_GRACE: Duration = Duration::from_millis(200);

/// Why the wait for the program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    Exited,
    Deadline,
    Cancelled,
    Destroyed,
}

/// Tells the output pumps to stop waiting for more bytes [`DRAIN_GRACE`] after the
/// wait ends, however it ends (also when its future is dropped).
pub(crate) struct StopOnDrop<'a>(pub(crate) &'a watch::Sender<Option<Instant>>);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.send(Some(Instant::now() + DRAIN_GRACE));
    }
}

/// A started program, watched through its pidfd.
pub(crate) struct Watched {
    pid: libc::pid_t,
    exit: AsyncFd<OwnedFd>,
    /// What the program is, for errors: "the child", "the runtime".
    what: &'static str,
}

impl Watched {
    /// Watches `pid` through `pidfd`.
    pub(crate) fn new(pid: libc::pid_t, pidfd: OwnedFd, what: &'static str) -> Result<Watched> {
        let exit = sys::async_fd(pidfd, Interest::READABLE)
            .map_err(|e| Error::engine_io(&format!("watching {what}"), e))?;
        Ok(Watched { pid, exit, what })
    }

    /// The pidfd.
    pub(crate) fn pidfd(&self) -> &OwnedFd {
        self.exit.get_ref()
    }

    /// Resolves when the program has exited (its pidfd is readable).
    async fn exited(&self) -> Result<()> {
        let _ready = self
            .exit
            .readable()
            .await
            .map_err(|e| Error::engine_io(&format!("waiting for {}", self.what), e))?;
        Ok(())
    }

    /// Waits for the first of: `cancel`, the sandbox's destroy, the deadline, the
    /// program's exit (checked in that order when several are ready).
    pub(crate) async fn ending(
        &self,
        cancel: &CancelToken,
        destroyed: Pin<&mut Notified<'_>>,
        deadline: Option<Instant>,
    ) -> Result<Ending> {
        Ok(tokio::select! {
            biased;
            _ = cancel.cancelled() => Ending::Cancelled,
            _ = destroyed => Ending::Destroyed,
            _ = sleep_until_opt(deadline) => Ending::Deadline,
            r = self.exited() => { r?; Ending::Exited }
        })
    }

    /// Ends the program and reaps it. After an `ending` that is not its exit, `kill`
    /// ends it and its exit is awaited (past `grace`, when given, its process group is
    /// killed and the exit awaited again). Then the group is killed once more: the
    /// program is a zombie, so its pid cannot be reused yet and the kill cannot hit a
    /// stranger. Then it is reaped.
    pub(crate) async fn stop_and_reap(
        &self,
        ending: Ending,
        kill: impl Future<Output = ()>,
        grace: Option<Duration>,
    ) -> Result<ExitStatus> {
        if ending != Ending::Exited {
            kill.await;
            match grace {
                None => self.exited().await?,
                Some(grace) => {
                    if tokio::time::timeout(grace, self.exited()).await.is_err() {
                        sys::kill_group(self.pid, libc::SIGKILL);
                        let _ = self.exited().await;
                    }
                }
            }
        }
        sys::kill_group(self.pid, libc::SIGKILL);
        sys::reap(self.pid).map_err(|e| Error::engine_io(&format!("reaping {}", self.what), e))
    }
}
