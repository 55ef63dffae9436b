//! Sandbox sessions from open to destroy: opening one on a pooled instance, running
//! in it, describing it, keeping pools warm for it, and ending it when asked or when
//! it has been idle or open past its time.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use paddock_core::{CancelToken, Error, ErrorCode, ExecResult, SandboxStatus};

use super::choice::Runs;
use super::{Session, Supervisor};
use crate::engine_pool::DiskKey;
use crate::messages::*;
use crate::pipeline::Target;
use crate::shares::Share;

/// How many destroyed session ids are remembered, so a repeated destroy is Ok.
const REMEMBERED_DESTROYED: usize = 10_000;

impl Supervisor {
    /// Forgets session `id`, remembering it (and its owner) as destroyed.
    fn remove_session(&mut self, id: &str) -> Option<Rc<Session>> {
        let session = self.sessions.remove(id)?;
        if self.destroyed_sessions.len() >= REMEMBERED_DESTROYED {
            self.destroyed_sessions.pop_front();
        }
        self.destroyed_sessions
            .push_back((id.to_string(), session.tenant.clone()));
        Some(session)
    }

    /// Destroys `session` (already removed from the open ones), keeping it as
    /// destroying until its teardown has ended, so that a concurrent destroy of the
    /// same id waits for that teardown too.
    fn destroy_session(
        &mut self,
        id: String,
        session: Rc<Session>,
    ) -> impl ActorFuture<Self, Output = Result<(), Error>> + 'static {
        let ending = end_session(session);
        self.destroying.insert(id.clone(), ending.clone());
        ending.into_actor(self).map(move |(), act, _ctx| {
            act.destroying.remove(&id);
            Ok(())
        })
    }

    /// Destroys sessions idle or open past their time.
    pub(super) fn expire_sessions(&mut self, ctx: &mut Context<Self>) {
        let idle = Duration::from_millis(self.pool_config.sandbox_idle_timeout_ms);
        let lifetime = Duration::from_millis(self.pool_config.sandbox_max_lifetime_ms);
        let now = Instant::now();
        let expired: Vec<(String, &'static str)> = self
            .sessions
            .iter()
            .filter_map(|(id, s)| s.expired(now, idle, lifetime).map(|why| (id.clone(), why)))
            .collect();
        for (id, why) in expired {
            if let Some(session) = self.remove_session(&id) {
                tracing::info!(sandbox = %id, reason = why, "destroying an expired sandbox");
                let destroyed = self.destroy_session(id.clone(), session);
                ctx.spawn(destroyed.map(move |r, _act, _ctx| {
                    if let Err(e) = r {
                        tracing::warn!(sandbox = %id, error = %e, "destroying an expired sandbox failed");
                    }
                }));
            }
        }
    }
}

/// A session's end under way: resolves once its instance is recycled or gone.
pub(super) type Ending =
    futures_util::future::Shared<futures_util::future::LocalBoxFuture<'static, ()>>;

/// Ends `session` (see [`Session::end`]) and lets it go; the future resolves when
/// its instance is back in the pool, recycled, or destroyed.
pub(super) fn end_session(session: Rc<Session>) -> Ending {
    use futures_util::FutureExt;
    let done = session.end();
    drop(session);
    async move {
        // A dropped sender: the pool went first, and the instance with it.
        let _ = done.await;
    }
    .boxed_local()
    .shared()
}

impl Handler<OpenSandbox> for Supervisor {
    type Result = ResponseActFuture<Self, Result<SandboxInfo, Error>>;

    fn handle(&mut self, msg: OpenSandbox, _ctx: &mut Self::Context) -> Self::Result {
        let tenant = msg.spec.tenant.clone();
        // Checked before a pool is chosen: a pool of the sandbox's disk quota may be
        // made for it.
        let checked = msg.spec.limits.validate("limits", false).and_then(|()| {
            paddock_core::tenancy::check_ceilings(
                &self.pipeline.ceilings,
                &msg.spec.limits,
                "limits",
            )
        });
        if let Err(e) = checked {
            return Box::pin(actix::fut::ready(Err(e)));
        }
        let prepared = self
            .allowed_pool(
                msg.engine,
                msg.spec.level,
                Runs::Sandbox,
                &msg.spec.network,
                // Its filesystem is made with the instance: one of this size.
                DiskKey::of(&msg.spec.limits),
                msg.spec.home.as_deref(),
                tenant.as_deref(),
            )
            .and_then(|pool| {
                let caps = pool.engine().capabilities();
                caps.check_level(&pool.kind, msg.spec.level)?;
                msg.spec.limits.validate("limits", false)?;
                caps.check_limits(&pool.kind, &msg.spec.limits, "limits")?;
                paddock_core::tenancy::check_ceilings(
                    &self.pipeline.ceilings,
                    &msg.spec.limits,
                    "limits",
                )?;
                // Held from here: a sandbox being opened counts against the caps.
                let share = Share::take(&self.pipeline.shares, &tenant, true)?;
                Ok((pool, share))
            });
        let stopping = self.pipeline.shared.stopping.load(Ordering::Acquire);
        Box::pin(
            async move {
                if stopping {
                    return Err(Error::new(
                        ErrorCode::EngineDisposed,
                        "Paddock is shutting down; no new sandboxes are opened",
                    ));
                }
                let (pool, share) = prepared?;
                let lease = pool.acquire(&CancelToken::new()).await?;
                Ok((pool.kind.clone(), lease, share))
            }
            .into_actor(self)
            .map(move |r, act, _ctx| {
                let (engine, lease, share) = r?;
                // Its own id, never reused: the instance outlives the session
                // (recycled for the next one), and a destroyed id stays destroyed.
                // Tagged like the instance's, which names its engine.
                let instance = lease.instance().sandbox.id().to_string();
                let tag = instance.split('-').next().unwrap_or("sb");
                let id = paddock_core::ids::tagged(tag);
                let session = Rc::new(Session {
                    engine: engine.clone(),
                    lease,
                    tenant: msg.spec.tenant.clone(),
                    limits: msg.spec.limits.clone(),
                    processes: RefCell::new(Default::default()),
                    opened: Instant::now(),
                    last_used: Cell::new(Instant::now()),
                    busy: Cell::new(0),
                    transfers: Arc::default(),
                    transfer_ended_ms: Arc::default(),
                    _share: share,
                    running: RefCell::default(),
                    ended: RefCell::default(),
                });
                // An engine that panics here never gets a session: the lease retires
                // the tainted instance when it goes.
                let (status, root_dir, host_dir) = session.describe()?;
                act.sessions.insert(id.clone(), session);
                Ok(SandboxInfo {
                    id,
                    engine,
                    status,
                    root_dir,
                    host_dir,
                })
            }),
        )
    }
}

impl Handler<SandboxExec> for Supervisor {
    type Result = ResponseFuture<Result<ExecResult, Error>>;

    fn handle(&mut self, msg: SandboxExec, _ctx: &mut Self::Context) -> Self::Result {
        self.sandbox_exec(msg, None)
    }
}

impl Handler<Proven<SandboxExec>> for Supervisor {
    type Result = ResponseFuture<Result<ExecResult, Error>>;

    fn handle(&mut self, msg: Proven<SandboxExec>, _ctx: &mut Self::Context) -> Self::Result {
        self.sandbox_exec(msg.msg, Some(msg.proven))
    }
}

impl Supervisor {
    /// Runs one execution in a session: the session found for the caller, the
    /// request validated once ([`Pipeline::check_request`](crate::pipeline::Pipeline::check_request),
    /// `proven` told so), then the pipeline on the session's lease.
    fn sandbox_exec(
        &mut self,
        msg: SandboxExec,
        proven: Option<tokio::sync::oneshot::Sender<()>>,
    ) -> ResponseFuture<Result<ExecResult, Error>> {
        let session = match self.session_for(&msg.caller, &msg.sandbox) {
            Ok(s) => s,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let mut request = msg.request;
        if request.tenant.is_none() {
            request.tenant = session.tenant.clone();
        }
        let request = match self.pipeline.check_request(request) {
            Ok(valid) => valid,
            Err(e) => {
                let e = self.refuse(e);
                return Box::pin(async move { Err(e) });
            }
        };
        if let Some(proven) = proven {
            let _ = proven.send(());
        }
        let engine = session.engine.clone();
        let pipeline = self.pipeline.clone();
        Box::pin(pipeline.run(Target::Session(session), request, engine, msg.sink, None))
    }
}

impl Handler<GetSandbox> for Supervisor {
    type Result = Result<SandboxInfo, Error>;

    fn handle(&mut self, msg: GetSandbox, _ctx: &mut Self::Context) -> Self::Result {
        let session = self.session_for(&msg.caller, &msg.id)?;
        self.note_operator(&msg.caller, msg.action, Some(msg.id.clone()));
        let (status, root_dir, host_dir) = session.describe()?;
        Ok(SandboxInfo {
            id: msg.id,
            engine: session.engine.clone(),
            status,
            root_dir,
            host_dir,
        })
    }
}

impl Handler<WarmPool> for Supervisor {
    type Result = Result<(), Error>;

    fn handle(&mut self, msg: WarmPool, _ctx: &mut Self::Context) -> Self::Result {
        let home: Option<Arc<str>> = msg.spec.home.as_deref().map(Arc::from);
        let key = (
            msg.engine.clone(),
            msg.spec.network.clone(),
            DiskKey::of(&msg.spec.limits),
            home,
            None,
        );
        let n = self.warm_sizes.entry(key.clone()).or_insert(0);
        *n = (*n).max(msg.min_idle);
        if self.pools.contains_key(&key) {
            return Ok(());
        }
        // Made (and prewarmed) now, so that the first sandbox finds one ready.
        self.pool(
            Some(msg.engine),
            msg.spec.level,
            Runs::Sandbox,
            &msg.spec.network,
            DiskKey::of(&msg.spec.limits),
            msg.spec.home.as_deref(),
            None,
        )
        .map(drop)
    }
}

impl Handler<GetSandboxStatus> for Supervisor {
    type Result = Result<SandboxStatus, Error>;

    fn handle(&mut self, msg: GetSandboxStatus, _ctx: &mut Self::Context) -> Self::Result {
        match self.session_for(&msg.caller, &msg.sandbox) {
            Ok(s) => Ok(s.describe()?.0),
            Err(e) if e.code == ErrorCode::EngineDisposed => Ok(SandboxStatus::Destroyed),
            Err(e) => Err(e),
        }
    }
}

impl Handler<DestroySandbox> for Supervisor {
    type Result = ResponseActFuture<Self, Result<(), Error>>;

    fn handle(&mut self, msg: DestroySandbox, _ctx: &mut Self::Context) -> Self::Result {
        // Another tenant's session, open or destroyed, is NOT_FOUND; a destroyed one
        // of the caller's is destroyed again, which is fine, and one whose destroy is
        // under way is joined: every destroy returns after the teardown.
        match self.session_for(&msg.caller, &msg.sandbox) {
            Ok(_) => {}
            Err(e) if e.code == ErrorCode::EngineDisposed => {
                return match self.destroying.get(&msg.sandbox).cloned() {
                    Some(ending) => Box::pin(
                        async move {
                            ending.await;
                            Ok(())
                        }
                        .into_actor(self),
                    ),
                    None => Box::pin(actix::fut::ready(Ok(()))),
                };
            }
            Err(e) => return Box::pin(actix::fut::ready(Err(e))),
        }
        let Some(session) = self.remove_session(&msg.sandbox) else {
            return Box::pin(actix::fut::ready(Ok(())));
        };
        self.note_operator(&msg.caller, "sandbox.destroy", Some(msg.sandbox.clone()));
        Box::pin(self.destroy_session(msg.sandbox, session))
    }
}
