//! Finding Paddock's volumes in a mount table by their owner's tag, and
//! unmounting those of owners that are gone, or the copies another mount
//! namespace took.

use std::path::{Path, PathBuf};

use super::mount::cstring;

/// The mounts whose filesystem belongs to the tag `paddock-disk-<owner>`: a loop
/// device whose backing file is in such a directory, or a tmpfs of that source.
/// Returns (mount point, owner).
fn tagged_mounts() -> Vec<(PathBuf, String)> {
    tagged_mounts_in("/proc/self/mountinfo", true)
}

/// [`tagged_mounts`] of the mount table at `mountinfo`, tmpfs ones too or not.
fn tagged_mounts_in(mountinfo: &str, with_tmpfs: bool) -> Vec<(PathBuf, String)> {
    let Ok(mountinfo) = crate::host::sys::read_small(mountinfo) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for m in crate::host::sys::mount_lines(&mountinfo) {
        let (fstype, source, point) = (m.fstype, m.source, m.point);
        let tag = match fstype {
            "tmpfs" if with_tmpfs => source.to_string(),
            "ext4" => match source.strip_prefix("/dev/") {
                Some(dev) if dev.starts_with("loop") => {
                    let backing = format!("/sys/block/{dev}/loop/backing_file");
                    match crate::host::sys::read_small(&backing) {
                        Ok(b) => Path::new(b.trim())
                            .parent()
                            .and_then(|p| p.file_name())
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_default(),
                        Err(_) => continue,
                    }
                }
                _ => continue,
            },
            _ => continue,
        };
        if let Some(owner) = tag.strip_prefix("paddock-disk-") {
            // Mount points escape spaces and the like as octal; ours have none.
            out.push((PathBuf::from(point), owner.to_string()));
        }
    }
    out
}

/// Unmounts the filesystems of Paddock processes (of this pid namespace) that are
/// gone, and removes their image directories under `parent`.
pub(super) fn sweep_stale(parent: &Path) {
    sweep_stale_mounts();
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(owner) = name.strip_prefix("paddock-disk-") {
            if crate::host::owner::owner_is_gone(owner) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// In a mount namespace the calling thread has just made (an OCI runtime's), detaches
/// the copies of sandboxes' ext4 filesystems it took from the host's: the runtime
/// never uses another sandbox's, and a copy would keep that filesystem and its loop
/// device alive after the sandbox is destroyed. (Tmpfs ones are left: the container
/// engine's shared `sandboxes/` mount is one, and must stay.)
pub(crate) fn detach_copied_volumes() {
    for (point, _) in tagged_mounts_in("/proc/thread-self/mountinfo", false) {
        if let Ok(p) = cstring(&point) {
            // SAFETY: umount2 with a valid C path, in this thread's namespace.
            unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// In a mount namespace made for one sandbox (which lives as long as the sandbox),
/// detaches the copies of every other sandbox's filesystem, ext4 and tmpfs alike,
/// keeping the one mounted at `keep` (or above it): the sandbox's own.
pub(crate) fn detach_copied_volumes_except(keep: Option<&Path>) {
    for (point, _) in tagged_mounts_in("/proc/thread-self/mountinfo", true) {
        if keep.is_some_and(|k| k.starts_with(&point)) {
            continue;
        }
        if let Ok(p) = cstring(&point) {
            // SAFETY: umount2 with a valid C path, in this thread's namespace.
            unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Unmounts the filesystems of Paddock processes (of this pid namespace) that are
/// gone, wherever they are mounted.
pub(crate) fn sweep_stale_mounts() {
    for (point, owner) in tagged_mounts() {
        if crate::host::owner::owner_is_gone(&owner) {
            if let Ok(p) = cstring(&point) {
                // SAFETY: umount2 with a valid C path.
                unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

/// The mount points of this process's own volumes that are still mounted (for
/// tests: nothing is left after a destroy).
pub fn own_mounts() -> Vec<PathBuf> {
    let own = format!("{}-", std::process::id());
    let suffix = crate::host::owner::namespace_suffix();
    tagged_mounts()
        .into_iter()
        .filter(|(_, owner)| owner.starts_with(&own) && owner.ends_with(&suffix))
        .map(|(p, _)| p)
        .collect()
}
