//! File operations in the container, for the sandbox contract's `stat`, `list_dir`,
//! `make_dir`, `rename`, `remove` and `watch`: the agent sees the container's whole
//! file system, as the sandbox's programs do.
//!
//! The host sends [`ControlMessage::Files`](crate::control::ControlMessage::Files)
//! or [`ControlMessage::Watch`](crate::control::ControlMessage::Watch) with the
//! write end of a pipe attached, and reads the answer from the pipe: one JSON
//! [`FileAnswer`] (then, for a watch, one JSON [`WireEvent`] per line as changes
//! happen). The answer travels outside the control channel, so a listing is not
//! bound by the size of a control message. A watch is inotify in the agent's
//! `poll`: it costs nothing while nothing changes. It ends when the host closes its
//! end of the pipe, when the watched directory goes, or at a reset.

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use paddock_core::{Error, ErrorCode};
use rustix::fs::inotify::{self, ReadFlags, WatchFlags};

/// Most entries a listing answers.
pub const MAX_ENTRIES: usize = 50_000;
/// Deepest a listing or a removal goes.
pub const MAX_DEPTH: u32 = 256;
/// Most directories one recursive watch follows.
const MAX_WATCHED_DIRS: usize = 8192;

/// A file operation the host asks for. Paths are absolute paths of the container.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum FileOp {
    /// `lstat` of `path`.
    Stat {
        /// The path.
        path: String,
    },
    /// The entries below directory `path`, `depth` levels down.
    List {
        /// The directory.
        path: String,
        /// Levels (1: its own entries).
        depth: u32,
    },
    /// Makes `path` and its parents.
    MakeDir {
        /// The directory.
        path: String,
    },
    /// Moves `from` to `to`, making `to`'s parents.
    Rename {
        /// What.
        from: String,
        /// Where.
        to: String,
    },
    /// Removes `path`, with everything in it.
    Remove {
        /// The path.
        path: String,
    },
}

/// One entry (what `lstat` says).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WireEntry {
    /// The absolute path.
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time: seconds since the epoch…
    pub mtime: i64,
    /// …and nanoseconds.
    pub mtime_ns: u32,
    /// A symlink's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// A file's or directory's user metadata (see `paddock_core::FileMetadata`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metadata: paddock_core::FileMetadata,
}

/// The answer to a [`FileOp`] or a watch.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileAnswer {
    /// The entries (one for `stat`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entries: Vec<WireEntry>,
    /// For `make_dir`: whether it was made.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub made: bool,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Error>,
}

/// One change a watch reports.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WireEvent {
    /// The absolute path.
    pub path: String,
    /// `create`, `write`, `remove`, `rename` or `chmod`.
    pub kind: String,
}

fn io_error(e: std::io::Error, path: &str) -> Error {
    match e.raw_os_error() {
        Some(libc::ENOENT) => Error::new(ErrorCode::NotFound, format!("`{path}` does not exist")),
        Some(libc::ENOTDIR) => Error::new(
            ErrorCode::NotFound,
            format!("`{path}`: a parent component is not a directory"),
        ),
        Some(libc::ENOTEMPTY) | Some(libc::EEXIST) => Error::invalid_options(
            "path",
            format!("`{path}`: a directory that is not empty is in the way"),
        ),
        Some(libc::EISDIR) => Error::invalid_options(
            "path",
            format!("`{path}`: a directory and a file cannot replace each other"),
        ),
        Some(libc::EINVAL) => {
            Error::invalid_options("path", format!("`{path}` cannot be moved into itself"))
        }
        Some(libc::ENAMETOOLONG) => Error::invalid_options("path", format!("`{path}` is too long")),
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) | Some(libc::EBUSY) => {
            Error::invalid_options("path", format!("`{path}`: {e}"))
        }
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => Error::new(
            ErrorCode::LimitsExceeded,
            format!("`{path}`: {e}; free space or raise the limit"),
        ),
        _ => Error::new(ErrorCode::EngineFailed, format!("`{path}`: {e}")),
    }
}

/// `path` checked: absolute, without NUL or `..`.
fn checked(path: &str) -> Result<&Path, Error> {
    let p = Path::new(path);
    if path.contains('\0') {
        return Err(Error::invalid_options("path", "must not contain NUL bytes"));
    }
    if !p.is_absolute() {
        return Err(Error::invalid_options(
            "path",
            format!("`{path}` is not absolute"),
        ));
    }
    if p.components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(Error::new(
            ErrorCode::PathEscape,
            format!("`{path}`: name the path without `..`"),
        ));
    }
    Ok(p)
}

fn entry(path: &Path, meta: &std::fs::Metadata) -> WireEntry {
    let ft = meta.file_type();
    let kind = if ft.is_symlink() {
        "symlink"
    } else if ft.is_dir() {
        "dir"
    } else if ft.is_file() {
        "file"
    } else {
        "other"
    };
    WireEntry {
        path: path.to_string_lossy().into_owned(),
        kind: kind.into(),
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        mtime: meta.mtime(),
        mtime_ns: meta.mtime_nsec() as u32,
        target: if ft.is_symlink() {
            std::fs::read_link(path)
                .ok()
                .map(|t| t.to_string_lossy().into_owned())
        } else {
            None
        },
        metadata: if ft.is_dir() || ft.is_file() {
            paddock_core::metadata::read_metadata(path, false)
        } else {
            Default::default()
        },
    }
}

/// Does `op`.
pub(crate) fn run(op: &FileOp) -> FileAnswer {
    let answer = match op {
        FileOp::Stat { path } => stat(path).map(|e| FileAnswer {
            entries: vec![e],
            ..FileAnswer::default()
        }),
        FileOp::List { path, depth } => list(path, *depth).map(|entries| FileAnswer {
            entries,
            ..FileAnswer::default()
        }),
        FileOp::MakeDir { path } => make_dir(path).map(|made| FileAnswer {
            made,
            ..FileAnswer::default()
        }),
        FileOp::Rename { from, to } => rename(from, to).map(|()| FileAnswer::default()),
        FileOp::Remove { path } => remove(path).map(|()| FileAnswer::default()),
    };
    answer.unwrap_or_else(|e| FileAnswer {
        error: Some(e),
        ..FileAnswer::default()
    })
}

fn stat(path: &str) -> Result<WireEntry, Error> {
    let p = checked(path)?;
    let meta = std::fs::symlink_metadata(p).map_err(|e| io_error(e, path))?;
    Ok(entry(p, &meta))
}

fn list(path: &str, depth: u32) -> Result<Vec<WireEntry>, Error> {
    let p = checked(path)?;
    let meta = std::fs::metadata(p).map_err(|e| io_error(e, path))?;
    if !meta.is_dir() {
        return Err(Error::invalid_options(
            "path",
            format!("`{path}` is not a directory"),
        ));
    }
    let depth = depth.clamp(1, MAX_DEPTH);
    let mut out = Vec::new();
    let mut stack = vec![(p.to_path_buf(), 1u32)];
    while let Some((dir, level)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if out.len() >= MAX_ENTRIES {
                return Err(Error::new(
                    ErrorCode::LimitsExceeded,
                    format!("`{path}` holds more than {MAX_ENTRIES} entries at this depth; list a subdirectory or a lower depth"),
                ));
            }
            let child = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&child) else {
                continue;
            };
            if meta.is_dir() && level < depth {
                stack.push((child.clone(), level + 1));
            }
            out.push(entry(&child, &meta));
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

fn make_dir(path: &str) -> Result<bool, Error> {
    let p = checked(path)?;
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => return Ok(false),
        Ok(_) => {
            return Err(Error::invalid_options(
                "path",
                format!("`{path}` exists and is not a directory"),
            ))
        }
        Err(_) => {}
    }
    std::fs::create_dir_all(p).map_err(|e| io_error(e, path))?;
    Ok(true)
}

fn rename(from: &str, to: &str) -> Result<(), Error> {
    let (f, t) = (checked(from)?, checked(to)?);
    std::fs::symlink_metadata(f).map_err(|e| io_error(e, from))?;
    if let Some(parent) = t.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io_error(e, to))?;
    }
    std::fs::rename(f, t).map_err(|e| io_error(e, from))
}

fn remove(path: &str) -> Result<(), Error> {
    let p = checked(path)?;
    if p == Path::new("/") {
        return Err(Error::invalid_options(
            "path",
            "the container's root cannot be removed",
        ));
    }
    let meta = std::fs::symlink_metadata(p).map_err(|e| io_error(e, path))?;
    if meta.is_dir() {
        std::fs::remove_dir_all(p)
    } else {
        std::fs::remove_file(p)
    }
    .map_err(|e| io_error(e, path))
}

/// Writes `answer` to `out` as one line.
pub(crate) fn answer(out: &mut std::fs::File, answer: &FileAnswer) {
    let mut line = serde_json::to_vec(answer).unwrap_or_default();
    line.push(b'\n');
    let _ = out.write_all(&line);
}

/// One watch: its inotify descriptor, the pipe its events go to, and which
/// directory each watch descriptor stands for.
#[derive(Debug)]
pub(crate) struct Watch {
    pub(crate) inotify: OwnedFd,
    pub(crate) out: std::fs::File,
    dirs: HashMap<i32, PathBuf>,
    top: i32,
    recursive: bool,
}

fn mask() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::MODIFY
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::ATTRIB
        | WatchFlags::DELETE_SELF
        | WatchFlags::ONLYDIR
        | WatchFlags::DONT_FOLLOW
}

impl Watch {
    /// Starts watching `path` (and below when `recursive`); the events go to `out`
    /// (made non-blocking: a host that does not read loses events, never stalls the
    /// agent).
    pub(crate) fn start(
        path: &str,
        recursive: bool,
        out: OwnedFd,
    ) -> Result<Watch, (Error, OwnedFd)> {
        let p = match checked(path) {
            Ok(p) => p.to_path_buf(),
            Err(e) => return Err((e, out)),
        };
        let inotify =
            match inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK) {
                Ok(fd) => fd,
                Err(e) => return Err((io_error(e.into(), path), out)),
            };
        let top = match inotify::add_watch(&inotify, p.as_path(), mask()) {
            Ok(wd) => wd,
            Err(rustix::io::Errno::NOTDIR) => {
                return Err((
                    Error::invalid_options("path", format!("`{path}` is not a directory")),
                    out,
                ))
            }
            Err(e) => return Err((io_error(e.into(), path), out)),
        };
        crate::sys::set_nonblocking(out.as_raw_fd());
        let mut w = Watch {
            inotify,
            out: std::fs::File::from(out),
            dirs: HashMap::from([(top, p.clone())]),
            top,
            recursive,
        };
        if recursive {
            w.follow(&p, false);
        }
        Ok(w)
    }

    /// Watches the directories below `dir`, reporting their entries as created when
    /// `report`.
    fn follow(&mut self, dir: &Path, report: bool) {
        let mut stack = vec![dir.to_path_buf()];
        let mut seen = 0usize;
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in entries.flatten() {
                seen += 1;
                if seen > MAX_ENTRIES {
                    return;
                }
                let child = e.path();
                if report {
                    self.send(&child, "create");
                }
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false)
                    && self.dirs.len() < MAX_WATCHED_DIRS
                {
                    if let Ok(wd) = inotify::add_watch(&self.inotify, child.as_path(), mask()) {
                        self.dirs.insert(wd, child.clone());
                        stack.push(child);
                    }
                }
            }
        }
    }

    fn send(&mut self, path: &Path, kind: &str) {
        let event = WireEvent {
            path: path.to_string_lossy().into_owned(),
            kind: kind.into(),
        };
        let mut line = serde_json::to_vec(&event).unwrap_or_default();
        line.push(b'\n');
        // A full pipe drops the event (the host reads too slowly); a line is far
        // below PIPE_BUF, so it is written whole or not at all.
        let _ = self.out.write(&line);
    }

    /// Reads what inotify has; `false` when the watch is over (the watched
    /// directory went).
    pub(crate) fn read(&mut self) -> bool {
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 8192];
        let mut batch = Vec::new();
        {
            let mut reader = inotify::Reader::new(&self.inotify, &mut buf);
            loop {
                match reader.next() {
                    Ok(e) => batch.push((
                        e.wd(),
                        e.events(),
                        e.file_name().filter(|n| !n.is_empty()).map(|n| {
                            use std::os::unix::ffi::OsStrExt;
                            PathBuf::from(std::ffi::OsStr::from_bytes(n.to_bytes()))
                        }),
                    )),
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(_) => break,
                }
            }
        }
        for (wd, flags, name) in batch {
            if flags.contains(ReadFlags::IGNORED) {
                self.dirs.remove(&wd);
                if wd == self.top {
                    return false;
                }
                continue;
            }
            let (Some(dir), Some(name)) = (self.dirs.get(&wd).cloned(), name) else {
                continue;
            };
            let path = dir.join(name);
            let is_dir = flags.contains(ReadFlags::ISDIR);
            let kind = if flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
                "create"
            } else if flags.contains(ReadFlags::MODIFY) {
                "write"
            } else if flags.contains(ReadFlags::DELETE) {
                "remove"
            } else if flags.contains(ReadFlags::MOVED_FROM) {
                "rename"
            } else if flags.contains(ReadFlags::ATTRIB) {
                "chmod"
            } else {
                continue;
            };
            if is_dir && kind == "rename" {
                let gone: Vec<i32> = self
                    .dirs
                    .iter()
                    .filter(|(w, p)| **w != self.top && p.starts_with(&path))
                    .map(|(w, _)| *w)
                    .collect();
                for w in gone {
                    self.dirs.remove(&w);
                    let _ = inotify::remove_watch(&self.inotify, w);
                }
            }
            self.send(&path, kind);
            if is_dir && kind == "create" && self.recursive && self.dirs.len() < MAX_WATCHED_DIRS {
                if let Ok(wd) = inotify::add_watch(&self.inotify, path.as_path(), mask()) {
                    self.dirs.insert(wd, path.clone());
                    self.follow(&path, true);
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_answer_entries_and_typed_errors() {
        let t = tempfile_dir();
        let root = t.to_str().unwrap().to_string();
        let a = format!("{root}/a/b");
        assert!(run(&FileOp::MakeDir { path: a.clone() }).made);
        assert!(!run(&FileOp::MakeDir { path: a.clone() }).made);
        std::fs::write(format!("{a}/f"), b"hello").unwrap();
        let s = run(&FileOp::Stat {
            path: format!("{a}/f"),
        });
        assert_eq!((s.entries[0].kind.as_str(), s.entries[0].size), ("file", 5));
        let l = run(&FileOp::List {
            path: root.clone(),
            depth: 3,
        });
        assert_eq!(l.entries.len(), 3, "{l:?}");
        let r = run(&FileOp::Rename {
            from: format!("{a}/f"),
            to: format!("{root}/m/g"),
        });
        assert!(r.error.is_none(), "{r:?}");
        let code = |a: FileAnswer| a.error.map(|e| e.code);
        assert_eq!(
            code(run(&FileOp::Stat {
                path: format!("{a}/f")
            })),
            Some(ErrorCode::NotFound)
        );
        assert_eq!(
            code(run(&FileOp::Stat {
                path: format!("{root}/../x")
            })),
            Some(ErrorCode::PathEscape)
        );
        assert_eq!(
            code(run(&FileOp::List {
                path: format!("{root}/m/g"),
                depth: 1
            })),
            Some(ErrorCode::InvalidOptions)
        );
        assert!(run(&FileOp::Remove { path: root.clone() }).error.is_none());
        assert_eq!(
            code(run(&FileOp::Remove { path: root })),
            Some(ErrorCode::NotFound)
        );
    }

    fn tempfile_dir() -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "paddock-agent-files-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        p
    }
}
