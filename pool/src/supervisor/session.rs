//! A session: a lease of one engine instance for a tenant, and what counts as its use.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_core::{CancelToken, EngineName, Error, ExecutionId, Limits, SandboxStatus};

use crate::engine_pool::Lease;

use crate::shares::Share;

#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) engine: EngineName,
    pub(crate) lease: Lease,
    pub(crate) tenant: Option<String>,
    pub(crate) limits: Limits,
    /// Its background processes and terminals.
    pub(crate) processes: RefCell<super::interactive::Processes>,
    /// When it was opened.
    pub(crate) opened: Instant,
    /// The last call on it.
    pub(crate) last_used: Cell<Instant>,
    /// Executions running in it, and uploads into it.
    pub(crate) busy: Cell<u32>,
    /// Downloads of its files in progress (readers live on other threads).
    pub(crate) transfers: Arc<std::sync::atomic::AtomicUsize>,
    /// When the last download ended, in ms after `opened`.
    pub(crate) transfer_ended_ms: Arc<AtomicU64>,
    /// Its place among its tenant's shares.
    pub(crate) _share: Share,
    /// The executions running in it, cancelled when it ends.
    pub(crate) running: RefCell<std::collections::HashMap<ExecutionId, CancelToken>>,
    /// Set when it ended: hears when its instance is back in the pool or gone.
    pub(crate) ended: RefCell<Option<tokio::sync::oneshot::Sender<()>>>,
}

impl Drop for Session {
    fn drop(&mut self) {
        // Every execution, upload and call on it is over (each held the session).
        // Its instance goes back to the pool, recycled like after any lease, unless
        // a download still reads its files: then it is retired.
        if let Some(done) = self.ended.get_mut().take() {
            let quiet = self.transfers.load(Ordering::Acquire) == 0;
            self.lease.end_on_drop(quiet, done);
        }
    }
}

impl Session {
    /// Runs one engine method on the session's instance through its engine actor,
    /// the one door to an instance: a panic becomes `ENGINE_FAILED` and taints it.
    pub(crate) fn call<T, F>(
        &self,
        what: &'static str,
        f: F,
    ) -> impl std::future::Future<Output = Result<T, Error>> + 'static
    where
        T: Send + 'static,
        F: FnOnce(Arc<dyn paddock_core::Sandbox>) -> crate::engine_actor::CallFuture<T>
            + Send
            + 'static,
    {
        let actor = self.lease.instance().actor.clone();
        async move {
            actor
                .send(crate::engine_actor::Call::new(what, f))
                .await
                .map_err(|_| Error::disposed("the sandbox's engine instance"))?
        }
    }

    /// Ends the session: cancels the executions running in it. When the last
    /// reference to it goes (every execution, upload and call on it has returned),
    /// its instance is recycled for the next lease (its processes and files gone,
    /// as after any execution) and the answer arrives; a session's instance is
    /// never handed out again with anything of it left.
    pub(crate) fn end(&self) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        *self.ended.borrow_mut() = Some(tx);
        for token in self.running.borrow().values() {
            token.cancel();
        }
        rx
    }

    /// The sandbox's status, its root as programs see it and its host directory,
    /// read with panic capture.
    pub(crate) fn describe(&self) -> Result<(SandboxStatus, String, String), Error> {
        let inst = self.lease.instance();
        let sandbox = inst.sandbox.clone();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            (
                sandbox.status(),
                sandbox.root_dir().to_string_lossy().into_owned(),
                sandbox.host_dir().to_string_lossy().into_owned(),
            )
        }))
        .map_err(|panic| {
            inst.tainted.store(true, Ordering::Release);
            crate::engine_actor::panicked("status", &*panic)
        })
    }

    /// Why it should be destroyed now, if it should: idle past `idle`, or open past
    /// `lifetime` (zero: never).
    pub(crate) fn expired(
        &self,
        now: Instant,
        idle: Duration,
        lifetime: Duration,
    ) -> Option<&'static str> {
        if !lifetime.is_zero() && now.duration_since(self.opened) >= lifetime {
            return Some("pool.sandbox_max_lifetime_ms");
        }
        let idle_now = self.busy.get() == 0
            && self.transfers.load(Ordering::Acquire) == 0
            && !self.processes.borrow().any_live();
        let transfer_ended =
            self.opened + Duration::from_millis(self.transfer_ended_ms.load(Ordering::Acquire));
        let last = self.last_used.get().max(transfer_ended);
        if !idle.is_zero() && idle_now && now.duration_since(last) >= idle {
            return Some("pool.sandbox_idle_timeout_ms");
        }
        None
    }
}

/// Counts an execution or upload running in a session while it lives, and keeps
/// the session (so its instance) from being recycled meanwhile.
pub(crate) struct Busy(Rc<Session>, Option<ExecutionId>);

impl Busy {
    pub(crate) fn new(session: Rc<Session>) -> Busy {
        session.busy.set(session.busy.get() + 1);
        Busy(session, None)
    }

    /// An execution: ending the session cancels it through `token`.
    pub(crate) fn running(session: Rc<Session>, id: ExecutionId, token: CancelToken) -> Busy {
        if session.ended.borrow().is_some() {
            token.cancel();
        }
        session.running.borrow_mut().insert(id.clone(), token);
        let mut busy = Busy::new(session);
        busy.1 = Some(id);
        busy
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(id) = &self.1 {
            self.0.running.borrow_mut().remove(id);
        }
        self.0.busy.set(self.0.busy.get().saturating_sub(1));
        self.0.last_used.set(Instant::now());
    }
}
