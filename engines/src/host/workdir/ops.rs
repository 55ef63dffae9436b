//! The file operations of the sandbox contract beneath the workdir: stat, listing
//! with a depth, making directories, moving and removing. Every path is resolved as
//! the whole-file operations resolve it (`RESOLVE_BENEATH` from the workdir's fd),
//! and each operation then works on a directory fd and a single name, so a program
//! that swaps a component for a symlink meanwhile cannot lead it out.

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use paddock_core::{Error, ErrorCode, FileInfo, FileKind, Result};
use rustix::fs::{AtFlags, FileType};

use super::resolve::{cpath, map_io, open_dir_fd, openat_beneath};
use super::{Workdir, MAX_LIST_DEPTH, MAX_LIST_ENTRIES};

impl Workdir {
    /// What `lstat` says of `path` (see [`Sandbox::stat`]).
    ///
    /// [`Sandbox::stat`]: paddock_core::Sandbox::stat
    pub fn stat(&self, path: &str) -> Result<FileInfo> {
        let rel = self.relative_strict(path)?;
        let Some(name) = rel.file_name() else {
            let root = open_dir_fd(self.fd.as_raw_fd(), c".").map_err(|e| map_io(e, path))?;
            return self.info(&root, c"", rel.clone(), path);
        };
        let parent = self.parent_fd(&rel, path)?;
        self.info(&parent, &cpath(Path::new(name))?, rel.clone(), path)
    }

    /// The entries below directory `path`, `depth` levels down (see
    /// [`Sandbox::list_dir`]); at most [`MAX_LIST_ENTRIES`], and never deeper than
    /// [`MAX_LIST_DEPTH`].
    ///
    /// [`Sandbox::list_dir`]: paddock_core::Sandbox::list_dir
    pub fn list_dir(&self, path: &str, depth: u32) -> Result<Vec<FileInfo>> {
        let rel = self.relative_strict(path)?;
        let top = openat_beneath(
            self.fd.as_raw_fd(),
            &cpath(&rel)?,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            0,
        )
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOTDIR) if self.stat(path).is_ok() => {
                Error::invalid_options("path", format!("`{path}` is not a directory"))
            }
            _ => map_io(e, path),
        })?;
        let depth = (depth.max(1) as usize).min(MAX_LIST_DEPTH);
        let mut out = Vec::new();
        // Depth first, one fd per level held: each directory is opened from its
        // parent's fd by a single name, without following a symlink.
        let mut stack: Vec<(OwnedFd, PathBuf, usize)> = vec![(top, rel, 1)];
        while let Some((dir, dir_rel, level)) = stack.pop() {
            let entries = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))
                .map_err(|e| map_io(e, path))?;
            for entry in entries {
                let entry = entry.map_err(|e| map_io(e, path))?;
                if out.len() >= MAX_LIST_ENTRIES {
                    return Err(Error::new(
                        ErrorCode::LimitsExceeded,
                        format!("`{path}` holds more than {MAX_LIST_ENTRIES} entries at this depth; list a subdirectory or a lower depth"),
                    ));
                }
                let name = cpath(Path::new(&entry.file_name()))?;
                let child_rel = dir_rel.join(entry.file_name());
                let info = match self.info(&dir, &name, child_rel.clone(), path) {
                    Ok(info) => info,
                    // Gone while we listed: not listed.
                    Err(e) if e.code == ErrorCode::NotFound => continue,
                    Err(e) => return Err(e),
                };
                let is_dir = info.kind == FileKind::Directory;
                out.push(info);
                if is_dir && level < depth {
                    // Removed or replaced meanwhile, or unreadable: its entry stays,
                    // its contents are not listed.
                    if let Ok(fd) = openat_beneath(
                        dir.as_raw_fd(),
                        &name,
                        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                        0,
                    ) {
                        stack.push((fd, child_rel, level + 1));
                    }
                }
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Makes directory `path` and its missing parents (see [`Sandbox::make_dir`]).
    ///
    /// [`Sandbox::make_dir`]: paddock_core::Sandbox::make_dir
    pub fn make_dir(&self, path: &str) -> Result<bool> {
        let rel = self.relative_strict(path)?;
        match self.stat(path) {
            Ok(info) if info.kind == FileKind::Directory => return Ok(false),
            Ok(_) => {
                return Err(Error::invalid_options(
                    "path",
                    format!("`{path}` exists and is not a directory"),
                ))
            }
            Err(e) if e.code == ErrorCode::NotFound => {}
            Err(e) => return Err(e),
        }
        self.mkdirs(&rel, path)?;
        Ok(true)
    }

    /// Moves `from` to `to`, making `to`'s missing parents (see
    /// [`Sandbox::rename`]).
    ///
    /// [`Sandbox::rename`]: paddock_core::Sandbox::rename
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        let (rel_from, rel_to) = (self.relative_strict(from)?, self.relative_strict(to)?);
        let (Some(from_name), Some(to_name)) = (rel_from.file_name(), rel_to.file_name()) else {
            return Err(Error::invalid_options(
                "path",
                "the sandbox's root itself cannot be moved, nor replaced",
            ));
        };
        let from_parent = self.parent_fd(&rel_from, from)?;
        let from_name = cpath(Path::new(from_name))?;
        rustix::fs::statat(
            &from_parent,
            from_name.as_c_str(),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| map_io(e.into(), from))?;
        let to_parent = self.mkdirs(rel_to.parent().unwrap_or(Path::new("")), to)?;
        let to_name = cpath(Path::new(to_name))?;
        rustix::fs::renameat(
            &from_parent,
            from_name.as_c_str(),
            &to_parent,
            to_name.as_c_str(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::NOTEMPTY | rustix::io::Errno::EXIST => {
                Error::invalid_options("path", format!("`{to}` is a directory that is not empty"))
            }
            rustix::io::Errno::ISDIR | rustix::io::Errno::NOTDIR => Error::invalid_options(
                "path",
                format!("`{from}` and `{to}`: a directory and a file cannot replace each other"),
            ),
            rustix::io::Errno::INVAL => Error::invalid_options(
                "path",
                format!("`{from}` cannot be moved into itself (`{to}`)"),
            ),
            e => map_io(e.into(), from),
        })
    }

    /// Removes `path`, a directory with everything in it (see
    /// [`Sandbox::remove`]).
    ///
    /// [`Sandbox::remove`]: paddock_core::Sandbox::remove
    pub fn remove_path(&self, path: &str) -> Result<()> {
        let rel = self.relative_strict(path)?;
        let Some(name) = rel.file_name() else {
            return Err(Error::invalid_options(
                "path",
                "the sandbox's root itself cannot be removed; remove what is in it",
            ));
        };
        let parent = self.parent_fd(&rel, path)?;
        let name = cpath(Path::new(name))?;
        let st = rustix::fs::statat(&parent, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| map_io(e.into(), path))?;
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            let dir = openat_beneath(
                parent.as_raw_fd(),
                &name,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0,
            )
            .map_err(|e| map_io(e, path))?;
            empty_dir(&dir, 0, path)?;
            rustix::fs::unlinkat(&parent, name.as_c_str(), AtFlags::REMOVEDIR)
        } else {
            rustix::fs::unlinkat(&parent, name.as_c_str(), AtFlags::empty())
        }
        .map_err(|e| map_io(e.into(), path))
    }

    /// An fd of the directory that holds `rel` (which names something below the
    /// root), resolved beneath the root.
    fn parent_fd(&self, rel: &Path, arg: &str) -> Result<OwnedFd> {
        let parent = rel.parent().unwrap_or(Path::new(""));
        openat_beneath(
            self.fd.as_raw_fd(),
            &cpath(parent)?,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            0,
        )
        .map_err(|e| map_io(e, arg))
    }

    /// The entry `name` of directory `dir` (`""`: `dir` itself), without following
    /// a symlink there; `rel` is its path below the root.
    fn info(&self, dir: &OwnedFd, name: &CStr, rel: PathBuf, arg: &str) -> Result<FileInfo> {
        let flags = if name.is_empty() {
            AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW
        } else {
            AtFlags::SYMLINK_NOFOLLOW
        };
        let st = rustix::fs::statat(dir.as_fd(), name, flags).map_err(|e| map_io(e.into(), arg))?;
        let target = if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
            rustix::fs::readlinkat(dir.as_fd(), name, Vec::new())
                .ok()
                .map(|t| t.to_string_lossy().into_owned())
        } else {
            None
        };
        let mut info = file_info(
            self.shown.join(&rel).to_string_lossy().into_owned(),
            &st,
            target,
        );
        // Most files have no attributes: one system call says so, and only a file
        // with some is read (through the directory's fd, `name` not followed).
        if matches!(info.kind, FileKind::File | FileKind::Directory)
            && crate::host::sys::xattr_names_len(dir.as_fd(), name) != Some(0)
        {
            let at = fd_path(dir, name);
            info.metadata = paddock_core::metadata::read_metadata(&at, name.is_empty());
        }
        Ok(info)
    }

    /// Replaces the user metadata of `path` (see [`Sandbox::set_metadata`]).
    ///
    /// [`Sandbox::set_metadata`]: paddock_core::Sandbox::set_metadata
    pub fn set_metadata(&self, path: &str, metadata: &paddock_core::FileMetadata) -> Result<()> {
        paddock_core::check_metadata("metadata", metadata)?;
        let rel = self.relative_strict(path)?;
        let (dir, name) = match rel.file_name() {
            Some(name) => (self.parent_fd(&rel, path)?, cpath(Path::new(name))?),
            None => (
                open_dir_fd(self.fd.as_raw_fd(), c".").map_err(|e| map_io(e, path))?,
                c"".to_owned(),
            ),
        };
        let at = fd_path(&dir, &name);
        paddock_core::metadata::replace_metadata(&at, name.is_empty(), metadata).map_err(|e| {
            // The message names the sandbox's path, not the host's.
            let shown = self.shown.join(&rel).to_string_lossy().into_owned();
            Error::new(
                e.code,
                e.message
                    .replace(&at.to_string_lossy().into_owned(), &shown),
            )
        })
    }
}

/// The path of entry `name` of the directory open as `dir` (the directory itself
/// for an empty name), through `/proc/self/fd`: resolved from the fd, so that no
/// component above `name` is looked up again.
fn fd_path(dir: &OwnedFd, name: &CStr) -> PathBuf {
    let base = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    if name.is_empty() {
        base
    } else {
        base.join(std::ffi::OsStr::from_bytes(name.to_bytes()))
    }
}

/// The [`FileInfo`] of what `lstat` answered for `path`.
pub fn file_info(path: String, st: &rustix::fs::Stat, symlink_target: Option<String>) -> FileInfo {
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => FileKind::File,
        FileType::Directory => FileKind::Directory,
        FileType::Symlink => FileKind::Symlink,
        _ => FileKind::Other,
    };
    FileInfo {
        path,
        kind,
        size: st.st_size as u64,
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        #[allow(clippy::unnecessary_cast)] // `i64` on 64-bit targets, not on all
        modified: modified(st.st_mtime as i64, st.st_mtime_nsec as u32),
        symlink_target: if kind == FileKind::Symlink {
            symlink_target
        } else {
            None
        },
        metadata: Default::default(),
    }
}

fn modified(secs: i64, nanos: u32) -> SystemTime {
    if secs >= 0 {
        SystemTime::UNIX_EPOCH + Duration::new(secs as u64, nanos)
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
            + Duration::from_nanos(nanos as u64)
    }
}

/// Removes everything in `dir`, through fds only: each subdirectory is opened by a
/// single name without following a symlink, so nothing outside is touched.
fn empty_dir(dir: &OwnedFd, level: usize, arg: &str) -> Result<()> {
    if level > MAX_LIST_DEPTH {
        return Err(Error::new(
            ErrorCode::LimitsExceeded,
            format!("`{arg}` is nested deeper than {MAX_LIST_DEPTH} levels; remove its deepest parts first"),
        ));
    }
    let entries = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))
        .map_err(|e| map_io(e, arg))?;
    for entry in entries {
        let entry = entry.map_err(|e| map_io(e, arg))?;
        let name = cpath(Path::new(&entry.file_name()))?;
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        let r = if is_dir {
            let sub = openat_beneath(
                dir.as_raw_fd(),
                &name,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0,
            )
            .map_err(|e| map_io(e, arg))?;
            empty_dir(&sub, level + 1, arg)?;
            rustix::fs::unlinkat(dir, name.as_c_str(), AtFlags::REMOVEDIR)
        } else {
            rustix::fs::unlinkat(dir, name.as_c_str(), AtFlags::empty())
        };
        match r {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(map_io(e.into(), arg)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::test_workdir as wd;
    use super::*;

    #[test]
    fn metadata_is_set_replaced_listed_and_kept_through_a_rename() {
        let (_t, w) = wd();
        w.write_file("d/f", b"x").unwrap();
        let meta: paddock_core::FileMetadata = [("author".to_string(), "mish".to_string())].into();
        if let Err(e) = w.set_metadata("d/f", &meta) {
            // The temp dir's file system keeps no user attributes: nothing to check.
            assert!(e.message.contains("no extended attributes"), "{e}");
            eprintln!("skipped: {e}");
            return;
        }
        assert_eq!(w.stat("d/f").unwrap().metadata, meta);
        let listed = w.list_dir("d", 1).unwrap();
        assert_eq!(listed[0].metadata, meta);
        w.rename("d/f", "d/g").unwrap();
        assert_eq!(w.stat("d/g").unwrap().metadata, meta);
        // A directory, the root included, carries metadata too.
        w.set_metadata("d", &meta).unwrap();
        assert_eq!(w.stat("d").unwrap().metadata, meta);
        w.set_metadata("", &meta).unwrap();
        assert_eq!(w.stat("").unwrap().metadata, meta);
        // Replaced by an empty map: cleared.
        w.set_metadata("d/g", &Default::default()).unwrap();
        assert!(w.stat("d/g").unwrap().metadata.is_empty());
        // A missing path, a path outside, and bad metadata are refused.
        assert_eq!(
            w.set_metadata("d/missing", &meta).unwrap_err().code,
            ErrorCode::NotFound
        );
        assert_eq!(
            w.set_metadata("../x", &meta).unwrap_err().code,
            ErrorCode::PathEscape
        );
        let bad: paddock_core::FileMetadata = [("k".to_string(), "v\n".to_string())].into();
        assert_eq!(
            w.set_metadata("d/g", &bad).unwrap_err().code,
            ErrorCode::InvalidOptions
        );
        // A symlink cannot carry any, and its error names the sandbox's path.
        std::os::unix::fs::symlink("g", w.root().join("d/l")).unwrap();
        let e = w.set_metadata("d/l", &meta).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidOptions, "{e}");
        assert!(!e.message.contains("/proc/self/fd"), "{e}");
    }

    #[test]
    fn stat_list_make_move_remove() {
        let (_t, w) = wd();
        w.write_file("a/b/c.txt", b"hello").unwrap();
        let root = w.root().to_string_lossy().into_owned();
        let c = w.stat("a/b/c.txt").unwrap();
        assert_eq!(c.kind, FileKind::File);
        assert_eq!(c.size, 5);
        assert_eq!(c.path, format!("{root}/a/b/c.txt"));
        assert_eq!(c.name(), "c.txt");
        assert_eq!(c.mode & 0o700, 0o600, "{c:?}");
        assert_eq!(w.stat("").unwrap().kind, FileKind::Directory);
        assert_eq!(w.stat("nope").unwrap_err().code, ErrorCode::NotFound);
        std::os::unix::fs::symlink("/etc", w.root().join("out")).unwrap();
        let l = w.stat("out").unwrap();
        assert_eq!(l.kind, FileKind::Symlink);
        assert_eq!(l.symlink_target.as_deref(), Some("/etc"));

        let one: Vec<String> = w
            .list_dir("", 1)
            .unwrap()
            .into_iter()
            .map(|e| e.name().to_string())
            .collect();
        assert_eq!(one, ["a", "out"]);
        let two = w.list_dir(".", 3).unwrap();
        assert_eq!(w.list_dir("/", 1).unwrap_err().code, ErrorCode::PathEscape);
        assert_eq!(two.len(), 4, "{two:?}");
        assert_eq!(
            w.list_dir("missing", 1).unwrap_err().code,
            ErrorCode::NotFound
        );
        assert_eq!(
            w.list_dir("a/b/c.txt", 1).unwrap_err().code,
            ErrorCode::InvalidOptions
        );
        assert_eq!(
            w.list_dir("out", 1).unwrap_err().code,
            ErrorCode::PathEscape
        );

        assert!(w.make_dir("x/y/z").unwrap());
        assert!(!w.make_dir("x/y/z").unwrap());
        assert_eq!(
            w.make_dir("a/b/c.txt").unwrap_err().code,
            ErrorCode::InvalidOptions
        );
        assert_eq!(w.make_dir("out/x").unwrap_err().code, ErrorCode::PathEscape);

        w.rename("a/b/c.txt", "m/n/c2.txt").unwrap();
        assert_eq!(w.read_file("m/n/c2.txt").unwrap(), b"hello");
        assert_eq!(w.stat("a/b/c.txt").unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(
            w.rename("a/b/c.txt", "q").unwrap_err().code,
            ErrorCode::NotFound
        );
        assert_eq!(
            w.rename("m/n/c2.txt", "../q").unwrap_err().code,
            ErrorCode::PathEscape
        );
        assert_eq!(
            w.rename("m", "out/m").unwrap_err().code,
            ErrorCode::PathEscape
        );

        // A removed tree goes with everything in it, a symlink in it as itself.
        std::os::unix::fs::symlink(w.root().join("m"), w.root().join("x/link")).unwrap();
        w.remove_path("x").unwrap();
        assert_eq!(w.stat("x").unwrap_err().code, ErrorCode::NotFound);
        assert!(w.stat("m/n/c2.txt").is_ok());
        w.remove_path("out").unwrap();
        assert!(std::path::Path::new("/etc").exists());
        assert_eq!(w.remove_path("out").unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(
            w.remove_path("").unwrap_err().code,
            ErrorCode::InvalidOptions
        );
        assert_eq!(
            w.remove_path("../x").unwrap_err().code,
            ErrorCode::PathEscape
        );
    }
}
