//! Path resolution beneath the workdir: a caller's path made relative to the root
//! (lexically), then opened by the kernel with `openat2(RESOLVE_BENEATH)`, and the
//! errors of a path that is refused or fails.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Component, Path, PathBuf};

use paddock_core::{Error, ErrorCode, Result};

use super::Workdir;

impl Workdir {
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

    /// [`relative`](Workdir::relative) for the file operations (stat, listing,
    /// making, moving, removing, watching): an absolute path must be the root as
    /// programs see it or lie under it, so `/` names the file system's root, not the
    /// workdir, and is refused unless programs see the workdir there.
    pub fn relative_strict(&self, path: &str) -> Result<PathBuf> {
        let p = Path::new(path);
        if p.is_absolute() && !p.starts_with(&self.shown) {
            return Err(escape(path));
        }
        self.relative(path)
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
}

fn escape(path: &str) -> Error {
    Error::new(
        ErrorCode::PathEscape,
        format!("`{path}` leads outside the sandbox workdir; use a relative path inside it without `..` or escaping symlinks"),
    )
}

pub(super) fn map_io(e: io::Error, path: &str) -> Error {
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

pub(super) fn cpath(p: &Path) -> Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = if p.as_os_str().is_empty() {
        b"."
    } else {
        p.as_os_str().as_bytes()
    };
    CString::new(bytes).map_err(|_| Error::invalid_options("path", "must not contain NUL bytes"))
}

pub(super) fn open_dir_path(p: &Path) -> io::Result<OwnedFd> {
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

pub(super) fn open_dir_fd(dir: RawFd, name: &std::ffi::CStr) -> io::Result<OwnedFd> {
    openat_beneath(
        dir,
        name,
        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        0,
    )
}

/// `openat2(dir, path, flags, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`.
pub(super) fn openat_beneath(
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

    use super::super::test_workdir as wd;

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
}
