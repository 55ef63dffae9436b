//! A sandbox's own filesystem, which is its disk quota (`limits.disk_bytes` and
//! `limits.disk_files`).
//!
//! Each sandbox's workdir is the mount point of a filesystem made for it, so a write
//! past the quota fails in the program with `ENOSPC` at the kernel's filesystem
//! boundary (no polling), and the host's free space is not touched beyond it. Two
//! backends, chosen when the engine starts, by trying them:
//! - **`loop`** (preferred): a sparse ext4 image per sandbox, loop-mounted. It is
//!   disk-backed, and the image grows only as the program writes. A formatted
//!   template per size is kept, and a sandbox's image is a sparse copy of it, so
//!   `mkfs` runs once per size, not once per sandbox.
//! - **`tmpfs`**, where loop devices cannot be used (no `/dev/loop-control`, no
//!   `mkfs.ext4`): a tmpfs with `size=` and `nr_inodes=`. It is memory-backed, so the
//!   quota's bytes are RAM and count against the writer's memory cgroup.
//!
//! Both need `CAP_SYS_ADMIN` (root); without it no backend is available, and the
//! engines say so by not listing `disk_bytes` and `disk_files` in their
//! capabilities.
//!
//! Every mount is tagged with its owner (`paddock-disk-<pid>-<n>-ns<inode>`, in the
//! image's path or the tmpfs source), so a later Paddock process unmounts what a
//! crashed one left behind.

// mount(2), umount2(2), the loop-device ioctls, statvfs(3) and lseek(2) with
// SEEK_DATA / SEEK_HOLE are `unsafe` to call; they are made here, behind safe
// methods.
#![allow(unsafe_code)]

mod disks;
mod loopdev;
mod mkfs;
mod mount;
mod mountinfo;

pub use disks::Disks;
pub use mountinfo::own_mounts;

pub(crate) use mountinfo::{
    detach_copied_volumes, detach_copied_volumes_except, sweep_stale_mounts,
};

use std::io;
use std::path::PathBuf;

use paddock_core::LimitKind;

use mount::{cstring, statvfs};

/// The size and file count of one sandbox's filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Bytes the filesystem holds (its metadata takes a little of them).
    pub bytes: u64,
    /// Files and directories it holds, at most.
    pub files: u64,
}

impl Quota {
    /// The quota of `limits` (merged with the defaults), if both are set.
    pub fn of(limits: &paddock_core::Limits) -> Option<Quota> {
        Some(Quota {
            bytes: limits.disk_bytes?,
            files: limits.disk_files?,
        })
    }

    /// The files an ext4 image of this size holds: the file cap, but no more than
    /// one per 4 KiB (an inode table larger than that would eat the space it
    /// serves; each non-empty file takes a block anyway), and at least 16.
    pub fn ext4_files(&self) -> u64 {
        self.files.min(self.bytes / 4096).max(16)
    }
}

/// The error of a failed sandbox workdir creation: a disk larger than the host's
/// filesystem can hold as one file (`EFBIG`) is the request's to fix
/// (`INVALID_OPTIONS` naming `limits.disk_bytes`); anything else is the engine's.
/// The full error, with its host paths, is logged; the caller's names only the kind
/// of failure.
pub fn workdir_error(e: io::Error) -> paddock_core::Error {
    tracing::warn!(error = %e, "making a sandbox workdir failed");
    if e.raw_os_error() == Some(libc::EFBIG) || e.kind() == io::ErrorKind::FileTooLarge {
        return paddock_core::Error::invalid_options(
            "limits.disk_bytes",
            "is larger than this host's filesystem can hold as one image; ask for a smaller disk",
        );
    }
    let kind = e.kind();
    let shown = match e.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::from(kind),
    };
    paddock_core::Error::engine_io(
        "creating the sandbox workdir (the server's log has the details)",
        shown,
    )
}

/// One sandbox's mounted filesystem.
#[derive(Debug)]
pub struct Volume {
    at: PathBuf,
    image: Option<PathBuf>,
    quota: Quota,
}

/// How full a [`Volume`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fill {
    /// Bytes still free for the program.
    pub free_bytes: u64,
    /// Files it may still create.
    pub free_files: u64,
    /// The filesystem's block size.
    pub block_size: u64,
}

impl Fill {
    /// The limit of a filesystem of `quota` that is used up, if one is: `disk` when
    /// less than 1 MiB (or a quarter of a smaller quota) is left, `disk_files` when
    /// no file can be created. The margin is the kernel's: ext4 refuses a write
    /// larger than the space left as a whole, so a program writing 1 MiB at a time
    /// stops with up to that much unused.
    pub fn exhausted(&self, quota: Quota) -> Option<LimitKind> {
        let margin = (1u64 << 20).min(quota.bytes / 4) + 4 * self.block_size.max(1024);
        if self.free_bytes < margin {
            Some(LimitKind::Disk)
        } else if self.free_files == 0 {
            Some(LimitKind::DiskFiles)
        } else {
            None
        }
    }
}

impl Volume {
    /// The quota it was made with.
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// Its free space and files now, from `statvfs`.
    pub fn fill(&self) -> io::Result<Fill> {
        let st = statvfs(&self.at)?;
        Ok(Fill {
            free_bytes: st.f_bavail.saturating_mul(st.f_frsize),
            free_files: st.f_favail,
            block_size: st.f_frsize,
        })
    }

    /// The limit that is used up now, if one is (see [`Fill::exhausted`]).
    pub fn exhausted(&self) -> Option<LimitKind> {
        self.fill().ok().and_then(|f| f.exhausted(self.quota))
    }

    /// The bytes its image takes on the host's disk (`None` for tmpfs).
    pub fn image_bytes(&self) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        let image = self.image.as_ref()?;
        std::fs::metadata(image).ok().map(|m| m.blocks() * 512)
    }

    /// Unmounts it (lazily: a reader still holding a file keeps the filesystem until
    /// it lets go; no one can open anything new in it) and removes its image. The
    /// loop device detaches itself when the filesystem goes.
    pub fn unmount(&self) -> io::Result<()> {
        let path = cstring(&self.at)?;
        // SAFETY: umount2 with a valid C path.
        if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
            let e = io::Error::last_os_error();
            // Not mounted (any more): nothing to undo.
            if e.raw_os_error() != Some(libc::EINVAL) && e.raw_os_error() != Some(libc::ENOENT) {
                return Err(e);
            }
        }
        if let Some(image) = &self.image {
            match std::fs::remove_file(image) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_too_large_for_the_host_is_the_requests_to_fix() {
        let wrapped = io::Error::new(
            io::ErrorKind::FileTooLarge,
            "making the filesystem template: File too large (os error 27)",
        );
        let e = workdir_error(wrapped);
        assert_eq!(e.code, paddock_core::ErrorCode::InvalidOptions);
        assert!(e.message.contains("limits.disk_bytes"), "{}", e.message);
        let other = workdir_error(io::Error::from_raw_os_error(libc::EIO));
        assert_eq!(other.code, paddock_core::ErrorCode::EngineFailed);
    }

    #[test]
    fn inodes_follow_the_file_cap_within_the_size() {
        let q = |bytes, files| Quota { bytes, files };
        assert_eq!(q(1 << 30, 65_536).ext4_files(), 65_536);
        assert_eq!(q(8 << 20, 65_536).ext4_files(), 2048);
        assert_eq!(q(1 << 20, 1).ext4_files(), 16);
    }

    #[test]
    fn a_fill_names_the_limit_used_up() {
        let fill = |free_bytes, free_files| Fill {
            free_bytes,
            free_files,
            block_size: 4096,
        };
        let big = Quota {
            bytes: 1 << 30,
            files: 100,
        };
        let small = Quota {
            bytes: 1 << 20,
            files: 100,
        };
        assert_eq!(fill(8 << 20, 10).exhausted(big), None);
        assert_eq!(fill(900 << 10, 10).exhausted(big), Some(LimitKind::Disk));
        assert_eq!(fill(8 << 20, 0).exhausted(big), Some(LimitKind::DiskFiles));
        assert_eq!(fill(600 << 10, 10).exhausted(small), None);
        assert_eq!(fill(200 << 10, 10).exhausted(small), Some(LimitKind::Disk));
    }
}
