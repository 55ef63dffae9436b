//! One actor per engine instance: runs executions, recycles and destroys the sandbox,
//! and turns a panic in engine code into `ENGINE_FAILED` instead of a crash.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use actix::prelude::*;
use paddock_core::{CancelToken, Error, ErrorCode, ExecRequest, ExecResult, OutputSink, Sandbox};

/// Mailbox capacity of an engine actor: an instance runs one execution at a time, so
/// more than a handful of queued messages means a bug upstream.
const MAILBOX: usize = 16;

/// The actor owning one sandbox.
#[derive(Debug)]
pub struct EngineActor {
    sandbox: Arc<dyn Sandbox>,
}

impl EngineActor {
    /// Wraps a sandbox.
    pub fn new(sandbox: Arc<dyn Sandbox>) -> EngineActor {
        EngineActor { sandbox }
    }
}

impl Actor for EngineActor {
    type Context = actix::Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(MAILBOX);
    }
}

/// Runs one execution on the instance.
#[derive(Message)]
#[rtype(result = "Result<ExecResult, Error>")]
pub struct RunExec {
    /// The request.
    pub request: ExecRequest,
    /// Where output goes while it runs.
    pub sink: Arc<dyn OutputSink>,
    /// Cancels the execution.
    pub cancel: CancelToken,
}

impl std::fmt::Debug for RunExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunExec")
            .field("id", &self.request.id)
            .finish_non_exhaustive()
    }
}

impl Handler<RunExec> for EngineActor {
    type Result = ResponseFuture<Result<ExecResult, Error>>;

    fn handle(&mut self, msg: RunExec, _ctx: &mut Self::Context) -> Self::Result {
        let sandbox = self.sandbox.clone();
        Box::pin(async move {
            let RunExec {
                request,
                sink,
                cancel,
            } = msg;
            caught("exec", async move {
                sandbox.exec(request, &*sink, cancel).await
            })
            .await
        })
    }
}

/// Resets the instance for its next lease (the health check on recycle).
#[derive(Debug, Message)]
#[rtype(result = "Result<(), Error>")]
pub struct Recycle;

impl Handler<Recycle> for EngineActor {
    type Result = ResponseFuture<Result<(), Error>>;

    fn handle(&mut self, _msg: Recycle, _ctx: &mut Self::Context) -> Self::Result {
        let sandbox = self.sandbox.clone();
        Box::pin(caught("recycle", async move { sandbox.recycle().await }))
    }
}

/// Destroys the sandbox and stops the actor.
#[derive(Debug, Message)]
#[rtype(result = "Result<(), Error>")]
pub struct DestroyInstance;

impl Handler<DestroyInstance> for EngineActor {
    type Result = ResponseActFuture<Self, Result<(), Error>>;

    fn handle(&mut self, _msg: DestroyInstance, _ctx: &mut Self::Context) -> Self::Result {
        let sandbox = self.sandbox.clone();
        Box::pin(
            caught("destroy", async move { sandbox.destroy().await })
                .into_actor(self)
                .map(|result, _actor, ctx| {
                    ctx.stop();
                    result
                }),
        )
    }
}

/// Runs `fut`, turning a panic into `ENGINE_FAILED`.
pub(crate) async fn caught<T>(
    what: &'static str,
    fut: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match CatchUnwind(Box::pin(fut)).await {
        Ok(r) => r,
        Err(panic) => Err(Error::new(
            ErrorCode::EngineFailed,
            format!(
                "the engine panicked during {what}: {}; the instance is replaced",
                panic_message(&*panic)
            ),
        )),
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_string()
    }
}

struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn Any + Send>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let fut = self.0.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}
