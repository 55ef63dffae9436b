//! A subprocess sandbox: a workdir, a cgroup, a network namespace, and the executions
//! running in them.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use paddock_core::{
    CancelToken, EngineKind, Error, ExecRequest, ExecResult, FileEntry, NetworkPolicy, OutputSink,
    Result, Sandbox, SandboxSpec, SandboxStatus,
};
use tokio::sync::{Mutex, Notify, OnceCell};

use super::EngineInner;
use crate::cgroup::Cgroup;
use crate::workdir::Workdir;

/// A sandbox of the subprocess engine. Executions in one sandbox run one at a time,
/// so that everything a run leaves behind in the cgroup can be killed when it ends.
#[derive(Debug)]
pub struct SubprocessSandbox {
    pub(super) id: String,
    pub(super) engine: Arc<EngineInner>,
    pub(super) spec: SandboxSpec,
    pub(super) workdir: Arc<Workdir>,
    pub(super) cgroup: Option<Arc<Cgroup>>,
    pub(super) netns: Option<OwnedFd>,
    /// Serializes executions.
    pub(super) run_lock: Mutex<()>,
    /// Executions admitted and not yet returned (waiting or running).
    pub(super) active: AtomicUsize,
    /// Set once destroy starts; every later call is refused.
    pub(super) destroying: AtomicBool,
    /// Woken when destroy starts, so running executions kill their programs.
    pub(super) destroy_signal: Notify,
    teardown: OnceCell<std::result::Result<(), Error>>,
}

impl SubprocessSandbox {
    pub(super) async fn create(engine: Arc<EngineInner>, spec: &SandboxSpec) -> Result<Self> {
        let caps = &engine.caps;
        caps.check_level(EngineKind::Subprocess, spec.level)?;
        caps.check_network(EngineKind::Subprocess, &spec.network)?;
        spec.limits.validate("limits", false)?;

        let n = engine.next_sandbox.fetch_add(1, Ordering::Relaxed);
        let id = format!("sp-{}-{n}", uuid::Uuid::now_v7().simple());
        let eng = engine.clone();
        let id2 = id.clone();
        let network = spec.network.clone();
        let (workdir, cgroup, netns) = tokio::task::spawn_blocking(move || {
            let workdir = Workdir::create(&eng.workdir_root, &id2)
                .map_err(|e| Error::engine_io("creating the sandbox workdir", e))?;
            let cgroup = match &eng.cgroups {
                Some(root) => match root.create_group(&id2) {
                    Ok(g) => Some(g),
                    Err(e) => {
                        let _ = workdir.remove();
                        return Err(Error::engine_io("creating the sandbox cgroup", e));
                    }
                },
                None => None,
            };
            let netns = match network {
                NetworkPolicy::None => match crate::netns::create_empty() {
                    Ok(fd) => Some(fd),
                    Err(e) => {
                        let _ = workdir.remove();
                        if let Some(g) = &cgroup {
                            let _ = g.remove();
                        }
                        return Err(Error::engine_io(
                            "creating the sandbox's empty network namespace",
                            e,
                        ));
                    }
                },
                _ => None,
            };
            Ok((workdir, cgroup, netns))
        })
        .await
        .map_err(|e| {
            Error::new(
                paddock_core::ErrorCode::EngineFailed,
                format!("sandbox setup task failed: {e}"),
            )
        })??;

        Ok(SubprocessSandbox {
            id,
            engine,
            spec: spec.clone(),
            workdir: Arc::new(workdir),
            cgroup: cgroup.map(Arc::new),
            netns,
            run_lock: Mutex::new(()),
            active: AtomicUsize::new(0),
            destroying: AtomicBool::new(false),
            destroy_signal: Notify::new(),
            teardown: OnceCell::new(),
        })
    }

    pub(super) fn check_live(&self) -> Result<()> {
        if self.destroying.load(Ordering::Acquire) {
            return Err(Error::disposed(&format!("sandbox {}", self.id)));
        }
        Ok(())
    }

    /// Runs a blocking file operation on the blocking pool.
    async fn file_op<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Workdir) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.check_live()?;
        let workdir = self.workdir.clone();
        blocking(move || op(&workdir)).await
    }

    /// Kills what is left in the cgroup and wipes or removes the workdir.
    async fn sweep(&self, remove: bool) -> Result<()> {
        let workdir = self.workdir.clone();
        let cgroup = self.cgroup.clone();
        blocking(move || {
            let mut first_err = None;
            if let Some(g) = &cgroup {
                let r = if remove { g.remove() } else { g.kill_all() };
                if let Err(e) = r {
                    first_err.get_or_insert(Error::engine_io("killing the sandbox's processes", e));
                }
            }
            let r = if remove {
                workdir.remove()
            } else {
                workdir.clear()
            };
            if let Err(e) = r {
                first_err.get_or_insert(Error::engine_io("cleaning the sandbox workdir", e));
            }
            first_err.map_or(Ok(()), Err)
        })
        .await
    }
}

/// Runs `f` on tokio's blocking pool; works on any runtime flavour.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        Error::new(
            paddock_core::ErrorCode::EngineFailed,
            format!("a blocking engine task failed: {e}"),
        )
    })?
}

#[async_trait]
impl Sandbox for SubprocessSandbox {
    fn id(&self) -> &str {
        &self.id
    }

    fn kind(&self) -> EngineKind {
        EngineKind::Subprocess
    }

    fn root_dir(&self) -> &Path {
        self.workdir.root()
    }

    fn status(&self) -> SandboxStatus {
        if self.destroying.load(Ordering::Acquire) {
            SandboxStatus::Destroyed
        } else if self.active.load(Ordering::Acquire) > 0 {
            SandboxStatus::Busy
        } else {
            SandboxStatus::Ready
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
        let data = data.to_vec();
        let path = path.to_string();
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

    async fn recycle(&self) -> Result<()> {
        self.check_live()?;
        let _guard = self.run_lock.lock().await;
        self.check_live()?;
        self.sweep(false).await
    }

    async fn destroy(&self) -> Result<()> {
        self.destroying.store(true, Ordering::Release);
        self.destroy_signal.notify_waiters();
        self.teardown
            .get_or_init(|| async {
                // Running executions see the signal, kill their programs and return;
                // taking the lock waits for them.
                let _guard = self.run_lock.lock().await;
                self.sweep(true).await
            })
            .await
            .clone()
    }
}

impl Drop for SubprocessSandbox {
    fn drop(&mut self) {
        if self.teardown.get().is_none() {
            if let Some(g) = &self.cgroup {
                let _ = g.remove();
            }
            let _ = self.workdir.remove();
        }
    }
}
