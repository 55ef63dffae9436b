//! The `ns-shell` engine and its sandboxes: everything but the execution itself
//! (`exec.rs`).
//!
//! A sandbox is a workdir (`paddock_engines::workdir::Workdir`, which confines every
//! path beneath it) and a life cycle (`paddock_core::lifecycle::Lifecycle`, which
//! makes destroy idempotent and lets it wait for running operations). Nothing runs
//! between executions: each execution gets namespaces of its own and they end with
//! it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use paddock_core::lifecycle::{Lifecycle, OpGuard, Phase, Teardown};
use paddock_core::{
    CancelToken, Capabilities, Engine, EngineName, Error, ErrorCode, ExecRequest, ExecResult,
    FileEntry, IsolationLevel, Limits, OutputSink, ProgramKind, Result, Sandbox, SandboxSpec,
    SandboxStatus,
};
use paddock_engines::env::{resolve_program, sanitized_host_env};
use paddock_engines::workdir::Workdir;

use super::exec::NS_FLAGS;

/// The name the engine registers under. No built-in code knows it.
pub(crate) const NAME: EngineName = EngineName::from_static("ns-shell");

/// Sandbox ids are unique in the process, across engine instances.
static NEXT_SANDBOX: AtomicU64 = AtomicU64::new(0);

/// The host tools the engine drives, found on `PATH` when it starts.
#[derive(Debug)]
pub(super) struct Tools {
    /// util-linux `unshare`: makes the namespaces and their init.
    pub(super) unshare: PathBuf,
    /// util-linux `nsenter`: starts the program in them.
    pub(super) nsenter: PathBuf,
    /// The shell the namespace's init runs on.
    pub(super) sh: PathBuf,
}

/// What every sandbox of one engine shares.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) caps: Capabilities,
    pub(super) tools: Tools,
    /// The host environment, sanitized once when the engine starts.
    pub(super) base_env: BTreeMap<String, String>,
    /// Limits a request and its sandbox leave unset.
    pub(super) defaults: Limits,
    /// The parent of every workdir; removed with the engine.
    workdirs: tempfile::TempDir,
}

/// Runs `Program::Command` programs in fresh pid, mount, network, IPC and UTS
/// namespaces (see `exec.rs`). Claims no security boundary (isolation level `none`:
/// same filesystem, same user, no seccomp), enforces network policy `none` only (the
/// network namespace is empty), and of the limits applies the wall-clock deadline and
/// the output cap; memory, CPU, pids, file size and open files are not enforced.
#[derive(Debug)]
pub(crate) struct NsShell {
    shared: Arc<Shared>,
}

impl NsShell {
    /// Finds the tools and checks, once, that this host lets us make the namespaces
    /// (it does for root); otherwise says why not.
    pub(crate) fn new() -> std::result::Result<NsShell, String> {
        let base_env = sanitized_host_env(&[]);
        let path = base_env.get("PATH").cloned().unwrap_or_default();
        let find = |name: &str| {
            resolve_program(name, &path, Path::new("/"))
                .ok_or_else(|| format!("`{name}` was not found on PATH ({path})"))
        };
        let tools = Tools {
            unshare: find("unshare")?,
            nsenter: find("nsenter")?,
            sh: find("sh")?,
        };
        let probe = std::process::Command::new(&tools.unshare)
            .args(NS_FLAGS)
            .arg("--")
            .arg(&tools.sh)
            .args(["-c", "exit 0"])
            .env_clear()
            .env("PATH", &path)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("cannot run `{}`: {e}", tools.unshare.display()))?;
        if !probe.status.success() {
            return Err(format!(
                "`unshare {}` failed ({}): {}",
                NS_FLAGS.join(" "),
                probe.status,
                String::from_utf8_lossy(&probe.stderr).trim()
            ));
        }
        let workdirs = tempfile::Builder::new()
            .prefix("paddock-ns-shell-")
            .tempdir()
            .map_err(|e| format!("cannot create a directory for workdirs: {e}"))?;
        Ok(NsShell {
            shared: Arc::new(Shared {
                // The deadline (every engine's) and the output cap: a request that
                // sets any other limit is refused by the scheduler.
                caps: Capabilities::new(
                    IsolationLevel::None,
                    &[ProgramKind::Command],
                    &["none"],
                    &[],
                )
                .with_limits(&["max_output_bytes"]),
                tools,
                base_env,
                defaults: Limits::defaults(),
                workdirs,
            }),
        })
    }
}

#[async_trait]
impl Engine for NsShell {
    fn name(&self) -> EngineName {
        NAME
    }

    fn capabilities(&self) -> &Capabilities {
        &self.shared.caps
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Arc<dyn Sandbox>> {
        let caps = &self.shared.caps;
        caps.check_level(&NAME, spec.level)?;
        caps.check_network(&NAME, &spec.network)?;
        spec.limits.validate("limits", false)?;
        let n = NEXT_SANDBOX.fetch_add(1, Ordering::Relaxed);
        let id = format!("ns-{}-{n}", std::process::id());
        let parent = self.shared.workdirs.path().to_path_buf();
        let name = id.clone();
        let workdir = blocking(move || {
            Workdir::create(&parent, &name)
                .map_err(|e| Error::engine_io("creating the sandbox workdir", e))
        })
        .await?;
        Ok(Arc::new(NsSandbox {
            id,
            limits: spec.limits.or(&self.shared.defaults),
            shared: self.shared.clone(),
            workdir: Arc::new(workdir),
            lifecycle: Lifecycle::new(),
            active: AtomicUsize::new(0),
            kill_switch: CancelToken::new(),
        }))
    }
}

/// A sandbox of [`NsShell`].
#[derive(Debug)]
pub(super) struct NsSandbox {
    pub(super) id: String,
    pub(super) shared: Arc<Shared>,
    /// The sandbox's limits over the engine's defaults.
    pub(super) limits: Limits,
    pub(super) workdir: Arc<Workdir>,
    /// Admits operations while live; destroy waits for them.
    lifecycle: Lifecycle,
    /// Executions running.
    pub(super) active: AtomicUsize,
    /// Cancelled when destroy begins: every running execution kills its namespaces.
    pub(super) kill_switch: CancelToken,
}

impl NsSandbox {
    /// Admits an operation, or `ENGINE_DISPOSED` once destroy has begun.
    pub(super) fn enter(&self) -> Result<OpGuard<'_>> {
        self.lifecycle
            .enter()
            .ok_or_else(|| Error::disposed(&format!("sandbox {}", self.id)))
    }

    /// Runs a workdir operation on the blocking pool while the sandbox is live.
    async fn file_op<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Workdir) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let _op = self.enter()?;
        let workdir = self.workdir.clone();
        blocking(move || op(&workdir)).await
    }
}

/// Runs `f` on tokio's blocking pool.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        Error::new(
            ErrorCode::EngineFailed,
            format!("a blocking task of the ns-shell engine failed: {e}"),
        )
    })?
}

#[async_trait]
impl Sandbox for NsSandbox {
    fn id(&self) -> &str {
        &self.id
    }

    fn engine(&self) -> EngineName {
        NAME
    }

    fn root_dir(&self) -> &Path {
        self.workdir.root()
    }

    fn status(&self) -> SandboxStatus {
        match self.lifecycle.phase() {
            Phase::Live if self.active.load(Ordering::Acquire) > 0 => SandboxStatus::Busy,
            Phase::Live => SandboxStatus::Ready,
            Phase::Destroying | Phase::Destroyed => SandboxStatus::Destroyed,
        }
    }

    async fn exec(
        &self,
        request: ExecRequest,
        sink: &dyn OutputSink,
        cancel: CancelToken,
    ) -> Result<ExecResult> {
        self.run(request, sink, cancel).await
    }

    async fn write_file(&self, path: &str, data: &[u8]) -> Result<()> {
        let (path, data) = (path.to_string(), data.to_vec());
        self.file_op(move |w| w.write_file(&path, &data)).await
    }

    async fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        let path = path.to_string();
        self.file_op(move |w| w.read_file(&path)).await
    }

    async fn list_files(&self, path: &str) -> Result<Vec<FileEntry>> {
        let path = path.to_string();
        self.file_op(move |w| w.list_files(&path)).await
    }

    /// The next lease starts with an empty workdir (nothing else survives an
    /// execution).
    async fn recycle(&self) -> Result<()> {
        self.file_op(|w| {
            w.clear()
                .map_err(|e| Error::engine_io("clearing the sandbox workdir", e))
        })
        .await
    }

    async fn destroy(&self) -> Result<()> {
        // The core's destroy protocol: one leader tears down, concurrent destroys
        // wait for it and get its result, a leader dropped midway finishes at once.
        self.lifecycle.destroy(self).await
    }
}

impl Teardown for NsSandbox {
    async fn stop_running(&self) {
        // Running executions kill their namespaces and return.
        self.kill_switch.cancel();
    }

    async fn teardown(&self) -> Result<()> {
        let workdir = self.workdir.clone();
        blocking(move || {
            workdir
                .remove()
                .map_err(|e| Error::engine_io("removing the sandbox workdir", e))
        })
        .await
    }

    fn teardown_now(&self) {
        let _ = self.workdir.remove();
    }
}

impl Drop for NsSandbox {
    fn drop(&mut self) {
        self.lifecycle.teardown_unless_destroyed(self);
    }
}
