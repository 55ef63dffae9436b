//! What a running case works with: its engines, its sandboxes and a few helpers.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use paddock_core::{
    CancelToken, DiscardSink, Engine, ExecRequest, ExecResult, OutputChunk, OutputSink, Program,
    Sandbox, SandboxSpec, StreamKind,
};

use crate::case::{clip, OrFail, Stop};
use crate::factory::EngineFactory;

/// How long cleanup waits for one sandbox to be destroyed.
const DESTROY_GRACE: Duration = Duration::from_secs(10);

/// The context of one case run. Cheap to clone; clones share the sandboxes list.
#[derive(Clone)]
pub(crate) struct Ctx {
    inner: Arc<Inner>,
}

struct Inner {
    factory: Arc<dyn EngineFactory>,
    engine: Arc<dyn Engine>,
    sandboxes: Mutex<Vec<Arc<dyn Sandbox>>>,
}

impl fmt::Debug for Ctx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ctx")
            .field("engine", &self.inner.engine)
            .finish_non_exhaustive()
    }
}

impl Ctx {
    pub(crate) fn new(factory: Arc<dyn EngineFactory>, engine: Arc<dyn Engine>) -> Ctx {
        Ctx {
            inner: Arc::new(Inner {
                factory,
                engine,
                sandboxes: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The engine the factory made for this case.
    pub(crate) fn engine(&self) -> Arc<dyn Engine> {
        self.inner.engine.clone()
    }

    /// Another fresh engine from the factory.
    pub(crate) async fn fresh_engine(&self) -> Result<Arc<dyn Engine>, Stop> {
        self.inner
            .factory
            .make()
            .await
            .map_err(|e| Stop::Fail(format!("the factory failed to make a second engine: {e}")))
    }

    /// A fresh sandbox with the default spec, destroyed when the case ends.
    pub(crate) async fn sandbox(&self) -> Result<Arc<dyn Sandbox>, Stop> {
        self.sandbox_with(&SandboxSpec::default()).await
    }

    /// A fresh sandbox for `spec`, destroyed when the case ends.
    pub(crate) async fn sandbox_with(&self, spec: &SandboxSpec) -> Result<Arc<dyn Sandbox>, Stop> {
        let sandbox = self
            .inner
            .engine
            .create(spec)
            .await
            .or_fail(format_args!("create({spec:?})"))?;
        self.track(sandbox.clone());
        Ok(sandbox)
    }

    /// Registers a sandbox for destruction when the case ends.
    pub(crate) fn track(&self, sandbox: Arc<dyn Sandbox>) {
        lock(&self.inner.sandboxes).push(sandbox);
    }

    /// Destroys every sandbox the case created; errors are the case's business.
    pub(crate) async fn cleanup(&self) {
        let sandboxes = std::mem::take(&mut *lock(&self.inner.sandboxes));
        for sandbox in sandboxes {
            let _ = tokio::time::timeout(DESTROY_GRACE, sandbox.destroy()).await;
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A request running `sh -c script`, with `args` as `$1`, `$2`, ….
pub(crate) fn sh(script: &str, args: &[&str]) -> ExecRequest {
    let mut argv = vec!["sh".to_string(), "-c".to_string(), script.to_string()];
    if !args.is_empty() {
        argv.push("sh".to_string());
        argv.extend(args.iter().map(|a| a.to_string()));
    }
    ExecRequest::new(Program::Command { argv }).with_timeout_ms(20_000)
}

/// Runs `request` with a discarding sink and a token nobody cancels; an `Err` from
/// the engine fails the case.
pub(crate) async fn exec(sandbox: &dyn Sandbox, request: ExecRequest) -> Result<ExecResult, Stop> {
    let what = describe(&request);
    sandbox
        .exec(request, &DiscardSink, CancelToken::new())
        .await
        .or_fail(format_args!("exec of {what}"))
}

/// A short description of a request for messages.
pub(crate) fn describe(request: &ExecRequest) -> String {
    match &request.program {
        Program::Command { argv } if argv.len() >= 3 && argv[0] == "sh" && argv[1] == "-c" => {
            format!("`sh -c {:?}`", clip(argv[2].trim(), 120))
        }
        Program::Command { argv } => format!("`{}`", clip(&argv.join(" "), 120)),
        other => format!("{:?}", other.kind()),
    }
}

/// A short description of a result for messages.
pub(crate) fn brief(r: &ExecResult) -> String {
    format!(
        "outcome {:?}, stdout {:?}{}, stderr {:?}{}",
        r.outcome,
        clip(&r.stdout, 200),
        if r.stdout_truncated {
            " (truncated)"
        } else {
            ""
        },
        clip(&r.stderr, 200),
        if r.stderr_truncated {
            " (truncated)"
        } else {
            ""
        },
    )
}

/// A sink that records every chunk with the instant it arrived.
#[derive(Debug, Default)]
pub(crate) struct RecordingSink {
    chunks: Mutex<Vec<(Instant, OutputChunk)>>,
}

impl RecordingSink {
    pub(crate) fn new() -> RecordingSink {
        RecordingSink::default()
    }

    /// Every byte of `stream`, in arrival order.
    pub(crate) fn bytes(&self, stream: StreamKind) -> Vec<u8> {
        lock(&self.chunks)
            .iter()
            .filter(|(_, c)| c.stream == stream)
            .flat_map(|(_, c)| c.data.iter().copied())
            .collect()
    }

    /// The first chunk and when it arrived.
    pub(crate) fn first(&self) -> Option<(Instant, OutputChunk)> {
        lock(&self.chunks).first().cloned()
    }

    /// When `stream` first contained `needle`, if it has.
    pub(crate) fn seen_at(&self, stream: StreamKind, needle: &[u8]) -> Option<Instant> {
        let chunks = lock(&self.chunks);
        let mut acc = Vec::new();
        for (at, chunk) in chunks.iter().filter(|(_, c)| c.stream == stream) {
            acc.extend_from_slice(&chunk.data);
            if acc.windows(needle.len()).any(|w| w == needle) {
                return Some(*at);
            }
        }
        None
    }
}

#[async_trait]
impl OutputSink for RecordingSink {
    async fn chunk(&self, chunk: OutputChunk) -> paddock_core::Result<()> {
        lock(&self.chunks).push((Instant::now(), chunk));
        Ok(())
    }
}
