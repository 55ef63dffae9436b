//! [`SandboxHandle`]: one session, used through the facade with the caller it was
//! obtained for.

use paddock_core::{Error, ExecRequest, ExecResult, FileEntry, SandboxStatus};

use crate::caller::Caller;
use crate::messages::*;
use crate::streamer::Subscribe;

use super::{gone, when_proven, ExecutionStream, Paddock};

/// A sandbox session, opened with [`Paddock::open_sandbox`] or looked up with
/// [`Paddock::sandbox`]. Every call through it runs on behalf of the caller it was
/// obtained for (the tenant it was opened for): the supervisor checks that caller
/// again on each call.
#[derive(Debug, Clone)]
pub struct SandboxHandle {
    pub(super) paddock: Paddock,
    pub(super) info: SandboxInfo,
    pub(super) caller: Caller,
}

impl SandboxHandle {
    /// The session id.
    pub fn id(&self) -> &str {
        &self.info.id
    }

    /// The session's description as opened.
    pub fn info(&self) -> &SandboxInfo {
        &self.info
    }

    /// Runs an execution in the session.
    pub async fn exec(&self, request: ExecRequest) -> Result<ExecResult, Error> {
        self.paddock
            .supervisor
            .send(SandboxExec {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                request,
                sink: None,
            })
            .await
            .map_err(gone)?
    }

    /// Runs an execution in the session and streams its output: chunks as they are
    /// produced, then the result. Answers once the request passed validation, as
    /// [`Paddock::execute_stream`] does: a request wrong in itself is refused here,
    /// before any stream.
    pub async fn exec_stream(&self, request: ExecRequest) -> Result<ExecutionStream, Error> {
        let subscription = self
            .paddock
            .streamer
            .send(Subscribe(request.id.clone()))
            .await
            .map_err(gone)??;
        let id = request.id.clone();
        let msg = SandboxExec {
            caller: self.caller.clone(),
            sandbox: self.info.id.clone(),
            request,
            sink: None,
        };
        let (supervisor, streamer) = (&self.paddock.supervisor, &self.paddock.streamer);
        let result = when_proven(supervisor.clone(), streamer.clone(), id, msg).await?;
        Ok(ExecutionStream::from_parts(subscription, result))
    }

    /// Writes a file, creating parent directories.
    pub async fn write_file(&self, path: &str, data: &[u8]) -> Result<(), Error> {
        self.paddock
            .supervisor
            .send(WriteFile {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                path: path.into(),
                data: data.to_vec(),
            })
            .await
            .map_err(gone)?
    }

    /// Reads a file.
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>, Error> {
        self.paddock
            .supervisor
            .send(ReadFile {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                path: path.into(),
            })
            .await
            .map_err(gone)?
    }

    /// Opens a file for a streaming read: its size and its bytes, through one bounded
    /// buffer whatever the size (engines that stream; others read it whole).
    pub async fn open_read(&self, path: &str) -> Result<paddock_core::FileReader, Error> {
        self.paddock
            .supervisor
            .send(OpenRead {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                path: path.into(),
            })
            .await
            .map_err(gone)?
    }

    /// Writes a file from `source`, taking at most `max_bytes` (`LIMITS_EXCEEDED`
    /// beyond, and no file is left); returns the bytes written.
    pub async fn write_from(
        &self,
        path: &str,
        source: paddock_core::ByteSource,
        max_bytes: u64,
    ) -> Result<u64, Error> {
        self.paddock
            .supervisor
            .send(WriteFrom {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                path: path.into(),
                source,
                max_bytes,
            })
            .await
            .map_err(gone)?
    }

    /// Lists a directory (absolute paths with sizes; missing lists as empty).
    pub async fn list_files(&self, path: &str) -> Result<Vec<FileEntry>, Error> {
        self.paddock
            .supervisor
            .send(ListFiles {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                path: path.into(),
            })
            .await
            .map_err(gone)?
    }

    /// What `lstat` says of a path (engines with the `fileops` feature; others
    /// answer `CAPABILITY_NOT_SUPPORTED`). Like the other file calls, it takes no
    /// execution permit and writes no execution audit entry: no program runs.
    pub async fn stat(&self, path: &str) -> Result<paddock_core::FileInfo, Error> {
        self.paddock
            .supervisor
            .send(StatPath {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                path: path.into(),
            })
            .await
            .map_err(gone)?
    }

    /// The entries below a directory, `depth` levels down (1: its own entries).
    pub async fn list_dir(
        &self,
        path: &str,
        depth: u32,
    ) -> Result<Vec<paddock_core::FileInfo>, Error> {
        self.paddock
            .supervisor
            .send(ListDir {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                path: path.into(),
                depth,
            })
            .await
            .map_err(gone)?
    }

    /// Makes a directory and its parents: `true` when made, `false` when a
    /// directory was already there.
    pub async fn make_dir(&self, path: &str) -> Result<bool, Error> {
        self.paddock
            .supervisor
            .send(MakeDir {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                path: path.into(),
            })
            .await
            .map_err(gone)?
    }

    /// What the sandbox uses now (see
    /// [`Sandbox::usage`](paddock_core::Sandbox::usage)).
    pub async fn usage(&self) -> Result<paddock_core::SandboxUsage, Error> {
        self.paddock
            .supervisor
            .send(GetUsage {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
            })
            .await
            .map_err(gone)?
    }

    /// Replaces the user metadata of a file or directory (see
    /// [`Sandbox::set_metadata`](paddock_core::Sandbox::set_metadata)): an empty
    /// map clears it.
    pub async fn set_metadata(
        &self,
        path: &str,
        metadata: paddock_core::FileMetadata,
    ) -> Result<(), Error> {
        self.paddock
            .supervisor
            .send(SetMetadata {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                path: path.into(),
                metadata,
            })
            .await
            .map_err(gone)?
    }

    /// Moves (renames) `from` to `to`, making `to`'s parents.
    pub async fn rename(&self, from: &str, to: &str) -> Result<(), Error> {
        self.paddock
            .supervisor
            .send(MovePath {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                from: from.into(),
                to: to.into(),
            })
            .await
            .map_err(gone)?
    }

    /// Removes a path, a directory with everything in it.
    pub async fn remove(&self, path: &str) -> Result<(), Error> {
        self.paddock
            .supervisor
            .send(RemovePath {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                path: path.into(),
            })
            .await
            .map_err(gone)?
    }

    /// Watches a directory: its changes as they happen, through a bounded buffer,
    /// until the watch is dropped or the session ends. No polling: a watch costs
    /// nothing while nothing changes.
    pub async fn watch(
        &self,
        path: &str,
        recursive: bool,
    ) -> Result<paddock_core::FileWatch, Error> {
        self.paddock
            .supervisor
            .send(WatchDir {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                path: path.into(),
                recursive,
            })
            .await
            .map_err(gone)?
    }

    /// Freezes the session's processes in place until [`unpause`](Self::unpause);
    /// executions are refused with `SANDBOX_PAUSED` meanwhile. Engines without the
    /// `pause` feature answer `CAPABILITY_NOT_SUPPORTED`.
    pub async fn pause(&self) -> Result<(), Error> {
        self.paddock
            .supervisor
            .send(PauseSandbox {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
            })
            .await
            .map_err(gone)?
    }

    /// Thaws a paused session.
    pub async fn unpause(&self) -> Result<(), Error> {
        self.paddock
            .supervisor
            .send(UnpauseSandbox {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
            })
            .await
            .map_err(gone)?
    }

    /// Starts a background process that outlives the call (engines with the
    /// `process` feature). The policy checks its command; it is audited when it ends;
    /// destroying the session kills it.
    pub async fn start_process(
        &self,
        spec: paddock_core::ProcessSpec,
    ) -> Result<crate::messages::Started, Error> {
        self.paddock
            .supervisor
            .send(StartProcess {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                spec,
            })
            .await
            .map_err(gone)?
    }

    /// Asks the policy about `program`, which the caller will run in this sandbox by
    /// other means than an execution (code for an interpreter process of its own,
    /// say): `CODE_BLOCKED` as an execution of it would be, else the policy's
    /// warnings.
    pub async fn check_program(
        &self,
        program: paddock_core::Program,
    ) -> Result<Vec<String>, Error> {
        self.paddock
            .supervisor
            .send(crate::messages::CheckProgram {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                program,
            })
            .await
            .map_err(gone)?
    }

    /// Opens a terminal (engines with the `terminal` feature); as
    /// [`start_process`](Self::start_process) otherwise.
    pub async fn open_terminal(
        &self,
        spec: paddock_core::TerminalSpec,
    ) -> Result<crate::messages::Started, Error> {
        self.paddock
            .supervisor
            .send(OpenTerminal {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                spec,
            })
            .await
            .map_err(gone)?
    }

    /// Opens a TCP stream to a service on the guest's loopback (engines with the
    /// `tcp` feature); other hosts are refused with `INVALID_OPTIONS`.
    pub async fn open_tcp_connection(
        &self,
        target: paddock_core::TcpTarget,
    ) -> Result<paddock_core::TcpConnection, Error> {
        self.paddock
            .supervisor
            .send(OpenTcpConnection {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                target,
            })
            .await
            .map_err(gone)?
    }

    /// A process or terminal of the session by id.
    pub async fn process(&self, id: &str) -> Result<crate::messages::Started, Error> {
        self.process_by(crate::messages::ProcessSelector::Id(id.into()))
            .await
    }

    /// A process or terminal of the session by id, number or tag.
    pub async fn process_by(
        &self,
        which: crate::messages::ProcessSelector,
    ) -> Result<crate::messages::Started, Error> {
        self.paddock
            .supervisor
            .send(GetProcess {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
                process: which,
            })
            .await
            .map_err(gone)?
    }

    /// The session's processes and terminals.
    pub async fn processes(&self) -> Result<Vec<crate::messages::ProcessInfo>, Error> {
        self.paddock
            .supervisor
            .send(ListProcesses {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
            })
            .await
            .map_err(gone)?
    }

    /// The session's status.
    pub async fn status(&self) -> Result<SandboxStatus, Error> {
        self.paddock
            .supervisor
            .send(GetSandboxStatus {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
            })
            .await
            .map_err(gone)?
    }

    /// Destroys the session. Idempotent; every later call is refused. Its running
    /// executions are cancelled; the answer comes once its instance is recycled for
    /// the next session (nothing of this one left: processes, files) or retired.
    /// In a fleet, its record goes with it.
    pub async fn destroy(&self) -> Result<(), Error> {
        self.paddock
            .supervisor
            .send(DestroySandbox {
                caller: self.caller.clone(),
                sandbox: self.info.id.clone(),
            })
            .await
            .map_err(gone)??;
        if let Some(f) = &self.paddock.federation {
            f.session_closed(&self.info.id).await;
        }
        Ok(())
    }
}
