//! The file operations of a container sandbox (stat, listing, making, moving,
//! removing, watching), done by the warm container's agent: it sees the
//! container's whole file system, so they work on any path the sandbox's programs
//! see. Relative paths are taken under the sandbox's home. A sandbox without a warm
//! container (warm mode off, no agent, gVisor) cannot do them, and the engine does
//! not advertise the `fileops` feature then.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use paddock_agent::files::{FileAnswer, FileOp, WireEntry, WireEvent};
use paddock_core::{
    Error, ErrorCode, FileEvent, FileEventKind, FileInfo, FileKind, FileWatch, Result,
};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc::error::TrySendError;

use super::control::parse_answer;
use super::sandbox::ContainerSandbox;
use crate::sandbox::{FileOps, WorkdirBacked};

/// How long a watch waits for the agent's first answer.
const WATCH_PATIENCE: Duration = Duration::from_secs(10);

/// A [`FileInfo`] of the agent's entry.
fn info(e: WireEntry) -> FileInfo {
    let kind = match e.kind.as_str() {
        "file" => FileKind::File,
        "dir" => FileKind::Directory,
        "symlink" => FileKind::Symlink,
        _ => FileKind::Other,
    };
    let modified = if e.mtime >= 0 {
        std::time::UNIX_EPOCH + Duration::new(e.mtime as u64, e.mtime_ns)
    } else {
        std::time::UNIX_EPOCH - Duration::from_secs(e.mtime.unsigned_abs())
    };
    FileInfo {
        path: e.path,
        kind,
        size: e.size,
        mode: e.mode,
        uid: e.uid,
        gid: e.gid,
        modified,
        symlink_target: e.target,
        metadata: e.metadata,
    }
}

fn event(e: WireEvent) -> Option<FileEvent> {
    let kind = match e.kind.as_str() {
        "create" => FileEventKind::Create,
        "write" => FileEventKind::Write,
        "remove" => FileEventKind::Remove,
        "rename" => FileEventKind::Rename,
        "chmod" => FileEventKind::Chmod,
        _ => return None,
    };
    Some(FileEvent { path: e.path, kind })
}

impl ContainerSandbox {
    /// `path` as an absolute path of the container: relative ones under the home.
    fn guest_path(&self, path: &str) -> Result<String> {
        if path.contains('\0') {
            return Err(Error::invalid_options("path", "must not contain NUL bytes"));
        }
        let home = self.home().trim_end_matches('/');
        Ok(if path.starts_with('/') {
            path.to_string()
        } else if path.is_empty() || path == "." {
            home.to_string()
        } else {
            format!("{home}/{}", path.trim_start_matches("./"))
        })
    }

    /// The warm container's agent, for a file operation.
    fn files_agent(&self) -> Result<std::sync::Arc<super::control::AgentControl>> {
        self.engine
            .caps
            .check_feature(&self.engine.name, paddock_core::engine::FEATURE_FILEOPS)?;
        self.refuse_if_paused()?;
        Ok(self.guest()?.control)
    }

    /// Has the agent do `op`.
    async fn agent_files(&self, op: FileOp) -> Result<FileAnswer> {
        let control = self.files_agent()?;
        let _op = self.enter()?;
        control.files(op).await
    }

    /// `INVALID_OPTIONS` for the sandbox's home itself, which a move or a removal
    /// may not take away.
    fn not_home(&self, path: &str) -> Result<()> {
        if path.trim_end_matches('/') == self.home().trim_end_matches('/') {
            return Err(Error::invalid_options(
                "path",
                "the sandbox's root itself cannot be moved, replaced or removed; name what is in it",
            ));
        }
        Ok(())
    }
}

/// The `fileops` calls, by the warm container's agent.
impl FileOps for ContainerSandbox {
    async fn stat(&self, path: &str) -> Result<FileInfo> {
        let path = self.guest_path(path)?;
        let answer = self.agent_files(FileOp::Stat { path }).await?;
        answer.entries.into_iter().next().map(info).ok_or_else(|| {
            Error::new(
                ErrorCode::EngineFailed,
                "the container's agent answered a stat without an entry",
            )
        })
    }

    async fn list_dir(&self, path: &str, depth: u32) -> Result<Vec<FileInfo>> {
        let path = self.guest_path(path)?;
        let answer = self.agent_files(FileOp::List { path, depth }).await?;
        Ok(answer.entries.into_iter().map(info).collect())
    }

    async fn make_dir(&self, path: &str) -> Result<bool> {
        let path = self.guest_path(path)?;
        Ok(self.agent_files(FileOp::MakeDir { path }).await?.made)
    }

    async fn rename(&self, from: &str, to: &str) -> Result<()> {
        let (from, to) = (self.guest_path(from)?, self.guest_path(to)?);
        self.not_home(&from)?;
        self.not_home(&to)?;
        self.agent_files(FileOp::Rename { from, to }).await?;
        Ok(())
    }

    async fn remove(&self, path: &str) -> Result<()> {
        let path = self.guest_path(path)?;
        self.not_home(&path)?;
        self.agent_files(FileOp::Remove { path }).await?;
        Ok(())
    }

    /// A watch by the agent: its events come through a pipe, read by a task on the
    /// control channel's runtime, which ends when the [`FileWatch`] is dropped
    /// (closing the pipe, which ends the agent's watch) or the agent ends it (a
    /// reset, the container gone, the directory removed).
    async fn watch(&self, path: &str, recursive: bool) -> Result<FileWatch> {
        let path = self.guest_path(path)?;
        let control = self.files_agent()?;
        let (runtime, read) = {
            let _op = self.enter()?;
            control.watch(&path, recursive).await?
        };
        let pipe = {
            let _in = runtime.enter();
            tokio::net::unix::pipe::Receiver::from_owned_fd(read)
                .map_err(|e| Error::engine_io("reading the agent's watch", e))?
        };
        let mut lines = tokio::io::BufReader::new(pipe).lines();
        let first = tokio::time::timeout(WATCH_PATIENCE, lines.next_line())
            .await
            .map_err(|_| {
                Error::new(
                    ErrorCode::EngineFailed,
                    format!(
                        "the container's agent did not start a watch within {WATCH_PATIENCE:?}"
                    ),
                )
            })?
            .map_err(|e| Error::engine_io("reading the agent's watch", e))?
            .unwrap_or_default();
        parse_answer(first.as_bytes())?;
        let (tx, rx) = FileWatch::channel();
        let dropped = Arc::new(AtomicU64::new(0));
        let counted = dropped.clone();
        runtime.spawn(async move {
            loop {
                let line = tokio::select! {
                    () = tx.closed() => return,
                    l = lines.next_line() => l,
                };
                let Ok(Some(line)) = line else { return };
                let Some(e) = serde_json::from_str::<WireEvent>(&line)
                    .ok()
                    .and_then(event)
                else {
                    continue;
                };
                match tx.try_send(e) {
                    Ok(()) => {}
                    Err(TrySendError::Full(_)) => {
                        counted.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(TrySendError::Closed(_)) => return,
                }
            }
        });
        Ok(FileWatch::new(rx, dropped, Box::new(())))
    }
}
