//! The engine and sandbox contract every backend implements.
//!
//! An [`Engine`] creates [`Sandbox`]es: leases of one engine instance with a persistent
//! workdir. The scheduler pools sandboxes, so the contract follows deadpool's manager:
//! `create`, `recycle` (reset or reject), `destroy`.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::cancel::CancelToken;
use crate::error::{Error, ErrorCode, Result};
use crate::exec::{ExecRequest, ExecResult, OutputChunk};
use crate::isolation::{Capabilities, EngineName, IsolationLevel, NetworkPolicy};
use crate::limits::Limits;

/// What a new sandbox must provide.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSpec {
    /// The isolation level required; engines refuse levels they cannot give.
    #[serde(default)]
    pub level: IsolationLevel,
    /// The network policy; engines refuse policies they cannot enforce.
    #[serde(default)]
    pub network: NetworkPolicy,
    /// Default limits for executions in this sandbox.
    #[serde(default)]
    pub limits: Limits,
    /// The tenant that owns the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Where the sandbox's programs see its workdir, which is also their `HOME` and
    /// default working directory (such as `/home/user`, where E2B's programs expect
    /// theirs); the engine's own place when `None`. The files API then takes and
    /// lists paths under it. Engines that cannot place the workdir refuse the sandbox
    /// with `CAPABILITY_NOT_SUPPORTED`; see [`check_home`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<String>,
}

/// The feature of engines that implement the file operations ([`Sandbox::stat`],
/// [`Sandbox::list_dir`], [`Sandbox::make_dir`], [`Sandbox::rename`],
/// [`Sandbox::remove`], [`Sandbox::watch`]).
pub const FEATURE_FILEOPS: &str = "fileops";

/// The feature of engines that tell what a sandbox uses ([`Sandbox::usage`]).
pub const FEATURE_USAGE: &str = "usage";

/// The feature of engines that place the workdir at [`SandboxSpec::home`].
pub const FEATURE_HOME: &str = "home";

/// The most bytes of a [`SandboxSpec::home`] path.
const MAX_HOME_LEN: usize = 200;

/// Top-level directories a sandbox's home may not lie in: the system's own, and the
/// kernel's file systems.
const SYSTEM_DIRS: &[&str] = &[
    "bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "media", "mnt", "nix", "opt",
    "proc", "root", "run", "sbin", "snap", "sys", "usr", "var", "tmp",
];

/// `INVALID_OPTIONS` unless `home` is a plain absolute path of at least two
/// components (`/home/user`), in letters, digits, `.`, `_` and `-`, outside the
/// system's directories (`/usr`, `/etc`, `/proc`, `/tmp`, …) and without `.` or `..`
/// components.
pub fn check_home(field: &str, home: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::invalid_options(field, format!("`{home}` {why}")));
    if home.len() > MAX_HOME_LEN {
        return bad(&format!("is longer than {MAX_HOME_LEN} bytes"));
    }
    let Some(rest) = home.strip_prefix('/') else {
        return bad("is not absolute; name a path such as `/home/user`");
    };
    let parts: Vec<&str> = rest.split('/').collect();
    if parts.len() < 2 {
        return bad("has fewer than two components; name a path such as `/home/user`");
    }
    for part in &parts {
        if part.is_empty() || *part == "." || *part == ".." {
            return bad("has an empty, `.` or `..` component");
        }
        if !part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return bad("may hold only letters, digits, `.`, `_`, `-` and `/`");
        }
    }
    if SYSTEM_DIRS.contains(&parts[0]) {
        return bad(&format!(
            "lies in `/{}`, a system directory; choose one such as `/home/user`",
            parts[0]
        ));
    }
    Ok(())
}

/// The life-cycle state of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum SandboxStatus {
    /// Idle and able to run.
    Ready,
    /// Running at least one execution.
    Busy,
    /// Destroyed; every further call is refused with `ENGINE_DISPOSED`.
    Destroyed,
    /// Paused: its processes are frozen and new executions are refused with
    /// `SANDBOX_PAUSED` until [`Sandbox::unpause`].
    Paused,
}

/// One entry of [`Sandbox::list_files`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct FileEntry {
    /// The absolute path inside the sandbox (rooted at the workdir as the program sees it).
    pub path: String,
    /// Size in bytes (0 for directories).
    pub size: u64,
    /// Whether it is a directory.
    pub is_dir: bool,
}

/// Receives output while an execution runs.
///
/// `chunk` is awaited before more output is read, so a slow sink slows the program
/// down through its pipe (backpressure) instead of buffering without bound.
#[async_trait]
pub trait OutputSink: Send + Sync {
    /// Delivers a chunk. An error means the receiver is gone; the engine then keeps
    /// capturing for the result but stops delivering.
    async fn chunk(&self, chunk: OutputChunk) -> Result<()>;

    /// The execution's share of its tenant's budget of retained output, when the
    /// caller has one: engines take from it before they keep more output for the
    /// result, and cut the output (as at the output cap) when it grants less.
    /// Default: none (only the output cap bounds what is kept).
    fn allowance(&self) -> Option<Arc<crate::budget::OutputAllowance>> {
        None
    }
}

/// A sink that drops every chunk (the result still carries the captured output).
#[derive(Debug, Clone, Copy, Default)]
pub struct DiscardSink;

#[async_trait]
impl OutputSink for DiscardSink {
    async fn chunk(&self, _chunk: OutputChunk) -> Result<()> {
        Ok(())
    }
}

/// A backend that creates sandboxes.
#[async_trait]
pub trait Engine: Send + Sync + fmt::Debug {
    /// The name the engine is registered under (and requests choose it by).
    fn name(&self) -> EngineName;

    /// What the engine can do on this host.
    fn capabilities(&self) -> &Capabilities;

    /// Creates a sandbox for `spec`, or refuses with `LEVEL_NOT_SUPPORTED` /
    /// `CAPABILITY_NOT_SUPPORTED` when the engine cannot meet it.
    async fn create(&self, spec: &SandboxSpec) -> Result<Arc<dyn Sandbox>>;
}

/// A lease of one engine instance with a persistent workdir.
///
/// Every method takes `&self` and is safe to call concurrently. After
/// [`destroy`](Sandbox::destroy) every call fails with `ENGINE_DISPOSED`.
#[async_trait]
pub trait Sandbox: Send + Sync + fmt::Debug {
    /// The instance id.
    fn id(&self) -> &str;

    /// The name of the engine that made it.
    fn engine(&self) -> EngineName;

    /// The sandbox's root as its programs see it: the workdir on the subprocess
    /// engine, `/workspace` in a container. The files API takes paths under it (or
    /// relative to it) and lists paths under it.
    fn root_dir(&self) -> &Path;

    /// Where the sandbox's files are on the host, for the embedder's own checks
    /// (never sent to API clients). The root as programs see it, unless an engine
    /// says otherwise.
    fn host_dir(&self) -> &Path {
        self.root_dir()
    }

    /// The current status.
    fn status(&self) -> SandboxStatus;

    /// Runs one execution, streaming output to `sink`. Cancelling `cancel` kills the
    /// program's whole process tree and yields [`crate::Outcome::Cancelled`].
    ///
    /// Errors are reserved for requests that never ran (refused or invalid); anything
    /// that happens once the program started is reported in the result's outcome.
    ///
    /// The engine applies `max_output_bytes` (the request's, else its defaults) while
    /// it captures: at most that many bytes of each stream are kept in the result,
    /// the rest drained and dropped, with the `*_truncated` flag set. The scheduler
    /// does not cut output a second time.
    async fn exec(
        &self,
        request: ExecRequest,
        sink: &dyn OutputSink,
        cancel: CancelToken,
    ) -> Result<ExecResult>;

    /// [`exec`](Sandbox::exec) for a request already validated: the scheduler calls
    /// this one, with the proof it made when it admitted the request, so that an
    /// engine need not run [`ExecRequest::validate`] a second time. Everything else
    /// (capabilities, limits merged with the engine's defaults) is the engine's, as
    /// in `exec`.
    ///
    /// The default hands the request to `exec`. An engine whose `exec` validates
    /// overrides this one to skip it, and has its `exec` make the proof with
    /// [`ValidRequest::new`](crate::ValidRequest::new) and call this.
    async fn exec_valid(
        &self,
        request: crate::ValidRequest,
        sink: &dyn OutputSink,
        cancel: CancelToken,
    ) -> Result<ExecResult> {
        self.exec(request.into_inner(), sink, cancel).await
    }

    /// Writes a file, creating parent directories.
    async fn write_file(&self, path: &str, data: &[u8]) -> Result<()>;

    /// Reads a file.
    async fn read_file(&self, path: &str) -> Result<Vec<u8>>;

    /// Lists a directory recursively; a missing directory lists as empty.
    async fn list_files(&self, path: &str) -> Result<Vec<FileEntry>>;

    /// Opens a file for a streaming read: its size when opened, and its bytes (at most
    /// that many). Paths and refusals are those of [`read_file`](Sandbox::read_file):
    /// escapes are `PATH_ESCAPE`, a missing file `NOT_FOUND`, a directory, FIFO or
    /// device `INVALID_OPTIONS` at once (never a read that blocks).
    ///
    /// An engine that streams holds one bounded buffer per reader, whatever the
    /// file's size. The reader holds the open file, not the sandbox: it keeps reading
    /// the bytes it opened after a destroy.
    ///
    /// The default reads the whole file with [`read_file`](Sandbox::read_file) (and
    /// its size limit) and serves it from memory.
    async fn open_read(&self, path: &str) -> Result<crate::FileReader> {
        Ok(crate::FileReader::from_bytes(self.read_file(path).await?))
    }

    /// Writes the bytes of `source` to a file, creating parent directories as
    /// [`write_file`](Sandbox::write_file) does, and returns how many were written.
    ///
    /// At most `max_bytes` are taken: a longer source is refused with
    /// `LIMITS_EXCEEDED`, naming the limit. A source that fails is refused with
    /// `INVALID_OPTIONS`, and a sandbox destroyed meanwhile with `ENGINE_DISPOSED`.
    /// No refusal leaves a partial file: an engine that streams removes the file it
    /// was writing (so a file that was at `path` before is gone too, as `write_file`
    /// would have replaced it).
    ///
    /// An engine that streams holds one bounded buffer per write, whatever
    /// `max_bytes` is. The default reads the source into memory (up to `max_bytes`
    /// bytes) and then calls [`write_file`](Sandbox::write_file), so a refused source
    /// writes nothing at all.
    async fn write_from(
        &self,
        path: &str,
        source: crate::ByteSource,
        max_bytes: u64,
    ) -> Result<u64> {
        let data = crate::files::read_to_limit(path, source, max_bytes).await?;
        self.write_file(path, &data).await?;
        Ok(data.len() as u64)
    }

    /// What `lstat` says of `path` (a symlink is itself). Paths are taken and
    /// refused as [`read_file`](Sandbox::read_file) takes them (`PATH_ESCAPE`
    /// outside the sandbox's files); a missing path is `NOT_FOUND`.
    ///
    /// Optional (feature `fileops`); the default refuses with
    /// `CAPABILITY_NOT_SUPPORTED`.
    async fn stat(&self, path: &str) -> Result<crate::FileInfo> {
        let _ = path;
        Err(not_supported(self.engine(), "stat files", "fileops"))
    }

    /// The entries below directory `path`, `depth` levels down (1: its own
    /// entries), sorted by path; symlinks are listed, never followed below the
    /// directory itself. A missing directory is `NOT_FOUND`, a file
    /// `INVALID_OPTIONS`; too many entries `LIMITS_EXCEEDED`.
    ///
    /// Optional (feature `fileops`).
    async fn list_dir(&self, path: &str, depth: u32) -> Result<Vec<crate::FileInfo>> {
        let _ = (path, depth);
        Err(not_supported(self.engine(), "list directories", "fileops"))
    }

    /// Makes directory `path` and its missing parents. `true` when it was made,
    /// `false` when a directory was already there; anything else there is
    /// `INVALID_OPTIONS`.
    ///
    /// Optional (feature `fileops`).
    async fn make_dir(&self, path: &str) -> Result<bool> {
        let _ = path;
        Err(not_supported(self.engine(), "make directories", "fileops"))
    }

    /// Moves (renames) `from` to `to`, making `to`'s missing parents and replacing
    /// what is at `to` (a file, or an empty directory). A missing `from` is
    /// `NOT_FOUND`.
    ///
    /// Optional (feature `fileops`).
    async fn rename(&self, from: &str, to: &str) -> Result<()> {
        let _ = (from, to);
        Err(not_supported(self.engine(), "move files", "fileops"))
    }

    /// Replaces the user metadata of file or directory `path` with `metadata`
    /// (checked with [`check_metadata`](crate::check_metadata)): keys not in it are
    /// removed, so an empty map clears it. A missing path is `NOT_FOUND`.
    ///
    /// Optional (feature `fileops`).
    async fn set_metadata(&self, path: &str, metadata: &crate::FileMetadata) -> Result<()> {
        let _ = (path, metadata);
        Err(not_supported(self.engine(), "set file metadata", "fileops"))
    }

    /// Removes `path`, a directory with everything in it. A missing path is
    /// `NOT_FOUND`; the sandbox's root itself is refused with `INVALID_OPTIONS`.
    ///
    /// Optional (feature `fileops`).
    async fn remove(&self, path: &str) -> Result<()> {
        let _ = path;
        Err(not_supported(self.engine(), "remove files", "fileops"))
    }

    /// Watches directory `path` (and everything below it when `recursive`): the
    /// changes come as [`FileEvent`](crate::FileEvent)s through a bounded buffer.
    /// Dropping the [`FileWatch`](crate::FileWatch) stops it; a recycle or a
    /// destroy ends it. A watch costs nothing while nothing changes (no polling).
    /// Paths are refused as [`list_dir`](Sandbox::list_dir) refuses them.
    ///
    /// Optional (feature `fileops`).
    async fn watch(&self, path: &str, recursive: bool) -> Result<crate::FileWatch> {
        let _ = (path, recursive);
        Err(not_supported(self.engine(), "watch directories", "fileops"))
    }

    /// Resets the sandbox for reuse by another lease, or fails if it cannot be reused.
    async fn recycle(&self) -> Result<()>;

    /// The pool hands the sandbox out: a lease begins (it ends with
    /// [`recycle`](Sandbox::recycle) or [`destroy`](Sandbox::destroy)). An engine may
    /// retire, some time into the lease, what it prepared ahead of need that the
    /// lease has not used. The default does nothing.
    fn leased(&self) {}

    /// Kills everything the sandbox runs and frees its resources. Idempotent, and safe
    /// to call concurrently.
    async fn destroy(&self) -> Result<()>;

    /// What the sandbox uses now: CPU time, memory and disk (see
    /// [`SandboxUsage`](crate::SandboxUsage)), read from its cgroup and its disk.
    ///
    /// Optional: an engine that can tell advertises the `usage` feature; the
    /// default refuses with `CAPABILITY_NOT_SUPPORTED`.
    async fn usage(&self) -> Result<crate::SandboxUsage> {
        Err(not_supported(self.engine(), "report usage", FEATURE_USAGE))
    }

    /// Freezes everything the sandbox runs, in place: its processes stop, use no CPU
    /// and keep their memory until [`unpause`](Sandbox::unpause). An execution in
    /// progress freezes with it (its deadline keeps running); new executions are
    /// refused with `SANDBOX_PAUSED`. Pausing a paused sandbox is a no-op.
    ///
    /// Optional: an engine that can pause advertises the `pause` feature; the default
    /// refuses with `CAPABILITY_NOT_SUPPORTED`.
    async fn pause(&self) -> Result<()> {
        Err(Error::new(
            ErrorCode::CapabilityNotSupported,
            format!("the {} engine cannot pause a sandbox", self.engine()),
        ))
    }

    /// Thaws a sandbox [`pause`](Sandbox::pause) froze. Unpausing a running sandbox
    /// is a no-op.
    async fn unpause(&self) -> Result<()> {
        Err(Error::new(
            ErrorCode::CapabilityNotSupported,
            format!("the {} engine cannot pause a sandbox", self.engine()),
        ))
    }

    /// Starts a background process that outlives the call (feature `process`). The
    /// sandbox owns it: [`destroy`](Sandbox::destroy) kills it and waits for it.
    /// Refused with `CAPABILITY_NOT_SUPPORTED` by engines without the feature, and
    /// with `ENGINE_DISPOSED` once the sandbox is destroyed.
    async fn start_process(&self, spec: crate::ProcessSpec) -> Result<crate::ProcessHandle> {
        let _ = spec;
        Err(not_supported(
            self.engine(),
            "run background processes",
            "process",
        ))
    }

    /// Runs a command on a real pseudo-terminal (feature `terminal`). The sandbox owns
    /// it: when [`destroy`](Sandbox::destroy) returns, the terminal's `exited` has
    /// resolved.
    async fn open_terminal(&self, spec: crate::TerminalSpec) -> Result<crate::TerminalHandle> {
        let _ = spec;
        Err(not_supported(self.engine(), "open terminals", "terminal"))
    }

    /// Opens a two-way byte stream to a service listening on the guest's own loopback
    /// (feature `tcp`). (Not in the loom models' build, which has no tokio networking.) A host that is not loopback is refused with
    /// `INVALID_OPTIONS`; nothing is sent anywhere else.
    #[cfg(not(loom))]
    async fn open_tcp_connection(&self, target: crate::TcpTarget) -> Result<crate::TcpConnection> {
        let _ = target;
        Err(not_supported(
            self.engine(),
            "open TCP streams into the guest",
            "tcp",
        ))
    }
}

fn not_supported(kind: EngineName, what: &str, feature: &str) -> Error {
    Error::new(
        ErrorCode::CapabilityNotSupported,
        format!(
            "the {kind} engine cannot {what}; choose an engine whose capabilities list `{feature}`"
        ),
    )
}

#[cfg(test)]
mod home_tests {
    use super::check_home;

    #[test]
    fn a_home_is_a_plain_path_outside_the_system() {
        for ok in ["/home/user", "/srv/sandbox/work", "/home/u-1.x_y"] {
            assert!(check_home("home", ok).is_ok(), "{ok}");
        }
        for (bad, says) in [
            ("home/user", "not absolute"),
            ("/home", "two components"),
            ("/", "two components"),
            ("/home//user", "empty"),
            ("/home/../etc", "`..`"),
            ("/home/./user", "`.`"),
            ("/home/us er", "letters"),
            ("/usr/local", "system directory"),
            ("/proc/self", "system directory"),
            ("/tmp/x", "system directory"),
            ("/opt/app", "system directory"),
            ("/root/x", "system directory"),
        ] {
            let e = check_home("home", bad).unwrap_err();
            assert_eq!(e.code, crate::ErrorCode::InvalidOptions, "{bad}");
            assert!(e.message.contains(says), "{bad}: {e}");
        }
        let long = format!("/home/{}", "a".repeat(300));
        assert!(check_home("home", &long)
            .unwrap_err()
            .message
            .contains("longer"));
    }
}
