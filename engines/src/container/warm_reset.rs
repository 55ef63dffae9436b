//! Renewing a sandbox's warm container: replaced after a turn that did not end
//! cleanly, and at a recycle reset in place by its agent when it can be (else
//! replaced too).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::sandbox::ContainerSandbox;
use super::warm::WarmContainer;
use crate::sandbox::WorkdirBacked;
use crate::task::blocking;

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
}
