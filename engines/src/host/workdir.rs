//! A sandbox's workdir and the file operations on it, confined by the kernel.
//!
//! Every path a caller gives is resolved with `openat2(RESOLVE_BENEATH)` from an fd of
//! the workdir, so `..`, absolute paths outside it and symlinks that lead out (even
//! ones a program creates while we resolve) are refused with `PATH_ESCAPE` without a
//! check-then-use race.
//!
//! Streaming transfers ([`Sandbox::open_read`](paddock_core::Sandbox::open_read),
//! [`Sandbox::write_from`](paddock_core::Sandbox::write_from)) open their file by the
//! same rules and then move its bytes through one buffer of [`STREAM_BUFFER_BYTES`],
//! whatever the file's size.

// The `*at` system calls that keep every path beneath the workdir (`openat2` with
// `RESOLVE_BENEATH`, `mkdirat`, `fstatat`, `unlinkat`) are `unsafe` to call; they
// are made here, behind the safe `Workdir` methods.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use paddock_core::files::{source_failed, too_long};
use paddock_core::{
    ByteSource, Error, ErrorCode, ExecResult, FileEntry, FileReader, LimitKind, Limits, Result,
};

use super::volume::{Disks, Quota, Volume};
use tokio::io::AsyncReadExt;

use crate::task::blocking;

/// Largest file [`Workdir::read_file`] returns. A streaming read (`open_read`) has no
/// size limit: it holds one buffer of [`STREAM_BUFFER_BYTES`], however large the file.
pub const MAX_READ_BYTES: u64 = 256 << 20;
/// The buffer a streaming read or write holds, in bytes.
pub const STREAM_BUFFER_BYTES: usize = 64 << 10;
/// Most entries [`Workdir::list_files`] returns.
pub const MAX_LIST_ENTRIES: usize = 50_000;
/// Deepest nesting [`Workdir::list_files`] walks.
pub const MAX_LIST_DEPTH: usize = 256;

/// A directory owned by one sandbox, removed by [`Workdir::remove`]; with a disk
/// quota, the mount point of the sandbox's own filesystem ([`crate::volume`]).
#[derive(Debug)]
pub struct Workdir {
    root: PathBuf,
    /// The root as the sandbox's programs see it (`root` unless they see it
    /// elsewhere, as at `/workspace` in a container).
    shown: PathBuf,
    fd: OwnedFd,
    volume: Option<Volume>,
    /// The owner (uid, gid) of the files and directories the files API creates, when
    /// it is not this process's user (a container's mapped root).
    owner: Option<(u32, u32)>,
}

impl Workdir {
    /// Creates a fresh, private (0700) workdir under `parent`, without a quota.
    pub fn create(parent: &Path, name: &str) -> io::Result<Workdir> {
        Workdir::create_on(parent, name, None)
    }

    /// Creates a fresh, private (0700) workdir under `parent`; with `disk`, it is
    /// the mount point of a filesystem of that quota, made for it.
    pub fn create_on(
        parent: &Path,
        name: &str,
        disk: Option<(&Disks, Quota)>,
    ) -> io::Result<Workdir> {
        std::fs::create_dir_all(parent)?;
        let root = parent.join(name);
        std::fs::create_dir(&root)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))?;
        let root = root.canonicalize()?;
        let volume = match disk {
            Some((disks, quota)) => match disks.mount(&root, quota) {
                Ok(v) => Some(v),
                Err(e) => {
                    let _ = std::fs::remove_dir(&root);
                    return Err(e);
                }
            },
            None => None,
        };
        let fd = match open_dir_path(&root) {
            Ok(fd) => fd,
            Err(e) => {
                if let Some(v) = &volume {
                    let _ = v.unmount();
                }
                let _ = std::fs::remove_dir(&root);
                return Err(e);
            }
        };
        Ok(Workdir {
            shown: root.clone(),
            root,
            fd,
            volume,
            owner: None,
        })
    }

    /// This workdir, as its programs see it at `shown` (an absolute path): the
    /// file operations take paths under `shown` instead of the host path, and
    /// listings give paths under it.
    pub fn shown_at(mut self, shown: &Path) -> Workdir {
        self.shown = shown.to_path_buf();
        self
    }

    /// The root as the sandbox's programs see it.
    pub fn shown_root(&self) -> &Path {
        &self.shown
    }

    /// The sandbox's own filesystem, when it has a disk quota.
    pub fn volume(&self) -> Option<&Volume> {
        self.volume.as_ref()
    }

    /// The disk limit that is used up now, if any (see [`crate::volume::Fill`]).
    pub fn disk_exhausted(&self) -> Option<LimitKind> {
        self.volume.as_ref().and_then(|v| v.exhausted())
    }

    /// Refuses an execution whose request sets a disk limit other than the
    /// sandbox's: the filesystem is made when the sandbox is opened, and stays.
    pub fn check_disk_request(&self, asked: &Limits) -> Result<()> {
        let quota = self.volume.as_ref().map(|v| v.quota());
        let checks = [
            ("disk_bytes", asked.disk_bytes, quota.map(|q| q.bytes)),
            ("disk_files", asked.disk_files, quota.map(|q| q.files)),
        ];
        for (field, want, have) in checks {
            if let Some(want) = want {
                if Some(want) != have {
                    let had = have.map_or_else(|| "no quota".to_string(), |h| h.to_string());
                    return Err(Error::invalid_options(
                        &format!("limits.{field}"),
                        format!(
                            "{want} differs from this sandbox's {field} ({had}): a sandbox's disk is made when it is opened; set it there, or leave it unset here"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Says in `result` whether the disk quota was used up by this execution:
    /// `before` is [`disk_exhausted`](Workdir::disk_exhausted) from before it ran. A
    /// program that filled the disk and then failed (a non-zero exit) is
    /// `limit_exceeded` (`disk` or `disk_files`), its exit status kept in a warning;
    /// one that succeeded anyway, or was stopped otherwise (deadline, cancel,
    /// another limit), keeps its outcome and gets the warning. A disk that was
    /// already full before gets a warning only. (Judged from the filesystem after
    /// the run: a program that hit the quota and then deleted what it wrote leaves
    /// no trace.)
    pub fn judge_disk(
        &self,
        before: Option<LimitKind>,
        result: Result<ExecResult>,
    ) -> Result<ExecResult> {
        let mut r = result?;
        let (Some(limit), Some(volume)) = (self.disk_exhausted(), &self.volume) else {
            return Ok(r);
        };
        let quota = volume.quota();
        let what = match limit {
            LimitKind::DiskFiles => format!("the file-count cap ({} files)", quota.files),
            _ => format!("the disk quota ({} bytes)", quota.bytes),
        };
        match (&r.outcome, before) {
            (paddock_core::Outcome::Completed { exit_code, signal }, None)
                if *exit_code != 0 =>
            {
                r.warnings.push(format!(
                    "{what} was used up: writes failed with ENOSPC; the program then exited with code {exit_code}{}",
                    signal.map_or_else(String::new, |s| format!(" (signal {s})"))
                ));
                r.outcome = paddock_core::Outcome::LimitExceeded { limit };
            }
            (_, None) => r.warnings.push(format!(
                "{what} was used up during the run: writes failed with ENOSPC"
            )),
            (_, Some(_)) => r.warnings.push(format!(
                "{what} is used up (it was before this run too): writes fail with ENOSPC until files are removed"
            )),
        }
        Ok(r)
    }

    /// Gives the files and directories the files API creates from now on to `uid`
    /// and `gid` (the host ids of a user-namespaced container's root), so that the
    /// program can change them. The root itself is left to the caller.
    pub fn set_owner(&mut self, uid: u32, gid: u32) {
        self.owner = Some((uid, gid));
    }

    /// The workdir's absolute host path.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Turns a caller's path into a relative path below the root, lexically.
    ///
    /// `""`, `"."` and `"/"` name the root; an absolute path must lie under the root
    /// as programs see it ([`shown_root`](Workdir::shown_root)); `..` is refused
    /// outright.
    pub fn relative(&self, path: &str) -> Result<PathBuf> {
        if path.contains('\0') {
            return Err(Error::invalid_options("path", "must not contain NUL bytes"));
        }
        let p = Path::new(path);
        let rel: &Path = if p.is_absolute() {
            if p == Path::new("/") {
                Path::new("")
            } else {
                match p.strip_prefix(&self.shown) {
                    Ok(rest) => rest,
                    Err(_) => return Err(escape(path)),
                }
            }
        } else {
            p
        };
        let mut out = PathBuf::new();
        for comp in rel.components() {
            match comp {
                Component::Normal(c) => out.push(c),
                Component::CurDir => {}
                Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                    return Err(escape(path))
                }
            }
        }
        Ok(out)
    }

    /// Resolves `path` (a program's working directory) to an existing directory
    /// beneath the workdir, and returns its host path with every symlink resolved.
    ///
    /// The path is taken as [`relative`](Workdir::relative) takes it and opened with
    /// `RESOLVE_BENEATH`, like a file: `..`, absolute paths outside the workdir and
    /// symlinks that lead out (`esc -> /`, or a symlinked parent) are refused with
    /// `PATH_ESCAPE`; a missing directory or a file is `INVALID_OPTIONS` naming
    /// `cwd`. Symlinks that stay inside are followed, so the path returned
    /// names the directory itself.
    ///
    /// The program is started in the returned path afterwards, so a program of the
    /// sandbox that swaps a component for a symlink in between could still move the
    /// new program's start elsewhere; the engines' own boundary (the container's
    /// mount namespace) is what holds then, not this check.
    pub fn resolve_dir(&self, path: &str) -> Result<PathBuf> {
        self.resolve_dir_as(path, path)
    }

    /// [`resolve_dir`](Workdir::resolve_dir) of `path`, naming it `shown` in errors
    /// (the path as the caller wrote it, such as `/workspace/sub` in a container).
    pub fn resolve_dir_as(&self, path: &str, shown: &str) -> Result<PathBuf> {
        // A bad option of the request, not a missing resource: the sandbox is there.
        let not_found = || {
            Error::invalid_options(
                "cwd",
                format!(
                    "the working directory `{shown}` does not exist in the sandbox workdir; create it first, or leave cwd unset"
                ),
            )
        };
        let rel = self.relative(path).map_err(|e| match e.code {
            ErrorCode::PathEscape => escape(shown),
            _ => e,
        })?;
        let fd = openat_beneath(
            self.fd.as_raw_fd(),
            &cpath(&rel)?,
            libc::O_PATH | libc::O_CLOEXEC,
            0,
        )
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) => not_found(),
            Some(libc::ENOTDIR) => Error::invalid_options(
                "cwd",
                format!("the working directory `{shown}`: a parent component is not a directory"),
            ),
            _ => map_io(e, shown),
        })?;
        let dir = File::from(fd);
        let meta = dir.metadata().map_err(|e| map_io(e, shown))?;
        if !meta.is_dir() {
            return Err(Error::invalid_options(
                "cwd",
                format!(
                    "`{shown}` is not a directory; name a directory inside the sandbox workdir"
                ),
            ));
        }
        // The directory the kernel resolved, through its fd: every symlink followed.
        let real = std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd()))
            .map_err(|e| map_io(e, shown))?;
        match real.strip_prefix(&self.root) {
            Ok(_) => Ok(real),
            // Resolved beneath the workdir's fd, yet not under its path: the workdir
            // itself was moved or removed meanwhile.
            Err(_) => Err(not_found()),
        }
    }

    /// Writes `data` to `path`, creating parent directories.
    pub fn write_file(&self, path: &str, data: &[u8]) -> Result<()> {
        let mut new = self.create_file(path)?;
        new.file.write_all(data).map_err(|e| map_io(e, path))?;
        Ok(())
    }

    /// Creates (or truncates) the regular file at `path` for writing, creating
    /// parent directories; a symlink at `path` is refused, never followed.
    fn create_file(&self, path: &str) -> Result<NewFile> {
        let rel = self.relative(path)?;
        let Some(name) = rel.file_name() else {
            return Err(Error::invalid_options(
                "path",
                "must name a file, not the workdir",
            ));
        };
        let parent = self.mkdirs(rel.parent().unwrap_or(Path::new("")), path)?;
        let name = cpath(Path::new(name))?;
        // O_NONBLOCK: a FIFO a program left here must not block the caller.
        let fd = openat_beneath(
            parent.as_raw_fd(),
            &name,
            libc::O_WRONLY
                | libc::O_CREAT
                | libc::O_TRUNC
                | libc::O_CLOEXEC
                | libc::O_NOFOLLOW
                | libc::O_NONBLOCK,
            0o644,
        )
        .map_err(|e| map_io(e, path))?;
        let file = File::from(fd);
        regular_only(&file, path)?;
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid)).map_err(|e| map_io(e, path))?;
        }
        Ok(NewFile { parent, name, file })
    }

    /// Reads the file at `path`.
    pub fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        let (mut file, len) = self.open_file(path)?;
        if len > MAX_READ_BYTES {
            return Err(Error::new(
                ErrorCode::LimitsExceeded,
                format!(
                    "`{path}` is {len} bytes; read_file returns at most {MAX_READ_BYTES}; read it as a stream (open_read) instead"
                ),
            ));
        }
        let mut buf = Vec::with_capacity(len as usize);
        (&mut file)
            .take(MAX_READ_BYTES + 1)
            .read_to_end(&mut buf)
            .map_err(|e| map_io(e, path))?;
        if buf.len() as u64 > MAX_READ_BYTES {
            return Err(Error::new(
                ErrorCode::LimitsExceeded,
                format!("`{path}` grew past {MAX_READ_BYTES} bytes while being read"),
            ));
        }
        Ok(buf)
    }

    /// Opens the regular file at `path` for reading, and returns it with its size.
    /// Symlinks that stay inside the workdir are followed; a directory, FIFO, socket
    /// or device is refused with `INVALID_OPTIONS` (opening never blocks).
    pub fn open_file(&self, path: &str) -> Result<(File, u64)> {
        let rel = self.relative(path)?;
        // O_NONBLOCK: opening a FIFO a program left here must not block the caller.
        let fd = openat_beneath(
            self.fd.as_raw_fd(),
            &cpath(&rel)?,
            libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK,
            0,
        )
        .map_err(|e| map_io(e, path))?;
        let file = File::from(fd);
        let meta = file.metadata().map_err(|e| map_io(e, path))?;
        if meta.is_dir() {
            return Err(Error::invalid_options(
                "path",
                format!("`{path}` is a directory; use list_files"),
            ));
        }
        regular_only(&file, path)?;
        Ok((file, meta.len()))
    }

    /// A streaming read of `path` (see [`Sandbox::open_read`]): opened as
    /// [`open_file`](Workdir::open_file) opens it, then read through one buffer of
    /// [`STREAM_BUFFER_BYTES`], at most the size it had when opened. No size limit.
    ///
    /// [`Sandbox::open_read`]: paddock_core::Sandbox::open_read
    pub async fn open_read(self: &Arc<Self>, path: &str) -> Result<FileReader> {
        let (workdir, owned) = (self.clone(), path.to_string());
        let (file, size) = blocking(move || workdir.open_file(&owned)).await?;
        let mut file = tokio::fs::File::from_std(file);
        file.set_max_buf_size(STREAM_BUFFER_BYTES);
        Ok(FileReader::new(size, Box::pin(file.take(size))))
    }

    /// A streaming write of `source` to `path` (see [`Sandbox::write_from`]): the file
    /// is created as [`write_file`](Workdir::write_file) creates it, then filled one
    /// buffer of [`STREAM_BUFFER_BYTES`] at a time; never more than `max_bytes` reach
    /// it. Any refusal removes the file.
    ///
    /// `admit` is asked before each step that touches the workdir and its guard is
    /// held only during that step, so a destroy waits for one buffer's write at most,
    /// never for a slow source; an `admit` error ends the write (for a source that
    /// stalls, when it next yields bytes or ends).
    ///
    /// [`Sandbox::write_from`]: paddock_core::Sandbox::write_from
    pub async fn write_from<G>(
        self: &Arc<Self>,
        path: &str,
        mut source: ByteSource,
        max_bytes: u64,
        admit: impl Fn() -> Result<G>,
    ) -> Result<u64> {
        let guard = admit()?;
        let (workdir, owned) = (self.clone(), path.to_string());
        let mut new = blocking(move || workdir.create_file(&owned)).await?;
        drop(guard);
        let mut buf = vec![0u8; STREAM_BUFFER_BYTES];
        let mut written: u64 = 0;
        let ended: Result<()> = loop {
            // One byte past the limit is enough to tell that the source is too long.
            let room = max_bytes.saturating_sub(written).saturating_add(1);
            let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
            let n = match source.read(&mut buf[..want]).await {
                Ok(0) => break Ok(()),
                Ok(n) => n,
                Err(e) => break Err(source_failed(path, written, &e)),
            };
            if written + n as u64 > max_bytes {
                break Err(too_long(path, max_bytes));
            }
            let guard = match admit() {
                Ok(g) => g,
                Err(e) => break Err(e),
            };
            let shown = path.to_string();
            let (back, back_buf, wrote) = blocking(move || {
                let wrote = (&new.file)
                    .write_all(&buf[..n])
                    .map_err(|e| map_io(e, &shown));
                Ok((new, buf, wrote))
            })
            .await?;
            drop(guard);
            (new, buf) = (back, back_buf);
            if let Err(e) = wrote {
                break Err(e);
            }
            written += n as u64;
        };
        match ended {
            Ok(()) => Ok(written),
            Err(e) => {
                blocking(move || {
                    new.discard();
                    Ok(())
                })
                .await?;
                Err(e)
            }
        }
    }

    /// Whether `path` exists (a symlink counts as itself, never followed).
    pub fn exists(&self, path: &str) -> Result<bool> {
        let rel = self.relative(path)?;
        match openat_beneath(
            self.fd.as_raw_fd(),
            &cpath(&rel)?,
            libc::O_PATH | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            0,
        ) {
            Ok(_) => Ok(true),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => {
                Ok(false)
            }
            Err(e) => Err(map_io(e, path)),
        }
    }

    /// Lists `path` recursively: absolute host paths with sizes. A missing directory
    /// lists as empty; symlinks are listed, never followed.
    pub fn list_files(&self, path: &str) -> Result<Vec<FileEntry>> {
        let rel = self.relative(path)?;
        let dir = match openat_beneath(
            self.fd.as_raw_fd(),
            &cpath(&rel)?,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            0,
        ) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(Vec::new()),
            Err(e) => return Err(map_io(e, path)),
        };
        let mut out = Vec::new();
        self.walk(dir, &rel, &mut out, path)?;
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Walks iteratively (no recursion, one directory fd open at a time): each
    /// directory is opened from the workdir's fd with `RESOLVE_BENEATH`, so the walk
    /// stays inside whatever a program does meanwhile.
    fn walk(&self, first: OwnedFd, rel: &Path, out: &mut Vec<FileEntry>, arg: &str) -> Result<()> {
        let too_many = || {
            Error::new(
                ErrorCode::LimitsExceeded,
                format!("`{arg}` holds more than {MAX_LIST_ENTRIES} entries or is nested deeper than {MAX_LIST_DEPTH} levels; list a subdirectory"),
            )
        };
        let mut pending: Vec<(PathBuf, usize)> = Vec::new();
        let mut current = Some((first, rel.to_path_buf(), 0usize));
        while let Some((dir, dir_rel, depth)) = current.take() {
            // Reading through the fd's /proc link reads the directory we opened, even
            // if the path has since been swapped for a symlink.
            let proc_path = format!("/proc/self/fd/{}", dir.as_raw_fd());
            let entries = std::fs::read_dir(&proc_path).map_err(|e| map_io(e, arg))?;
            for entry in entries {
                let entry = entry.map_err(|e| map_io(e, arg))?;
                if out.len() >= MAX_LIST_ENTRIES {
                    return Err(too_many());
                }
                let name = entry.file_name();
                let file_type = entry.file_type().map_err(|e| map_io(e, arg))?;
                let child_rel = dir_rel.join(&name);
                let shown = self.shown.join(&child_rel).to_string_lossy().into_owned();
                if file_type.is_dir() {
                    out.push(FileEntry {
                        path: shown,
                        size: 0,
                        is_dir: true,
                    });
                    if depth + 1 > MAX_LIST_DEPTH {
                        return Err(too_many());
                    }
                    pending.push((child_rel, depth + 1));
                } else {
                    let size = if file_type.is_symlink() {
                        0
                    } else {
                        entry.metadata().map(|m| m.len()).unwrap_or(0)
                    };
                    out.push(FileEntry {
                        path: shown,
                        size,
                        is_dir: false,
                    });
                }
            }
            drop(dir);
            while let Some((next_rel, next_depth)) = pending.pop() {
                match openat_beneath(
                    self.fd.as_raw_fd(),
                    &cpath(&next_rel)?,
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                    0,
                ) {
                    Ok(fd) => {
                        current = Some((fd, next_rel, next_depth));
                        break;
                    }
                    // Removed or replaced by something else while we walked: skip it.
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP)
                        ) => {}
                    Err(e) => return Err(map_io(e, arg)),
                }
            }
        }
        Ok(())
    }

    /// Creates every directory of `rel` below the root, and returns an fd of the last.
    fn mkdirs(&self, rel: &Path, arg: &str) -> Result<OwnedFd> {
        let mut current = open_dir_fd(self.fd.as_raw_fd(), c".").map_err(|e| map_io(e, arg))?;
        for comp in rel.components() {
            let name = cpath(Path::new(comp.as_os_str()))?;
            // SAFETY: mkdirat with an fd we own and a valid C string.
            let r = unsafe { libc::mkdirat(current.as_raw_fd(), name.as_ptr(), 0o755) };
            if r == -1 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EEXIST) {
                    return Err(map_io(e, arg));
                }
            }
            current = open_dir_fd(current.as_raw_fd(), &name).map_err(|e| map_io(e, arg))?;
            if let (0, Some((uid, gid))) = (r, self.owner) {
                // The directory just made, through its (`O_PATH`) fd.
                // SAFETY: fchownat with an fd we own and a valid (empty) C string.
                let r = unsafe {
                    libc::fchownat(
                        current.as_raw_fd(),
                        c"".as_ptr(),
                        uid,
                        gid,
                        libc::AT_EMPTY_PATH,
                    )
                };
                if r == -1 {
                    return Err(map_io(io::Error::last_os_error(), arg));
                }
            }
        }
        Ok(current)
    }

    /// Deletes everything inside the workdir, keeping the directory itself.
    pub fn clear(&self) -> io::Result<()> {
        for entry in std::fs::read_dir(&self.root)? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                remove_tree(&path)?;
            } else {
                std::fs::remove_file(&path)?;
            }
        }
        Ok(())
    }

    /// Removes the workdir and everything in it; its own filesystem is unmounted
    /// and its image deleted.
    pub fn remove(&self) -> io::Result<()> {
        if let Some(v) = &self.volume {
            v.unmount()?;
        }
        match remove_tree(&self.root) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

/// A file [`Workdir::create_file`] made, with the directory and name it has there.
struct NewFile {
    parent: OwnedFd,
    name: CString,
    file: File,
}

impl NewFile {
    /// Empties the file and removes its name from its directory, if the name still
    /// leads to this file (a program may have put something else there meanwhile;
    /// that stays).
    fn discard(self) {
        use std::os::unix::fs::MetadataExt;
        let _ = self.file.set_len(0);
        let Ok(ours) = self.file.metadata() else {
            return;
        };
        // SAFETY: stat is plain data; fstatat fills it from a valid fd and C string.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let found = unsafe {
            libc::fstatat(
                self.parent.as_raw_fd(),
                self.name.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if found == 0 && st.st_dev == ours.dev() && st.st_ino == ours.ino() {
            // SAFETY: unlinkat with a valid fd and C string.
            unsafe { libc::unlinkat(self.parent.as_raw_fd(), self.name.as_ptr(), 0) };
        }
    }
}

/// `remove_dir_all`, after making every directory writable (a program may have
/// `chmod 0`'d one to make the cleanup fail).
fn remove_tree(path: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            use std::os::unix::fs::PermissionsExt;
            fn open_up(p: &Path) {
                let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700));
                if let Ok(rd) = std::fs::read_dir(p) {
                    for e in rd.flatten() {
                        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                            open_up(&e.path());
                        }
                    }
                }
            }
            open_up(path);
            std::fs::remove_dir_all(path)
        }
    }
}

/// Refuses anything but a regular file (FIFOs, sockets and devices a program created).
fn regular_only(file: &File, path: &str) -> Result<()> {
    let meta = file.metadata().map_err(|e| map_io(e, path))?;
    if meta.is_file() {
        return Ok(());
    }
    Err(Error::invalid_options(
        "path",
        format!("`{path}` is not a regular file (a FIFO, socket or device); only regular files can be read or written"),
    ))
}

fn escape(path: &str) -> Error {
    Error::new(
        ErrorCode::PathEscape,
        format!("`{path}` leads outside the sandbox workdir; use a relative path inside it without `..` or escaping symlinks"),
    )
}

fn map_io(e: io::Error, path: &str) -> Error {
    match e.raw_os_error() {
        Some(libc::EXDEV) | Some(libc::ELOOP) => escape(path),
        Some(libc::ENOENT) => Error::new(ErrorCode::NotFound, format!("`{path}` does not exist")),
        Some(libc::ENOTDIR) => Error::new(
            ErrorCode::NotFound,
            format!("`{path}`: a parent component is not a directory"),
        ),
        Some(libc::EISDIR) => Error::invalid_options("path", format!("`{path}` is a directory")),
        Some(libc::ENAMETOOLONG) => Error::invalid_options(
            "path",
            format!("`{path}` is too long: a name is at most 255 bytes, a path at most 4096"),
        ),
        Some(libc::ENXIO) => Error::invalid_options(
            "path",
            format!("`{path}` is a FIFO or device, not a regular file"),
        ),
        Some(libc::EFBIG) | Some(libc::ENOSPC) | Some(libc::EDQUOT) => Error::new(
            ErrorCode::LimitsExceeded,
            format!("`{path}`: {e}; free space or raise the limit"),
        ),
        _ => Error::engine_io(&format!("file operation on `{path}`"), e),
    }
}

fn cpath(p: &Path) -> Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = if p.as_os_str().is_empty() {
        b"."
    } else {
        p.as_os_str().as_bytes()
    };
    CString::new(bytes).map_err(|_| Error::invalid_options("path", "must not contain NUL bytes"))
}

fn open_dir_path(p: &Path) -> io::Result<OwnedFd> {
    let c = cpath(p).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.message))?;
    // SAFETY: open with a valid C string.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn open_dir_fd(dir: RawFd, name: &std::ffi::CStr) -> io::Result<OwnedFd> {
    openat_beneath(
        dir,
        name,
        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        0,
    )
}

/// `openat2(dir, path, flags, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`.
fn openat_beneath(
    dir: RawFd,
    path: &std::ffi::CStr,
    flags: libc::c_int,
    mode: u32,
) -> io::Result<OwnedFd> {
    // SAFETY: open_how is plain data; all-zero is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.mode = if flags & libc::O_CREAT != 0 {
        mode as u64
    } else {
        0
    };
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    loop {
        // SAFETY: openat2 with a valid dirfd, C string and open_how of the right size.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir,
                path.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd == -1 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EAGAIN) || e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // SAFETY: a fresh fd we own.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wd() -> (tempfile::TempDir, Workdir) {
        let t = tempfile::tempdir().unwrap();
        let w = Workdir::create(t.path(), "sb").unwrap();
        (t, w)
    }

    #[test]
    fn round_trips_and_nested_dirs() {
        let (_t, w) = wd();
        w.write_file("a/b/c.txt", "héllo".as_bytes()).unwrap();
        assert_eq!(w.read_file("a/b/c.txt").unwrap(), "héllo".as_bytes());
        let bin: Vec<u8> = (0..=255u8).collect();
        w.write_file("./bin", &bin).unwrap();
        assert_eq!(w.read_file("bin").unwrap(), bin);
        let abs = w.root().join("a/b/c.txt");
        assert_eq!(
            w.read_file(abs.to_str().unwrap()).unwrap(),
            "héllo".as_bytes()
        );
        let list = w.list_files("/").unwrap();
        let c = list.iter().find(|e| e.path.ends_with("a/b/c.txt")).unwrap();
        assert_eq!(c.size, 6);
        assert!(Path::new(&c.path).is_absolute());
        assert_eq!(list.len(), 4, "{list:?}");
        assert!(w.list_files("missing/dir").unwrap().is_empty());
    }

    #[test]
    fn escapes_are_refused() {
        let (_t, w) = wd();
        for p in ["../x", "a/../../x", "/etc/passwd"] {
            assert_eq!(
                w.read_file(p).unwrap_err().code,
                ErrorCode::PathEscape,
                "{p}"
            );
            assert_eq!(
                w.write_file(p, b"x").unwrap_err().code,
                ErrorCode::PathEscape,
                "{p}"
            );
        }
        std::os::unix::fs::symlink("/etc", w.root().join("out")).unwrap();
        std::os::unix::fs::symlink("../../..", w.root().join("up")).unwrap();
        for p in ["out/passwd", "up/etc/passwd"] {
            assert_eq!(
                w.read_file(p).unwrap_err().code,
                ErrorCode::PathEscape,
                "{p}"
            );
        }
        assert_eq!(
            w.write_file("out/x", b"x").unwrap_err().code,
            ErrorCode::PathEscape
        );
        assert_eq!(w.list_files("out").unwrap_err().code, ErrorCode::PathEscape);
        // A symlink that stays inside is fine.
        w.write_file("real/f", b"1").unwrap();
        std::os::unix::fs::symlink("real", w.root().join("alias")).unwrap();
        assert_eq!(w.read_file("alias/f").unwrap(), b"1");
        assert_eq!(w.read_file("nope").unwrap_err().code, ErrorCode::NotFound);
        let long = "n".repeat(300);
        let e = w.read_file(&long).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidOptions, "{e}");
        assert!(e.message.contains("too long"), "{e}");
        let e = w.write_file(&format!("d/{long}"), b"x").unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidOptions, "{e}");
        assert_eq!(
            w.list_files(&long).unwrap_err().code,
            ErrorCode::InvalidOptions
        );
    }

    #[test]
    fn working_directories_resolve_beneath_the_root() {
        let (_t, w) = wd();
        w.write_file("sub/dir/f", b"1").unwrap();
        let sub = w.root().join("sub/dir");
        assert_eq!(w.resolve_dir("sub/dir").unwrap(), sub);
        assert_eq!(w.resolve_dir("./sub//dir/").unwrap(), sub);
        assert_eq!(w.resolve_dir(sub.to_str().unwrap()).unwrap(), sub);
        for root in ["", ".", "/"] {
            assert_eq!(w.resolve_dir(root).unwrap(), w.root(), "{root:?}");
        }
        // A symlink that stays inside resolves to its target.
        std::os::unix::fs::symlink("sub", w.root().join("alias")).unwrap();
        assert_eq!(w.resolve_dir("alias/dir").unwrap(), sub);
        // Escapes, through a symlink or a symlinked parent, are refused.
        std::os::unix::fs::symlink("/", w.root().join("esc")).unwrap();
        std::os::unix::fs::symlink("/etc", w.root().join("etc")).unwrap();
        std::os::unix::fs::symlink("../..", w.root().join("sub/up")).unwrap();
        for p in [
            "esc",
            "esc/tmp",
            "etc",
            "sub/up",
            "sub/up/x",
            "..",
            "sub/../..",
            "/tmp",
        ] {
            let e = w.resolve_dir(p).unwrap_err();
            assert_eq!(e.code, ErrorCode::PathEscape, "{p}: {e}");
            assert!(e.message.contains(&format!("`{p}`")), "{e}");
        }
        let e = w.resolve_dir("missing").unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidOptions, "{e}");
        assert!(
            e.message.contains("`missing`") && e.message.contains("cwd"),
            "{e}"
        );
        let e = w.resolve_dir("sub/dir/f/deeper").unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidOptions, "{e}");
        let e = w.resolve_dir("sub/dir/f").unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidOptions, "{e}");
        let e = w
            .resolve_dir_as("sub/nope", "/workspace/sub/nope")
            .unwrap_err();
        assert!(e.message.contains("`/workspace/sub/nope`"), "{e}");
    }

    #[test]
    fn fifos_and_deep_trees_are_answered_not_hung_on() {
        let (_t, w) = wd();
        let fifo = w.root().join("pipe");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        assert_eq!(
            w.read_file("pipe").unwrap_err().code,
            ErrorCode::InvalidOptions
        );
        assert_eq!(
            w.write_file("pipe", b"x").unwrap_err().code,
            ErrorCode::InvalidOptions
        );
        let mut deep = String::new();
        for _ in 0..(MAX_LIST_DEPTH + 5) {
            deep.push_str("d/");
        }
        std::fs::create_dir_all(w.root().join(&deep)).unwrap();
        assert_eq!(
            w.list_files("").unwrap_err().code,
            ErrorCode::LimitsExceeded
        );
        let shallow = w.list_files("d/d").unwrap_err();
        assert_eq!(shallow.code, ErrorCode::LimitsExceeded);
        w.remove().unwrap();
    }

    #[test]
    fn clear_and_remove() {
        let (_t, w) = wd();
        w.write_file("d/e/f", b"1").unwrap();
        w.clear().unwrap();
        assert!(w.list_files("").unwrap().is_empty());
        w.write_file("d/f", b"1").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(w.root().join("d"), std::fs::Permissions::from_mode(0o000))
            .unwrap();
        w.remove().unwrap();
        assert!(!w.root().exists());
        w.remove().unwrap();
    }
}
