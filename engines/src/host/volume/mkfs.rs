//! The ext4 images of the `loop` backend: finding `mkfs.ext4`, formatting a
//! quota's template (with the inodes beyond the file cap set aside), and copying it
//! sparsely for each sandbox.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::loopdev::mount_loop;
use super::mount::{statvfs, syncfs, umount};
use super::Quota;

pub(super) fn find_mkfs() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join("mkfs.ext4"))
        .find(|p| p.is_file())
}

/// Makes the template image of `quota` at `path`: a sparse ext4 (no journal, since a
/// sandbox's scratch space needs no crash consistency; no reserved blocks; inode
/// tables initialized lazily, so the image holds a few hundred KiB until written)
/// whose `data/` directory is what a sandbox sees.
///
/// mke2fs rounds an inode count up to fill its block groups' inode tables (at least
/// 16 a group), so the filesystem may hold more inodes than the file cap. The
/// excess is taken by empty files in `.reserved/`, beside `data/`, which the
/// sandbox never sees: only `data/` is mounted for it. Exactly `disk_files` files
/// can be created then (or one per 4 KiB, for a small disk).
pub(super) fn make_template(
    mkfs: &Path,
    path: &Path,
    scratch: &Path,
    quota: Quota,
) -> io::Result<()> {
    // Inodes 1–10 are ext4's own; `data/` and `.reserved/` take one each.
    const OWN_INODES: u64 = 12;
    format_ext4(mkfs, path, quota.bytes, quota.ext4_files() + OWN_INODES)?;
    let shape = || -> io::Result<()> {
        std::fs::create_dir(scratch)?;
        mount_loop(path, scratch)?;
        let filled = (|| -> io::Result<()> {
            let _ = std::fs::remove_dir(scratch.join("lost+found"));
            use std::os::unix::fs::DirBuilderExt;
            let mut dir = std::fs::DirBuilder::new();
            dir.mode(0o700);
            dir.create(scratch.join(DATA_DIR))?;
            dir.create(scratch.join(RESERVED_DIR))?;
            let free = statvfs(scratch)?.f_favail;
            let excess = free.saturating_sub(quota.ext4_files());
            for i in 0..excess {
                File::create(scratch.join(RESERVED_DIR).join(i.to_string()))?;
            }
            // Into the image now: the template is copied as soon as this returns,
            // and unmounting does not write it out while another mount namespace
            // (an OCI runtime's, made meanwhile) still holds a copy of this mount.
            syncfs(scratch)
        })();
        let unmounted = umount(scratch);
        let _ = std::fs::remove_dir(scratch);
        filled.and(unmounted)
    };
    shape().inspect_err(|_| {
        let _ = std::fs::remove_file(path);
    })
}

/// The directory of a volume's filesystem that its sandbox sees.
pub(super) const DATA_DIR: &str = "data";
/// The directory holding the inodes beyond the file cap.
const RESERVED_DIR: &str = ".reserved";

fn format_ext4(mkfs: &Path, path: &Path, bytes: u64, inodes: u64) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.set_len(bytes)?;
    drop(file);
    let out = std::process::Command::new(mkfs)
        .args(["-q", "-F", "-O", "^has_journal,^resize_inode", "-m", "0"])
        .args(["-E", "lazy_itable_init=1,nodiscard"])
        .arg("-N")
        .arg(inodes.to_string())
        .arg(path)
        .stdin(std::process::Stdio::null())
        .output();
    let failed = |why: String| {
        let _ = std::fs::remove_file(path);
        Err(io::Error::other(format!(
            "mkfs.ext4 of a {bytes} byte image failed: {why}"
        )))
    };
    match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => failed(String::from_utf8_lossy(&o.stderr).trim().to_string()),
        Err(e) => failed(e.to_string()),
    }
}

/// Copies `from` to `to`, holes kept as holes (`SEEK_DATA` / `SEEK_HOLE`), so a
/// copy of a sparse template takes only its written blocks.
pub(super) fn sparse_copy(src: &File, to: &Path) -> io::Result<()> {
    let len = src.metadata()?.len();
    use std::os::unix::fs::OpenOptionsExt;
    let dst = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    dst.set_len(len)?;
    let mut buf = vec![0u8; 256 << 10];
    let mut pos: i64 = 0;
    let len = len as i64;
    while pos < len {
        // SAFETY: lseek on a valid fd.
        let data = unsafe { libc::lseek(src.as_raw_fd(), pos, libc::SEEK_DATA) };
        if data < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // no data past `pos`
            }
            return Err(e);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(src.as_raw_fd(), data, libc::SEEK_HOLE) };
        let end = if hole < 0 { len } else { hole.min(len) };
        let mut at = data;
        while at < end {
            let want = ((end - at) as usize).min(buf.len());
            let n = src.read_at(&mut buf[..want], at as u64)?;
            if n == 0 {
                break;
            }
            dst.write_all_at(&buf[..n], at as u64)?;
            at += n as i64;
        }
        pos = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> bool {
        crate::host::sys::effective_uid() == 0
    }

    #[test]
    fn a_template_is_whole_even_while_another_namespace_holds_its_mount() {
        if !root() || find_mkfs().is_none() || !Path::new("/dev/loop-control").exists() {
            eprintln!("skipped: needs root, mkfs.ext4 and loop devices");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let image = t.path().join("t.img");
        let scratch = t.path().join("scratch");
        std::fs::create_dir(&scratch).unwrap();
        format_ext4(&find_mkfs().unwrap(), &image, 4 << 20, 64).unwrap();
        mount_loop(&image, &scratch).unwrap();
        std::fs::create_dir(scratch.join(DATA_DIR)).unwrap();
        // A mount namespace made now (as the container engine makes one for its
        // runtime) copies this mount and keeps the filesystem alive past our
        // unmount, so the unmount alone does not write it out.
        let holder = std::thread::spawn(|| {
            // SAFETY: unshare(CLONE_NEWNS) on this short-lived thread only.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNS) }, 0);
            std::thread::sleep(std::time::Duration::from_millis(500));
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        syncfs(&scratch).unwrap();
        umount(&scratch).unwrap();
        let copy = t.path().join("c.img");
        sparse_copy(&File::open(&image).unwrap(), &copy).unwrap();
        let at = t.path().join("at");
        std::fs::create_dir(&at).unwrap();
        mount_loop(&copy, &at).unwrap();
        let whole = at.join(DATA_DIR).is_dir();
        umount(&at).unwrap();
        holder.join().unwrap();
        assert!(
            whole,
            "the copy lacks the directory made before the unmount"
        );
    }
}
