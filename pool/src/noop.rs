//! An engine that runs nothing: every execution completes at once with exit code 0.
//!
//! It exists to measure the scheduler without an engine's cost in the way (the
//! `pipeline` benchmark) and to exercise pools in tests. It is a real implementation
//! of the contract — files live in memory, destroy is final — not a mock. It needs
//! nothing of the host, so it lives beside the scheduler rather than with the engines
//! (`paddock-engines`), and a [`PaddockBuilder`](crate::PaddockBuilder) can register
//! it without them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use paddock_core::{
    CancelToken, Capabilities, Engine, EngineName, Error, ErrorCode, ExecRequest, ExecResult,
    FileEntry, IsolationLevel, OutputSink, ProgramKind, Result, Sandbox, SandboxSpec,
    SandboxStatus, ValidRequest,
};

/// The no-op engine.
#[derive(Debug, Clone)]
pub struct NoopEngine {
    caps: Arc<Capabilities>,
}

impl Default for NoopEngine {
    fn default() -> Self {
        NoopEngine::new()
    }
}

impl NoopEngine {
    /// A no-op engine that accepts every program kind and network policy.
    pub fn new() -> NoopEngine {
        NoopEngine {
            caps: Arc::new(
                Capabilities::new(
                    IsolationLevel::None,
                    &[
                        ProgramKind::Command,
                        ProgramKind::Code(paddock_core::Language::Python),
                        ProgramKind::Code(paddock_core::Language::Javascript),
                        ProgramKind::Code(paddock_core::Language::Shell),
                        ProgramKind::Invoke,
                    ],
                    &["none", "unrestricted"],
                    &["files"],
                )
                // It runs nothing, so nothing it runs can exceed a limit.
                .with_limits(&paddock_core::LIMIT_TABLE.map(|s| s.name)),
            ),
        }
    }

    /// Opens a sandbox with its concrete type.
    pub fn open(&self) -> NoopSandbox {
        NoopSandbox {
            id: paddock_core::ids::tagged("noop"),
            root: PathBuf::from("/noop"),
            files: parking_lot::Mutex::new(BTreeMap::new()),
            destroyed: AtomicBool::new(false),
        }
    }
}

#[async_trait]
impl Engine for NoopEngine {
    fn name(&self) -> EngineName {
        EngineName::NOOP
    }

    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Arc<dyn Sandbox>> {
        self.caps.check_level(&EngineName::NOOP, spec.level)?;
        self.caps.check_network(&EngineName::NOOP, &spec.network)?;
        if spec.home.is_some() {
            self.caps
                .check_feature(&EngineName::NOOP, paddock_core::engine::FEATURE_HOME)?;
        }
        Ok(Arc::new(self.open()))
    }
}

/// A sandbox of the no-op engine: files in memory, executions that do nothing.
#[derive(Debug)]
pub struct NoopSandbox {
    id: String,
    root: PathBuf,
    files: parking_lot::Mutex<BTreeMap<String, Vec<u8>>>,
    destroyed: AtomicBool,
}

impl NoopSandbox {
    fn live(&self) -> Result<()> {
        if self.destroyed.load(Ordering::Acquire) {
            return Err(Error::disposed(&format!("sandbox {}", self.id)));
        }
        Ok(())
    }

    /// Runs an execution synchronously (the future of `exec` never waits).
    pub fn exec_now(&self, request: ExecRequest, cancel: &CancelToken) -> Result<ExecResult> {
        self.exec_valid_now(ValidRequest::new(request)?, cancel)
    }

    /// [`exec_now`](Self::exec_now) for a request already validated.
    pub fn exec_valid_now(&self, request: ValidRequest, cancel: &CancelToken) -> Result<ExecResult> {
        self.live()?;
        let request = request.into_inner();
        Ok(ExecResult::empty(
            request.id,
            ExecResult::noop_outcome(cancel),
            EngineName::NOOP,
            self.id.clone(),
        ))
    }

    fn key(&self, path: &str) -> Result<String> {
        let trimmed = path.trim_start_matches('/');
        if trimmed.split('/').any(|c| c == "..") {
            return Err(Error::new(
                ErrorCode::PathEscape,
                format!("`{path}` leads outside the sandbox workdir"),
            ));
        }
        Ok(trimmed.to_string())
    }
}

#[async_trait]
impl Sandbox for NoopSandbox {
    fn id(&self) -> &str {
        &self.id
    }

    fn engine(&self) -> EngineName {
        EngineName::NOOP
    }

    fn root_dir(&self) -> &Path {
        &self.root
    }

    fn status(&self) -> SandboxStatus {
        if self.destroyed.load(Ordering::Acquire) {
            SandboxStatus::Destroyed
        } else {
            SandboxStatus::Ready
        }
    }

    async fn exec(
        &self,
        request: ExecRequest,
        _sink: &dyn OutputSink,
        cancel: CancelToken,
    ) -> Result<ExecResult> {
        self.exec_now(request, &cancel)
    }

    async fn exec_valid(
        &self,
        request: ValidRequest,
        _sink: &dyn OutputSink,
        cancel: CancelToken,
    ) -> Result<ExecResult> {
        self.exec_valid_now(request, &cancel)
    }

    async fn write_file(&self, path: &str, data: &[u8]) -> Result<()> {
        self.live()?;
        let key = self.key(path)?;
        self.files.lock().insert(key, data.to_vec());
        Ok(())
    }

    async fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        self.live()?;
        let key = self.key(path)?;
        self.files
            .lock()
            .get(&key)
            .cloned()
            .ok_or_else(|| Error::new(ErrorCode::NotFound, format!("`{path}` does not exist")))
    }

    async fn list_files(&self, path: &str) -> Result<Vec<FileEntry>> {
        self.live()?;
        let prefix = self.key(path)?;
        Ok(self
            .files
            .lock()
            .iter()
            .filter(|(k, _)| prefix.is_empty() || k.starts_with(&format!("{prefix}/")))
            .map(|(k, v)| FileEntry {
                path: format!("/noop/{k}"),
                size: v.len() as u64,
                is_dir: false,
            })
            .collect())
    }

    async fn recycle(&self) -> Result<()> {
        self.live()?;
        self.files.lock().clear();
        Ok(())
    }

    async fn destroy(&self) -> Result<()> {
        self.destroyed.store(true, Ordering::Release);
        self.files.lock().clear();
        Ok(())
    }
}
