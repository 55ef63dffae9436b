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

mod disk;
mod files;
mod listing;
mod ops;
mod resolve;
mod stream;
mod watch;

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use super::volume::{Disks, Quota, Volume};
pub use ops::file_info;
use resolve::open_dir_path;

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
    /// What stops each watch of the workdir (see `watch.rs`): dropped to end them.
    watches: parking_lot::Mutex<Vec<tokio::sync::oneshot::Sender<()>>>,
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
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(ROOT_MODE))?;
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
            watches: Default::default(),
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

    /// Deletes everything inside the workdir, keeping the directory itself, and
    /// puts the directory back as it was made: its mode (0700) and no extended
    /// attributes (nor ACLs). A program that owns the root could otherwise leave a
    /// mark on it for the next lease, which may be another tenant's.
    pub fn clear(&self) -> io::Result<()> {
        self.end_watches();
        for entry in std::fs::read_dir(&self.root)? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                remove_tree(&path)?;
            } else {
                std::fs::remove_file(&path)?;
            }
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&self.root, std::fs::Permissions::from_mode(ROOT_MODE))?;
        clear_xattrs(&self.root)
    }

    /// Removes the workdir and everything in it; its own filesystem is unmounted
    /// and its image deleted.
    pub fn remove(&self) -> io::Result<()> {
        self.end_watches();
        if let Some(v) = &self.volume {
            v.unmount()?;
        }
        match remove_tree(&self.root) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

/// The mode of a workdir's root: private to its owner.
const ROOT_MODE: u32 = 0o700;

/// Removes every extended attribute of `path` itself (`user.*`, POSIX ACLs, …);
/// fails if one stays.
fn clear_xattrs(path: &Path) -> io::Result<()> {
    let mut names = vec![0u8; 4096];
    let n = loop {
        match rustix::fs::llistxattr(path, &mut names[..]) {
            Ok(n) => break n,
            Err(rustix::io::Errno::RANGE) if names.len() < 1 << 20 => {
                names.resize(names.len() * 4, 0)
            }
            Err(rustix::io::Errno::NOTSUP) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    };
    for name in names[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = std::ffi::CString::new(name).expect("split at NUL");
        match rustix::fs::lremovexattr(path, name.as_c_str()) {
            Ok(()) | Err(rustix::io::Errno::NODATA) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
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

/// A fresh workdir in a temporary directory, for the tests of this module's files.
#[cfg(test)]
pub(super) fn test_workdir() -> (tempfile::TempDir, Workdir) {
    let t = tempfile::tempdir().unwrap();
    let w = Workdir::create(t.path(), "sb").unwrap();
    (t, w)
}

#[cfg(test)]
mod tests {
    use super::test_workdir as wd;

    #[test]
    fn disk_usage_adds_up_a_workdir_without_a_quota() {
        let (_t, w) = wd();
        let (empty, total) = w.disk_usage();
        assert!(total > 0);
        w.write_file("d/big", &vec![7u8; 1 << 20]).unwrap();
        let (used, _) = w.disk_usage();
        assert!(used >= empty + (1 << 20), "{empty} then {used}");
    }

    #[test]
    fn clear_and_remove() {
        let (_t, w) = wd();
        w.write_file("d/e/f", b"1").unwrap();
        w.clear().unwrap();
        assert!(w.list_files("").unwrap().is_empty());
        // A mark on the root itself (its mode, an extended attribute) is gone too.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(w.root(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let marked = rustix::fs::lsetxattr(
            w.root(),
            "user.mark",
            b"left",
            rustix::fs::XattrFlags::empty(),
        );
        w.clear().unwrap();
        let mode = std::fs::metadata(w.root()).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o700);
        if marked.is_ok() {
            let mut names = [0u8; 256];
            let n = rustix::fs::llistxattr(w.root(), &mut names[..]).unwrap();
            assert_eq!(n, 0, "{:?}", String::from_utf8_lossy(&names[..n]));
        }
        w.write_file("d/f", b"1").unwrap();
        std::fs::set_permissions(w.root().join("d"), std::fs::Permissions::from_mode(0o000))
            .unwrap();
        w.remove().unwrap();
        assert!(!w.root().exists());
        w.remove().unwrap();
    }
}
