//! Whole-file operations beneath the workdir: writing (creating parent
//! directories, never following a symlink at the name), reading, opening and
//! checking for a path, with anything but a regular file refused.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use paddock_core::{Error, ErrorCode, Result};

use super::resolve::{cpath, map_io, open_dir_fd, openat_beneath};
use super::{Workdir, MAX_READ_BYTES};

impl Workdir {
    /// Writes `data` to `path`, creating parent directories.
    pub fn write_file(&self, path: &str, data: &[u8]) -> Result<()> {
        let mut new = self.create_file(path)?;
        new.file.write_all(data).map_err(|e| map_io(e, path))?;
        Ok(())
    }

    /// Creates (or truncates) the regular file at `path` for writing, creating
    /// parent directories; a symlink at `path` is refused, never followed.
    pub(super) fn create_file(&self, path: &str) -> Result<NewFile> {
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

    /// Creates every directory of `rel` below the root, and returns an fd of the last.
    pub(super) fn mkdirs(&self, rel: &Path, arg: &str) -> Result<OwnedFd> {
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
}

/// A file [`Workdir::create_file`] made, with the directory and name it has there.
pub(super) struct NewFile {
    parent: OwnedFd,
    name: CString,
    pub(super) file: File,
}

impl NewFile {
    /// Empties the file and removes its name from its directory, if the name still
    /// leads to this file (a program may have put something else there meanwhile;
    /// that stays).
    pub(super) fn discard(self) {
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

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::MAX_LIST_DEPTH;

    use super::super::test_workdir as wd;

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
}
