//! One actor per engine instance, and the one door to it: executions, file
//! operations, pause, processes, terminals, TCP streams, recycle and destroy all go
//! through it, and a panic in any engine method becomes `ENGINE_FAILED` (and taints
//! the instance, so it is never leased again) instead of a crash.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;

use actix::prelude::*;
use paddock_core::{CancelToken, Error, ErrorCode, ExecResult, OutputSink, Sandbox, ValidRequest};

/// Mailbox capacity of an engine actor: an instance runs one execution at a time, so
/// more than a handful of queued messages means a bug upstream.
const MAILBOX: usize = 16;

/// The actor owning one sandbox.
#[derive(Debug)]
pub struct EngineActor {
    sandbox: Arc<dyn Sandbox>,
    tainted: Arc<AtomicBool>,
}

impl EngineActor {
    /// Wraps a sandbox.
    pub fn new(sandbox: Arc<dyn Sandbox>) -> EngineActor {
        EngineActor {
            sandbox,
            tainted: Arc::default(),
        }
    }

    /// Set once an engine method panicked on this instance: it must not be leased
    /// again.
    pub fn tainted(&self) -> Arc<AtomicBool> {
        self.tainted.clone()
    }
}

/// The future a [`Call`] runs.
pub type CallFuture<T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send>>;

/// Runs one engine method on the instance's sandbox, with panic capture: file
/// operations, pause and unpause, processes, terminals, TCP streams, a session's
/// destroy.
pub struct Call<T> {
    what: &'static str,
    call: Box<dyn FnOnce(Arc<dyn Sandbox>) -> CallFuture<T> + Send>,
}

impl<T> Call<T> {
    /// A call named `what` (in the error of a panic) that runs `call` on the sandbox.
    pub fn new(
        what: &'static str,
        call: impl FnOnce(Arc<dyn Sandbox>) -> CallFuture<T> + Send + 'static,
    ) -> Call<T> {
        Call {
            what,
            call: Box::new(call),
        }
    }
}

impl<T> std::fmt::Debug for Call<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call")
            .field("what", &self.what)
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static> Message for Call<T> {
    type Result = Result<T, Error>;
}

impl<T: Send + 'static> Handler<Call<T>> for EngineActor {
    type Result = ResponseFuture<Result<T, Error>>;

    fn handle(&mut self, msg: Call<T>, _ctx: &mut Self::Context) -> Self::Result {
        let sandbox = self.sandbox.clone();
        let tainted = self.tainted.clone();
        let Call { what, call } = msg;
        Box::pin(async move {
            // Building the future runs engine code too.
            let fut = match std::panic::catch_unwind(AssertUnwindSafe(|| call(sandbox))) {
                Ok(fut) => fut,
                Err(panic) => {
                    tainted.store(true, Ordering::Release);
                    return Err(panicked(what, &*panic));
                }
            };
            caught_tainting(what, &tainted, fut).await
        })
    }
}

/// The error of a panic in engine code during `what`.
pub(crate) fn panicked(what: &str, panic: &(dyn Any + Send)) -> Error {
    Error::new(
        ErrorCode::EngineFailed,
        format!(
            "the engine panicked during {what}: {}; the instance is replaced",
            panic_message(panic)
        ),
    )
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
    /// The request, validated when the pipeline admitted it; the engine does not
    /// validate it again.
    pub request: ValidRequest,
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
        let tainted = self.tainted.clone();
        Box::pin(async move {
            let RunExec {
                request,
                sink,
                cancel,
            } = msg;
            caught_tainting("exec", &tainted, async move {
                sandbox.exec_valid(request, &*sink, cancel).await
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
        let tainted = self.tainted.clone();
        Box::pin(async move {
            caught_tainting("recycle", &tainted, async move { sandbox.recycle().await }).await
        })
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
        Err(panic) => Err(panicked(what, &*panic)),
    }
}

/// [`caught`], marking the instance tainted when `fut` panicked.
async fn caught_tainting<T>(
    what: &'static str,
    tainted: &AtomicBool,
    fut: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match CatchUnwind(Box::pin(fut)).await {
        Ok(r) => r,
        Err(panic) => {
            tainted.store(true, Ordering::Release);
            Err(panicked(what, &*panic))
        }
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
