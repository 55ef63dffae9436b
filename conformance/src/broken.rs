//! Deliberately broken engines: wrappers around a real engine, each with one defect
//! the suite must catch.
//!
//! ```no_run
//! use std::sync::{Arc, Mutex};
//!
//! use paddock_conformance::broken::{Broken, Flaw};
//! use paddock_core::Engine;
//! use paddock_engines::subprocess::{SubprocessConfig, SubprocessEngine};
//!
//! async fn suite_catches_a_lost_cancel() {
//!     let results = paddock_conformance::run_all(|| async {
//!         let real = Arc::new(SubprocessEngine::new(&SubprocessConfig::default()).unwrap());
//!         Broken::wrap(real, Flaw::IgnoresCancel)
//!     })
//!     .await;
//!     for (name, result) in results {
//!         if Flaw::IgnoresCancel.caught_by().contains(&name) {
//!             assert!(result.is_failed(), "{name}: {result}");
//!         }
//!     }
//! }
//! ```

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use paddock_core::{
    CancelToken, Capabilities, Engine, EngineName, Error, ErrorCode, ExecRequest, ExecResult,
    FileEntry, Outcome, OutputChunk, OutputSink, Result, Sandbox, SandboxSpec, SandboxStatus,
};

/// The defect a [`Broken`] engine has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flaw {
    /// Runs every execution with a fresh token it never cancels, so cancelling the
    /// caller's token does nothing.
    IgnoresCancel,
    /// Honours cancel, then reports a cancelled execution as `Completed { exit_code: 0 }`.
    ReportsSuccessOnCancel,
    /// Forwards cancellation to the wrapped engine but never settles the caller's
    /// token when the program finishes, so a cancel that arrives as the program ends is
    /// lost and the execution is reported as a clean success.
    LosesCancelRace,
    /// Ignores the request's `timeout_ms` (the sandbox's default deadline still holds).
    IgnoresTimeout,
    /// Holds every output chunk back until the program has exited.
    BuffersOutput,
    /// Reads and writes files at `root_dir().join(path)` without any confinement:
    /// `..`, absolute paths and symlinks all escape the workdir. (Listing still goes
    /// through the wrapped engine.)
    NoPathConfinement,
    /// Copies every host variable whose name contains `SECRET`, `KEY` or `TOKEN` into
    /// the request's environment.
    LeaksSecrets,
    /// Starts watches that never report a change (a watch that polls nothing).
    DeafWatch,
}

impl Flaw {
    /// Every flaw.
    pub const ALL: &'static [Flaw] = &[
        Flaw::IgnoresCancel,
        Flaw::ReportsSuccessOnCancel,
        Flaw::LosesCancelRace,
        Flaw::IgnoresTimeout,
        Flaw::BuffersOutput,
        Flaw::NoPathConfinement,
        Flaw::LeaksSecrets,
        Flaw::DeafWatch,
    ];

    /// The cases that must fail for an engine with this flaw (given that the wrapped
    /// engine passes them).
    pub fn caught_by(self) -> &'static [&'static str] {
        match self {
            Flaw::IgnoresCancel | Flaw::ReportsSuccessOnCancel => &[
                "abort_kills_process_tree",
                "abort_is_never_success",
                "js_cancel_stops_busy_loop",
            ],
            Flaw::LosesCancelRace => &["abort_is_never_success"],
            Flaw::IgnoresTimeout => &["timeout_kills_process_tree", "js_timeout_stops_busy_loop"],
            Flaw::BuffersOutput => &["exec_streams_live", "js_console_streams_live"],
            Flaw::NoPathConfinement => &["files_path_escape"],
            Flaw::LeaksSecrets => &["env_is_sanitized"],
            Flaw::DeafWatch => &["fileops_watch_events"],
        }
    }
}

impl fmt::Display for Flaw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// An engine that delegates to a real one, except for its [`Flaw`].
#[derive(Debug)]
pub struct Broken {
    inner: Arc<dyn Engine>,
    flaw: Flaw,
}

impl Broken {
    /// Wraps `inner` with `flaw`.
    pub fn new(inner: Arc<dyn Engine>, flaw: Flaw) -> Broken {
        Broken { inner, flaw }
    }

    /// Wraps `inner` with `flaw`, ready to return from a factory.
    pub fn wrap(inner: Arc<dyn Engine>, flaw: Flaw) -> Arc<dyn Engine> {
        Arc::new(Broken::new(inner, flaw))
    }

    /// The flaw.
    pub fn flaw(&self) -> Flaw {
        self.flaw
    }
}

#[async_trait]
impl Engine for Broken {
    fn name(&self) -> EngineName {
        self.inner.name()
    }

    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Arc<dyn Sandbox>> {
        let inner = self.inner.create(spec).await?;
        Ok(Arc::new(BrokenSandbox {
            inner,
            flaw: self.flaw,
        }))
    }
}

/// Keeps chunks instead of delivering them.
#[derive(Debug, Default)]
struct HoldingSink {
    chunks: Mutex<Vec<OutputChunk>>,
}

#[async_trait]
impl OutputSink for HoldingSink {
    async fn chunk(&self, chunk: OutputChunk) -> Result<()> {
        self.chunks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(chunk);
        Ok(())
    }
}

#[derive(Debug)]
struct BrokenSandbox {
    inner: Arc<dyn Sandbox>,
    flaw: Flaw,
}

impl BrokenSandbox {
    /// The unconfined host path for `path`.
    fn unconfined(&self, path: &str) -> Result<PathBuf> {
        if self.inner.status() == SandboxStatus::Destroyed {
            return Err(Error::disposed("the sandbox"));
        }
        Ok(self.inner.host_dir().join(path))
    }
}

fn io_error(path: &Path, err: io::Error) -> Error {
    if err.kind() == io::ErrorKind::NotFound {
        Error::new(
            ErrorCode::NotFound,
            format!("{} does not exist", path.display()),
        )
    } else {
        Error::engine_io(&path.display().to_string(), err)
    }
}

#[async_trait]
impl Sandbox for BrokenSandbox {
    fn id(&self) -> &str {
        self.inner.id()
    }

    fn engine(&self) -> EngineName {
        self.inner.engine()
    }

    fn root_dir(&self) -> &Path {
        self.inner.root_dir()
    }

    fn host_dir(&self) -> &Path {
        self.inner.host_dir()
    }

    fn status(&self) -> SandboxStatus {
        self.inner.status()
    }

    async fn exec(
        &self,
        mut request: ExecRequest,
        sink: &dyn OutputSink,
        cancel: CancelToken,
    ) -> Result<ExecResult> {
        match self.flaw {
            Flaw::IgnoresCancel => self.inner.exec(request, sink, CancelToken::new()).await,
            Flaw::ReportsSuccessOnCancel => {
                let mut result = self.inner.exec(request, sink, cancel.clone()).await?;
                if result.outcome == Outcome::Cancelled && cancel.is_cancelled() {
                    result.outcome = Outcome::Completed {
                        exit_code: 0,
                        signal: None,
                    };
                }
                Ok(result)
            }
            Flaw::LosesCancelRace => {
                let own = CancelToken::new();
                let forward = {
                    let own = own.clone();
                    tokio::spawn(async move {
                        cancel.cancelled().await;
                        own.cancel();
                    })
                };
                let result = self.inner.exec(request, sink, own).await;
                forward.abort();
                result
            }
            Flaw::IgnoresTimeout => {
                request.limits.timeout_ms = None;
                self.inner.exec(request, sink, cancel).await
            }
            Flaw::BuffersOutput => {
                let held = HoldingSink::default();
                let result = self.inner.exec(request, &held, cancel).await;
                let chunks =
                    std::mem::take(&mut *held.chunks.lock().unwrap_or_else(|p| p.into_inner()));
                for chunk in chunks {
                    if sink.chunk(chunk).await.is_err() {
                        break;
                    }
                }
                result
            }
            Flaw::LeaksSecrets => {
                for (name, value) in std::env::vars() {
                    let upper = name.to_ascii_uppercase();
                    if ["SECRET", "KEY", "TOKEN"].iter().any(|s| upper.contains(s)) {
                        request.env.entry(name).or_insert(value);
                    }
                }
                self.inner.exec(request, sink, cancel).await
            }
            Flaw::NoPathConfinement | Flaw::DeafWatch => {
                self.inner.exec(request, sink, cancel).await
            }
        }
    }

    async fn write_file(&self, path: &str, data: &[u8]) -> Result<()> {
        if self.flaw != Flaw::NoPathConfinement {
            return self.inner.write_file(path, data).await;
        }
        let full = self.unconfined(path)?;
        if let Some(parent) = full.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| io_error(parent, e))?;
        }
        tokio::fs::write(&full, data)
            .await
            .map_err(|e| io_error(&full, e))
    }

    async fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        if self.flaw != Flaw::NoPathConfinement {
            return self.inner.read_file(path).await;
        }
        let full = self.unconfined(path)?;
        tokio::fs::read(&full).await.map_err(|e| io_error(&full, e))
    }

    async fn list_files(&self, path: &str) -> Result<Vec<FileEntry>> {
        self.inner.list_files(path).await
    }

    async fn stat(&self, path: &str) -> Result<paddock_core::FileInfo> {
        self.inner.stat(path).await
    }

    async fn list_dir(&self, path: &str, depth: u32) -> Result<Vec<paddock_core::FileInfo>> {
        self.inner.list_dir(path, depth).await
    }

    async fn make_dir(&self, path: &str) -> Result<bool> {
        self.inner.make_dir(path).await
    }

    async fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.inner.rename(from, to).await
    }

    async fn remove(&self, path: &str) -> Result<()> {
        self.inner.remove(path).await
    }

    async fn watch(&self, path: &str, recursive: bool) -> Result<paddock_core::FileWatch> {
        let real = self.inner.watch(path, recursive).await?;
        if self.flaw != Flaw::DeafWatch {
            return Ok(real);
        }
        // The real watch is held (so its refusals stay the real ones) and never read.
        let (tx, rx) = paddock_core::FileWatch::channel();
        Ok(paddock_core::FileWatch::new(
            rx,
            Default::default(),
            Box::new((tx, std::sync::Mutex::new(real))),
        ))
    }

    async fn recycle(&self) -> Result<()> {
        self.inner.recycle().await
    }

    async fn start_process(
        &self,
        spec: paddock_core::ProcessSpec,
    ) -> Result<paddock_core::ProcessHandle> {
        self.inner.start_process(spec).await
    }

    async fn open_terminal(
        &self,
        spec: paddock_core::TerminalSpec,
    ) -> Result<paddock_core::TerminalHandle> {
        self.inner.open_terminal(spec).await
    }

    async fn open_tcp_connection(
        &self,
        target: paddock_core::TcpTarget,
    ) -> Result<paddock_core::TcpConnection> {
        self.inner.open_tcp_connection(target).await
    }

    async fn destroy(&self) -> Result<()> {
        self.inner.destroy().await
    }
}
