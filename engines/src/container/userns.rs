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

use paddock_core::{Error, ErrorCode, Result, USERNS_IDS_PER_SANDBOX};

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
