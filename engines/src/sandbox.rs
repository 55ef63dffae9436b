//! What the engines' sandboxes share: each keeps its files in a host [`Workdir`] and
//! its life in a [`Lifecycle`], and [`workdir_sandbox!`] writes the calls of the
//! [`Sandbox`](paddock_core::Sandbox) contract that follow from those once, for
//! all of them: the paths, the status, the execution's disk checks, the file calls
//! and destroy.
//!
//! An engine gives its sandbox type [`WorkdirBacked`] (the workdir, the life cycle,
//! whether it is busy or paused) and [`FileOps`] (the `fileops` calls: stat,
//! listing, making, moving, removing, watching), whose defaults do them on the
//! workdir; the container engine has its agent do them instead. An engine with
//! background processes, terminals and TCP streams gives its type
//! [`ProcessOps`](crate::interactive::ProcessOps) too. The rest of the contract
//! (running an execution, recycle, pause) is each engine's own, written in the
//! macro's body.

use std::future::Future;
use std::sync::Arc;

use paddock_core::lifecycle::{Lifecycle, OpGuard, Phase, Teardown};
use paddock_core::{Error, FileInfo, FileWatch, Result, Sandbox};

use crate::host::workdir::Workdir;
use crate::task::blocking;

/// A sandbox whose files are a host [`Workdir`].
pub(crate) trait WorkdirBacked: Sandbox + Teardown {
    /// The sandbox's files.
    fn workdir(&self) -> &Arc<Workdir>;

    /// Its life cycle: admits operations while it is live, runs the teardown once.
    fn lifecycle(&self) -> &Lifecycle;

    /// Whether an execution is admitted or running (status `busy`).
    fn busy(&self) -> bool;

    /// Whether it is paused (status `paused`). Default: never.
    fn paused(&self) -> bool {
        false
    }

    /// Admits an operation while the sandbox is live; destroy waits for it.
    /// `ENGINE_DISPOSED` once a destroy has begun.
    fn enter(&self) -> Result<OpGuard<'_>> {
        self.lifecycle()
            .enter()
            .ok_or_else(|| Error::disposed(&format!("sandbox {}", self.id())))
    }

    /// Whether a destroy has begun.
    fn destroying(&self) -> bool {
        self.lifecycle().phase() != Phase::Live
    }

    /// Runs a blocking operation on the workdir on the blocking pool, admitted as
    /// one operation of the sandbox.
    fn file_op<T, F>(&self, op: F) -> impl Future<Output = Result<T>> + Send
    where
        T: Send + 'static,
        F: FnOnce(&Workdir) -> Result<T> + Send + 'static,
    {
        let admitted = self.enter();
        let workdir = self.workdir().clone();
        async move {
            let _op = admitted?;
            blocking(move || op(&workdir)).await
        }
    }
}

/// A sandbox's [`SandboxUsage`](paddock_core::SandboxUsage): what its groups use
/// (added up: a sandbox may keep its warm workers in a group of their own), and its
/// workdir's disk, under `limits` (the memory limit and CPUs when its groups set
/// none; else the host's). Blocking: reads files and may walk the workdir.
pub(crate) fn usage_of(
    groups: &[crate::host::cgroup::GroupUsage],
    workdir: &Workdir,
    limits: &paddock_core::Limits,
) -> paddock_core::SandboxUsage {
    let host = paddock_core::host::HostFacts::this_host();
    let (disk_used_bytes, disk_total_bytes) = workdir.disk_usage();
    let limit = groups.iter().filter_map(|g| g.memory_limit).min();
    paddock_core::SandboxUsage {
        cpu_ns: groups.iter().map(|g| g.cpu_ns).sum(),
        cpus: limits
            .cpu_millicores
            .map_or_else(|| host.cores.unwrap_or(1) as f64, |m| m as f64 / 1000.0),
        memory_bytes: groups.iter().map(|g| g.memory_bytes).sum(),
        memory_cache_bytes: groups.iter().map(|g| g.cache_bytes).sum(),
        memory_limit_bytes: limit
            .or(limits.memory_bytes)
            .or(host.memory_bytes)
            .unwrap_or(0),
        disk_used_bytes,
        disk_total_bytes,
    }
}

/// The `fileops` calls of a sandbox (see the [`Sandbox`] methods of the same
/// names for what they answer). The defaults do them on the workdir.
pub(crate) trait FileOps: WorkdirBacked {
    /// [`Sandbox::stat`].
    fn stat(&self, path: &str) -> impl Future<Output = Result<FileInfo>> + Send {
        let path = path.to_string();
        self.file_op(move |w| w.stat(&path))
    }

    /// [`Sandbox::list_dir`].
    fn list_dir(
        &self,
        path: &str,
        depth: u32,
    ) -> impl Future<Output = Result<Vec<FileInfo>>> + Send {
        let path = path.to_string();
        self.file_op(move |w| w.list_dir(&path, depth))
    }

    /// [`Sandbox::make_dir`].
    fn make_dir(&self, path: &str) -> impl Future<Output = Result<bool>> + Send {
        let path = path.to_string();
        self.file_op(move |w| w.make_dir(&path))
    }

    /// [`Sandbox::rename`].
    fn rename(&self, from: &str, to: &str) -> impl Future<Output = Result<()>> + Send {
        let (from, to) = (from.to_string(), to.to_string());
        self.file_op(move |w| w.rename(&from, &to))
    }

    /// [`Sandbox::set_metadata`].
    fn set_metadata(
        &self,
        path: &str,
        metadata: &paddock_core::FileMetadata,
    ) -> impl Future<Output = Result<()>> + Send {
        let (path, metadata) = (path.to_string(), metadata.clone());
        self.file_op(move |w| w.set_metadata(&path, &metadata))
    }

    /// [`Sandbox::remove`].
    fn remove(&self, path: &str) -> impl Future<Output = Result<()>> + Send {
        let path = path.to_string();
        self.file_op(move |w| w.remove_path(&path))
    }

    /// [`Sandbox::watch`].
    fn watch(&self, path: &str, recursive: bool) -> impl Future<Output = Result<FileWatch>> + Send {
        let admitted = self.enter();
        let (workdir, path) = (self.workdir().clone(), path.to_string());
        async move {
            let _op = admitted?;
            workdir.watch(&path, recursive).await
        }
    }
}

/// `#[async_trait] impl Sandbox for T { … }` for a sandbox type `T` that is
/// [`WorkdirBacked`] and [`FileOps`], and has
/// `async fn run(&self, ValidRequest, &dyn OutputSink, CancelToken) -> Result<ExecResult>`
/// (its executions). The body gives the rest of the contract: `id`, `engine`,
/// `recycle`, and whatever optional calls the engine has.
///
/// Written `impl Sandbox for T where Self: ProcessOps { … }`, the impl also takes
/// `start_process`, `open_terminal` and `open_tcp_connection` from `T`'s
/// [`ProcessOps`](crate::interactive::ProcessOps).
///
/// The macro writes the whole `impl` block, so that `async_trait` sees the calls
/// it adds as well as the body's.
macro_rules! workdir_sandbox {
    (impl Sandbox for $ty:ty where $who:ty: ProcessOps { $($body:tt)* }) => {
        $crate::sandbox::workdir_sandbox! {
            @impl $ty [$who: $crate::interactive::ProcessOps]
            async fn start_process(
                &self,
                spec: paddock_core::ProcessSpec,
            ) -> paddock_core::Result<paddock_core::ProcessHandle> {
                $crate::interactive::ProcessOps::start_process(self, spec).await
            }

            async fn open_terminal(
                &self,
                spec: paddock_core::TerminalSpec,
            ) -> paddock_core::Result<paddock_core::TerminalHandle> {
                $crate::interactive::ProcessOps::open_terminal(self, spec).await
            }

            async fn open_tcp_connection(
                &self,
                target: paddock_core::TcpTarget,
            ) -> paddock_core::Result<paddock_core::TcpConnection> {
                $crate::interactive::ProcessOps::open_tcp_connection(self, target).await
            }

            $($body)*
        }
    };
    (impl Sandbox for $ty:ty { $($body:tt)* }) => {
        $crate::sandbox::workdir_sandbox! { @impl $ty [] $($body)* }
    };
    (@impl $ty:ty [$($bound:tt)*] $($body:tt)*) => {
        #[async_trait::async_trait]
        impl paddock_core::Sandbox for $ty where $($bound)* {
            fn root_dir(&self) -> &std::path::Path {
                $crate::sandbox::WorkdirBacked::workdir(self).shown_root()
            }

            fn host_dir(&self) -> &std::path::Path {
                $crate::sandbox::WorkdirBacked::workdir(self).root()
            }

            fn status(&self) -> paddock_core::SandboxStatus {
                use $crate::sandbox::WorkdirBacked as W;
                if W::destroying(self) {
                    paddock_core::SandboxStatus::Destroyed
                } else if W::paused(self) {
                    paddock_core::SandboxStatus::Paused
                } else if W::busy(self) {
                    paddock_core::SandboxStatus::Busy
                } else {
                    paddock_core::SandboxStatus::Ready
                }
            }

            /// For a caller without the scheduler: the request is validated (the
            /// proof made), then run as `exec_valid`.
            async fn exec(
                &self,
                request: paddock_core::ExecRequest,
                sink: &dyn paddock_core::OutputSink,
                cancel: paddock_core::CancelToken,
            ) -> paddock_core::Result<paddock_core::ExecResult> {
                self.exec_valid(paddock_core::ValidRequest::new(request)?, sink, cancel)
                    .await
            }

            /// The workdir's disk limits hold around the engine's own execution of
            /// a request the scheduler validated.
            async fn exec_valid(
                &self,
                request: paddock_core::ValidRequest,
                sink: &dyn paddock_core::OutputSink,
                cancel: paddock_core::CancelToken,
            ) -> paddock_core::Result<paddock_core::ExecResult> {
                let workdir = $crate::sandbox::WorkdirBacked::workdir(self);
                workdir.check_disk_request(&request.limits)?;
                let before = workdir.disk_exhausted();
                let result = self.run(request, sink, cancel).await;
                workdir.judge_disk(before, result)
            }

            async fn write_file(&self, path: &str, data: &[u8]) -> paddock_core::Result<()> {
                let (path, data) = (path.to_string(), data.to_vec());
                $crate::sandbox::WorkdirBacked::file_op(self, move |w| w.write_file(&path, &data))
                    .await
            }

            async fn read_file(&self, path: &str) -> paddock_core::Result<Vec<u8>> {
                let path = path.to_string();
                $crate::sandbox::WorkdirBacked::file_op(self, move |w| w.read_file(&path)).await
            }

            async fn list_files(
                &self,
                path: &str,
            ) -> paddock_core::Result<Vec<paddock_core::FileEntry>> {
                let path = path.to_string();
                $crate::sandbox::WorkdirBacked::file_op(self, move |w| w.list_files(&path)).await
            }

            async fn open_read(
                &self,
                path: &str,
            ) -> paddock_core::Result<paddock_core::FileReader> {
                let _op = $crate::sandbox::WorkdirBacked::enter(self)?;
                $crate::sandbox::WorkdirBacked::workdir(self).open_read(path).await
            }

            async fn write_from(
                &self,
                path: &str,
                source: paddock_core::ByteSource,
                max_bytes: u64,
            ) -> paddock_core::Result<u64> {
                $crate::sandbox::WorkdirBacked::workdir(self)
                    .write_from(path, source, max_bytes, || {
                        $crate::sandbox::WorkdirBacked::enter(self)
                    })
                    .await
            }

            async fn stat(&self, path: &str) -> paddock_core::Result<paddock_core::FileInfo> {
                $crate::sandbox::FileOps::stat(self, path).await
            }

            async fn list_dir(
                &self,
                path: &str,
                depth: u32,
            ) -> paddock_core::Result<Vec<paddock_core::FileInfo>> {
                $crate::sandbox::FileOps::list_dir(self, path, depth).await
            }

            async fn make_dir(&self, path: &str) -> paddock_core::Result<bool> {
                $crate::sandbox::FileOps::make_dir(self, path).await
            }

            async fn rename(&self, from: &str, to: &str) -> paddock_core::Result<()> {
                $crate::sandbox::FileOps::rename(self, from, to).await
            }

            async fn remove(&self, path: &str) -> paddock_core::Result<()> {
                $crate::sandbox::FileOps::remove(self, path).await
            }

            async fn set_metadata(
                &self,
                path: &str,
                metadata: &paddock_core::FileMetadata,
            ) -> paddock_core::Result<()> {
                $crate::sandbox::FileOps::set_metadata(self, path, metadata).await
            }

            async fn watch(
                &self,
                path: &str,
                recursive: bool,
            ) -> paddock_core::Result<paddock_core::FileWatch> {
                $crate::sandbox::FileOps::watch(self, path, recursive).await
            }

            async fn destroy(&self) -> paddock_core::Result<()> {
                $crate::sandbox::WorkdirBacked::lifecycle(self).destroy(self).await
            }

            $($body)*
        }
    };
}

pub(crate) use workdir_sandbox;
