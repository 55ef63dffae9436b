//! User namespaces: the host id range each sandbox's containers map uid and gid 0
//! to 65535 onto.
//!
//! One range per sandbox, not one per engine: processes of two sandboxes are then
//! different users to the host kernel, so the limits the kernel keeps per user (the
//! pipe buffers of `pipe-user-pages-soft`, inotify instances and watches, POSIX
//! message queues, user namespaces, the keyring) are not shared between tenants, and
//! a process that got out of its namespaces would still own nothing of another
//! sandbox. The ranges are slots of [`USERNS_IDS_PER_SANDBOX`] ids from
//! `container.userns_first_id`. A slot is held by an exclusive `flock` on a file of
//! its own in a directory only root can enter (`/run/paddock-userns`), so that every
//! Paddock process of the host (which all start from the same first id unless
//! configured apart) takes a
//! different one, and a process that dies frees its slots with its descriptors:
//! nothing is left to sweep.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use paddock_core::{Error, ErrorCode, Result};

use crate::USERNS_IDS_PER_SANDBOX;

/// The directory of the slots' lock files, below [`lock_parent`].
const LOCK_DIR: &str = "paddock-userns";

/// Where the slots' lock directory lives: `/run` (one place for every Paddock
/// process of the host, whatever their `container.workdir_root`), else the temp dir.
pub(crate) fn lock_parent() -> PathBuf {
    let run = Path::new("/run");
    if run.is_dir() {
        run.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// The first directory of `path` and its ancestors that other users cannot pass
/// through (no `x` bit for others), or `None` when the whole path is traversable.
/// A container's root in a user namespace is another host user: the runtime, acting
/// as it, must pass through every ancestor of the bundle, root filesystem and
/// workdirs.
pub(crate) fn closed_ancestor(path: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    // The directories really passed through: a symlink's target's, not its own.
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut p = Some(real.as_path());
    while let Some(dir) = p {
        if let Ok(m) = std::fs::metadata(dir) {
            if m.permissions().mode() & 0o001 == 0 {
                return Some(dir.to_path_buf());
            }
        }
        p = dir.parent();
    }
    None
}

/// Where the engine keeps its directory when `container.workdir_root` is unset:
/// the temp dir when the containers' users can pass through it, else the first of
/// `/var/tmp` and `/tmp` they can (a private `TMPDIR`, mode 0700, as `mktemp -d` or
/// a service manager gives, must not turn containers off). `Err` names the closed
/// directory when none can.
pub(crate) fn engine_parent(temp: &Path) -> std::result::Result<PathBuf, String> {
    let Some(closed) = closed_ancestor(temp) else {
        return Ok(temp.to_path_buf());
    };
    for other in ["/var/tmp", "/tmp"] {
        let other = Path::new(other);
        if other.is_dir() && closed_ancestor(other).is_none() {
            tracing::info!(
                temp = %temp.display(),
                closed = %closed.display(),
                instead = %other.display(),
                "the temp dir is closed to other users (the containers' mapped root among them); the container engine keeps its directory in another"
            );
            return Ok(other.to_path_buf());
        }
    }
    Err(format!(
        "`{}` is closed to other users (mode without o+x), and the containers' mapped root must pass through it; set container.workdir_root to a directory whose every ancestor has o+x, or TMPDIR to one",
        closed.display()
    ))
}

/// The slots an engine allocates from.
#[derive(Debug)]
pub(crate) struct IdRanges {
    first: u32,
    slots: u32,
    dir: PathBuf,
    /// Where the next search starts (so that a freed slot is not taken again at
    /// once, and a search does not retry the held ones first).
    next: AtomicU32,
}

/// One sandbox's range of host ids, held until dropped.
#[derive(Debug)]
pub(crate) struct IdRange {
    /// The host id of uid (and gid) 0 inside.
    pub(crate) first: u32,
    /// How many ids are mapped.
    pub(crate) size: u32,
    /// The locked file that holds the slot.
    _lock: File,
}

impl IdRanges {
    /// The slots `first`, `first + 65536`, … (`slots` of them), locked in a
    /// directory below `parent` (made, private, when missing).
    pub(crate) fn new(parent: &Path, first: u32, slots: u32) -> std::io::Result<Arc<IdRanges>> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        let dir = parent.join(LOCK_DIR);
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        // Only a real directory of ours: in a shared temp dir anyone could have made
        // one (or a symlink) with this name to take the slots away.
        let m = std::fs::symlink_metadata(&dir)?;
        if !m.file_type().is_dir() || m.uid() != crate::host::sys::effective_uid() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "`{}` is not a directory of this user; remove it",
                    dir.display()
                ),
            ));
        }
        Ok(Arc::new(IdRanges {
            first,
            slots,
            dir,
            next: AtomicU32::new(std::process::id() % slots.max(1)),
        }))
    }

    /// A free range, locked; `POOL_EXHAUSTED` when every slot is held.
    pub(crate) fn allocate(&self) -> Result<IdRange> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..self.slots {
            let slot = (start.wrapping_add(i)) % self.slots;
            let path = self.dir.join(format!("slot-{slot}"));
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(|e| Error::engine_io("opening a user-namespace slot's lock", e))?;
            match file.try_lock() {
                Ok(()) => {
                    self.next.store(slot.wrapping_add(1), Ordering::Relaxed);
                    return Ok(IdRange {
                        first: self.first + slot * USERNS_IDS_PER_SANDBOX,
                        size: USERNS_IDS_PER_SANDBOX,
                        _lock: file,
                    });
                }
                Err(std::fs::TryLockError::WouldBlock) => continue,
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(Error::engine_io("locking a user-namespace slot", e))
                }
            }
        }
        Err(Error::new(
            ErrorCode::PoolExhausted,
            format!(
                "all {} user-namespace id ranges (container.userns_slots) are held by open sandboxes on this host; close some, or raise container.userns_slots",
                self.slots
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_temp_dir_is_found_and_passed_over() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("private");
        let inner = private.join("inner");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(closed_ancestor(&inner), Some(private.clone()));
        assert_eq!(
            closed_ancestor(dir.path()),
            closed_ancestor(dir.path().parent().unwrap())
        );
        let chosen = engine_parent(&inner).unwrap();
        assert_ne!(chosen, inner);
        assert_eq!(closed_ancestor(&chosen), None, "{}", chosen.display());
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o711)).unwrap();
        assert_eq!(closed_ancestor(&inner), closed_ancestor(dir.path()));
    }

    #[test]
    fn ranges_are_disjoint_while_held_and_free_again_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let ranges = IdRanges::new(dir.path(), 3_000_000_000, 3).unwrap();
        let a = ranges.allocate().unwrap();
        let b = ranges.allocate().unwrap();
        let c = ranges.allocate().unwrap();
        let mut firsts = vec![a.first, b.first, c.first];
        firsts.sort();
        assert_eq!(
            firsts,
            [3_000_000_000, 3_000_065_536, 3_000_131_072],
            "three slots, 65536 ids apart"
        );
        assert_eq!(a.size, USERNS_IDS_PER_SANDBOX);
        // A second allocator (another Paddock process) sees the slots held.
        let other = IdRanges::new(dir.path(), 3_000_000_000, 3).unwrap();
        let e = other.allocate().unwrap_err();
        assert_eq!(e.code, ErrorCode::PoolExhausted, "{e}");
        assert!(e.message.contains("container.userns_slots"), "{e}");
        let freed = b.first;
        drop(b);
        assert_eq!(other.allocate().unwrap().first, freed);
    }

    #[test]
    fn a_lock_directory_of_someone_else_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/", dir.path().join(LOCK_DIR)).unwrap();
        assert!(IdRanges::new(dir.path(), 3_000_000_000, 1).is_err());
    }
}
