//! How the suite obtains engines: a factory called once per case.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use paddock_core::Engine;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a factory's future may yield: an engine, or a reason the engine cannot run on
/// this host.
pub trait IntoEngine {
    /// The engine, or why every case must be skipped.
    fn into_engine(self) -> Result<Arc<dyn Engine>, String>;
}

impl IntoEngine for Arc<dyn Engine> {
    fn into_engine(self) -> Result<Arc<dyn Engine>, String> {
        Ok(self)
    }
}

/// `Err` means "this engine cannot run on this host": every case is skipped with the
/// error as its reason. Return a plain `Arc<dyn Engine>` (and panic on errors) when an
/// engine that fails to start should fail the suite instead.
impl<E: fmt::Display> IntoEngine for Result<Arc<dyn Engine>, E> {
    fn into_engine(self) -> Result<Arc<dyn Engine>, String> {
        self.map_err(|e| format!("the engine cannot run on this host: {e}"))
    }
}

/// Creates fresh engines for the suite.
///
/// Implemented for every `Fn() -> impl Future<Output = impl IntoEngine>` closure, such
/// as `|| async { Arc::new(MyEngine::new()) as Arc<dyn Engine> }`. Each case calls the
/// factory once for its main engine and again whenever it needs another engine; every
/// sandbox a case creates is destroyed when the case ends.
pub trait EngineFactory: Send + Sync + 'static {
    /// Creates one engine, or says why the engine cannot run on this host.
    fn make(&self) -> BoxFuture<'static, Result<Arc<dyn Engine>, String>>;
}

impl<F, Fut> EngineFactory for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: IntoEngine,
{
    fn make(&self) -> BoxFuture<'static, Result<Arc<dyn Engine>, String>> {
        let fut = self();
        Box::pin(async move { fut.await.into_engine() })
    }
}
