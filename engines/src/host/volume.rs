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

use std::collections::VecDeque;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use paddock_core::LimitKind;

static NEXT_DISKS: AtomicU64 = AtomicU64::new(0);

/// How many formatted templates an engine keeps (one per distinct quota).
const MAX_TEMPLATES: usize = 8;

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

/// The filesystem backend of an engine's sandboxes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Backend {
    /// Sparse ext4 images, loop-mounted; formatted with this `mkfs.ext4`.
    Loop { mkfs: PathBuf },
    /// A tmpfs per sandbox.
    Tmpfs,
}

/// One engine's sandbox filesystems: the backend found when it started, its
/// templates, and where the images live.
#[derive(Debug)]
pub struct Disks {
    backend: Option<Backend>,
    /// Why no backend (or why not `loop`), for `paddock doctor`.
    notes: Vec<String>,
    /// `…/paddock-disk-<pid>-<n>-ns<inode>`: images and templates.
    dir: PathBuf,
    /// The tag in the tmpfs source and the images' directory name.
    tag: String,
    templates: parking_lot::Mutex<VecDeque<(Quota, PathBuf)>>,
    next: AtomicU64,
}

impl Disks {
    /// Finds a backend that works here (trying `loop`, then `tmpfs`, with a small
    /// filesystem each), and the directory for the images under `parent`. First
    /// unmounts and removes what Paddock processes that are gone left under
    /// `parent`.
    pub fn new(parent: &Path) -> Disks {
        sweep_stale(parent);
        // A random part, so that nobody can make the directory first in a shared
        // temp dir (the tail of a UUIDv7 is random).
        let random = uuid::Uuid::now_v7().simple().to_string();
        let tag = format!(
            "paddock-disk-{}-{}-{}{}",
            std::process::id(),
            NEXT_DISKS.fetch_add(1, Ordering::Relaxed),
            &random[random.len() - 12..],
            super::owner::namespace_suffix()
        );
        let dir = parent.join(&tag);
        let mut disks = Disks {
            backend: None,
            notes: Vec::new(),
            dir,
            tag,
            templates: parking_lot::Mutex::new(VecDeque::new()),
            next: AtomicU64::new(0),
        };
        // Private (0700) and new: `create` fails on anything already there, a
        // symlink included, so every path below is ours.
        let made = std::fs::create_dir_all(parent).and_then(|()| {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().mode(0o700).create(&disks.dir)
        });
        if let Err(e) = made {
            disks
                .notes
                .push(format!("cannot create `{}`: {e}", disks.dir.display()));
            return disks;
        }
        let probe = Quota {
            bytes: 1 << 20,
            files: 64,
        };
        let mut candidates = Vec::new();
        match find_mkfs() {
            Some(mkfs) if Path::new("/dev/loop-control").exists() => {
                candidates.push(Backend::Loop { mkfs })
            }
            Some(_) => disks
                .notes
                .push("loop: /dev/loop-control is missing".to_string()),
            None => disks
                .notes
                .push("loop: no mkfs.ext4 (e2fsprogs) was found".to_string()),
        }
        candidates.push(Backend::Tmpfs);
        for backend in candidates {
            disks.backend = Some(backend.clone());
            let at = disks.dir.join("probe");
            let tried = std::fs::create_dir_all(&at)
                .and_then(|()| disks.mount(&at, probe))
                .and_then(|v| v.unmount());
            let _ = std::fs::remove_dir(&at);
            match tried {
                Ok(()) => return disks,
                Err(e) => {
                    disks.notes.push(format!("{}: {e}", backend_name(&backend)));
                    disks.backend = None;
                }
            }
        }
        disks
    }

    /// Disks that were not probed (`why`): no backend, nothing made on the host.
    pub fn unprobed(parent: &Path, why: &str) -> Disks {
        Disks {
            backend: None,
            notes: vec![why.to_string()],
            dir: parent.join(format!(
                "paddock-disk-unprobed-{}-{}",
                std::process::id(),
                NEXT_DISKS.fetch_add(1, Ordering::Relaxed)
            )),
            tag: String::new(),
            templates: parking_lot::Mutex::new(VecDeque::new()),
            next: AtomicU64::new(0),
        }
    }

    /// `loop`, `tmpfs`, or `None` when no backend works here.
    pub fn backend(&self) -> Option<&'static str> {
        self.backend.as_ref().map(backend_name)
    }

    /// Why a backend was passed over (empty when `loop` works).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Makes a filesystem of `quota` and mounts it on the (empty) directory `at`,
    /// owned by root with mode 0700.
    pub fn mount(&self, at: &Path, quota: Quota) -> io::Result<Volume> {
        let Some(backend) = &self.backend else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no filesystem backend for disk quotas works on this host",
            ));
        };
        let image = match backend {
            Backend::Loop { mkfs } => {
                let template = self.template(mkfs, quota).map_err(|e| {
                    io::Error::new(e.kind(), format!("making the filesystem template: {e}"))
                })?;
                let n = self.next.fetch_add(1, Ordering::Relaxed);
                let image = self.dir.join(format!("{n}.img"));
                let whole = self.dir.join(format!("{n}.mnt"));
                let ctx = |what: &'static str| {
                    move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"))
                };
                let made = sparse_copy(&template, &image)
                    .map_err(ctx("copying the filesystem template"))
                    .and_then(|()| {
                        std::fs::create_dir(&whole)
                            .map_err(ctx("making the image's mount point"))?;
                        let bound = mount_loop(&image, &whole).and_then(|()| {
                            let bound = bind(&whole.join(DATA_DIR), at)
                                .map_err(ctx("binding the filesystem's data directory"));
                            // The bind holds the filesystem now; its whole tree (with
                            // `.reserved/`) is mounted nowhere else.
                            let _ = umount(&whole);
                            bound
                        });
                        let _ = std::fs::remove_dir(&whole);
                        bound
                    });
                if let Err(e) = made {
                    let _ = std::fs::remove_file(&image);
                    return Err(e);
                }
                Some(image)
            }
            Backend::Tmpfs => {
                mount_tmpfs(&self.tag, at, quota, 0o700)?;
                None
            }
        };
        let volume = Volume {
            at: at.to_path_buf(),
            image,
            quota,
        };
        // A fresh ext4 has `lost+found`; the sandbox starts empty, and private.
        let _ = std::fs::remove_dir(at.join("lost+found"));
        use std::os::unix::fs::PermissionsExt;
        if let Err(e) = std::fs::set_permissions(at, std::fs::Permissions::from_mode(0o700)) {
            let _ = volume.unmount();
            return Err(e);
        }
        Ok(volume)
    }

    /// Makes the (empty) directory `dir` a small tmpfs of its own with shared mount
    /// propagation, for the mount points of sandboxes whose filesystems another
    /// mount namespace must see too: one made later as a slave of this one (the OCI
    /// runtime's, say) receives every volume mounted below `dir` and every unmount.
    /// Undone by [`Disks::unshare_parent`]; tagged like the volumes, so a crashed
    /// owner's is swept.
    pub fn share_parent(&self, dir: &Path) -> io::Result<()> {
        // 0711: a user-namespaced container's root (an unprivileged host uid) must
        // pass through to the workdir it owns.
        mount_tmpfs(
            &self.tag,
            dir,
            Quota {
                bytes: 16 << 20,
                files: 1 << 20,
            },
            0o711,
        )?;
        let target = cstring(dir)?;
        // SAFETY: mount with a valid C path and no source, type or data: a change of
        // propagation.
        let r = unsafe {
            libc::mount(
                std::ptr::null(),
                target.as_ptr(),
                std::ptr::null(),
                libc::MS_SHARED,
                std::ptr::null(),
            )
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: as above.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
            return Err(e);
        }
        Ok(())
    }

    /// Unmounts what [`Disks::share_parent`] mounted on `dir`, with every volume
    /// still below it.
    pub fn unshare_parent(&self, dir: &Path) {
        if let Ok(target) = cstring(dir) {
            // SAFETY: umount2 with a valid C path.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }

    /// The formatted template image for `quota`, made on first use, opened while
    /// the list is locked (so evicting it later cannot pull it from under a copy).
    fn template(&self, mkfs: &Path, quota: Quota) -> io::Result<File> {
        let mut templates = self.templates.lock();
        if let Some((_, path)) = templates.iter().find(|(q, _)| *q == quota) {
            return File::open(path);
        }
        let path = self
            .dir
            .join(format!("template-{}-{}.img", quota.bytes, quota.files));
        let scratch = self.dir.join(format!(
            "template-{}.mnt",
            self.next.fetch_add(1, Ordering::Relaxed)
        ));
        make_template(mkfs, &path, &scratch, quota)?;
        if templates.len() >= MAX_TEMPLATES {
            if let Some((_, old)) = templates.pop_front() {
                let _ = std::fs::remove_file(old);
            }
        }
        let file = File::open(&path)?;
        templates.push_back((quota, path));
        Ok(file)
    }
}

impl Drop for Disks {
    fn drop(&mut self) {
        for (_, path) in self.templates.lock().drain(..) {
            let _ = std::fs::remove_file(path);
        }
        // Images of volumes still mounted stay until those are unmounted; then the
        // directory is empty and goes (or a later start sweeps it).
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn backend_name(b: &Backend) -> &'static str {
    match b {
        Backend::Loop { .. } => "loop",
        Backend::Tmpfs => "tmpfs",
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

fn statvfs(p: &Path) -> io::Result<libc::statvfs> {
    let path = cstring(p)?;
    // SAFETY: statvfs is plain data, filled by the kernel from a valid C path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Writes everything of the filesystem mounted at `p` to its device (`syncfs`).
fn syncfs(p: &Path) -> io::Result<()> {
    let dir = File::open(p)?;
    // SAFETY: syncfs on a valid fd.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Unmounts `p` lazily (`MNT_DETACH`).
fn umount(p: &Path) -> io::Result<()> {
    let path = cstring(p)?;
    // SAFETY: umount2 with a valid C path.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Bind-mounts the directory `from` on `to`, `nosuid,nodev,noatime`.
fn bind(from: &Path, to: &Path) -> io::Result<()> {
    let (source, target) = (cstring(from)?, cstring(to)?);
    // SAFETY: mount with valid C strings and no filesystem type or data: a bind,
    // then a remount of the bind with its flags.
    unsafe {
        if libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        if libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME,
            std::ptr::null(),
        ) != 0
        {
            let e = io::Error::last_os_error();
            libc::umount2(target.as_ptr(), libc::MNT_DETACH);
            return Err(e);
        }
    }
    Ok(())
}

fn cstring(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path holds a NUL byte"))
}

fn find_mkfs() -> Option<PathBuf> {
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
fn make_template(mkfs: &Path, path: &Path, scratch: &Path, quota: Quota) -> io::Result<()> {
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
const DATA_DIR: &str = "data";
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
fn sparse_copy(src: &File, to: &Path) -> io::Result<()> {
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

// The loop device ABI (linux/loop.h).
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// Attaches `image` to a free loop device (detached by the kernel once unmounted)
/// and mounts it on `at` as ext4, `nosuid,nodev`.
fn mount_loop(image: &Path, at: &Path) -> io::Result<()> {
    let context =
        |what: String| move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
    let img = OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .map_err(context(format!("opening the image `{}`", image.display())))?;
    let ctl = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
        .map_err(context("opening /dev/loop-control".to_string()))?;
    // One attach at a time in this process: threads that asked for a free device
    // together would all get the same one, and all but one would have to try
    // again, as many rounds as there are threads. Other processes can still take a
    // device first; that is retried, a bounded number of times.
    static ATTACH: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
    let _one = ATTACH.lock();
    let mut tries = 0;
    let (dev_path, dev) = loop {
        // SAFETY: an ioctl without argument on the loop-control fd.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let dev_path = PathBuf::from(format!("/dev/loop{n}"));
        let dev = open_loop_device(&dev_path, n as u32)
            .map_err(context(format!("opening `{}`", dev_path.display())))?;
        // SAFETY: LoopConfig is plain data; zero is a valid value of every field.
        let mut config: LoopConfig = unsafe { std::mem::zeroed() };
        config.fd = img.as_raw_fd() as u32;
        config.info.flags = LO_FLAGS_AUTOCLEAR;
        let name = image.as_os_str().as_encoded_bytes();
        let keep = name.len().min(config.info.file_name.len() - 1);
        config.info.file_name[..keep].copy_from_slice(&name[name.len() - keep..]);
        // SAFETY: LOOP_CONFIGURE reads one LoopConfig, which outlives the call.
        let r = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE as _, &config) };
        if r == 0 {
            drop(_one);
            break (dev_path, dev);
        }
        let e = io::Error::last_os_error();
        // Another process took the free device first.
        if e.raw_os_error() == Some(libc::EBUSY) && tries < 64 {
            tries += 1;
            std::thread::sleep(std::time::Duration::from_micros(200 * tries));
            continue;
        }
        return Err(context(format!(
            "attaching the image to `{}`",
            dev_path.display()
        ))(e));
    };
    let source = cstring(&dev_path)?;
    let target = cstring(at)?;
    let fstype = CString::new("ext4").expect("no NUL");
    // `discard`: blocks the sandbox frees are punched out of the sparse image, so a
    // pooled sandbox's image shrinks again when it is emptied between leases.
    let options = CString::new("discard").expect("no NUL");
    // SAFETY: mount with valid C strings; the data argument is a C string.
    let r = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME,
            options.as_ptr().cast(),
        )
    };
    let result = if r == 0 {
        Ok(())
    } else {
        Err(context(format!(
            "mounting `{}` on `{}`",
            dev_path.display(),
            at.display()
        ))(io::Error::last_os_error()))
    };
    // The mount holds the device now; closing ours lets autoclear detach it once
    // the filesystem is unmounted (or at once, if the mount failed).
    drop(dev);
    drop(img);
    result
}

/// Opens the loop device `/dev/loop<n>` that `LOOP_CTL_GET_FREE` just made. Its
/// node appears in a devtmpfs `/dev` as the kernel adds the device, which can trail
/// the ioctl by a moment; a static `/dev` never gets one, so after a short wait it is
/// made here (block device 7:`n`).
fn open_loop_device(path: &Path, n: u32) -> io::Result<File> {
    let open = || OpenOptions::new().read(true).write(true).open(path);
    for _ in 0..50 {
        match open() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::thread::sleep(std::time::Duration::from_millis(2))
            }
            other => return other,
        }
    }
    // The device number as the kernel gave it (the minor is not `n` when the loop
    // driver reserves minors for partitions).
    let dev = super::sys::read_small(format!("/sys/block/loop{n}/dev"))?;
    let (major, minor) = dev
        .trim()
        .split_once(':')
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
        .ok_or_else(|| io::Error::other(format!("unreadable device number `{}`", dev.trim())))?;
    let node = cstring(path)?;
    // SAFETY: mknod with a valid C path; makedev is plain arithmetic.
    let r = unsafe {
        libc::mknod(
            node.as_ptr(),
            libc::S_IFBLK | 0o600,
            libc::makedev(major, minor),
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
    }
    open()
}

/// Mounts a tmpfs of `quota` and root directory `mode` on `at`, its source tagged
/// with the owner.
fn mount_tmpfs(tag: &str, at: &Path, quota: Quota, mode: u32) -> io::Result<()> {
    let source = CString::new(tag).expect("a tag holds no NUL");
    let target = cstring(at)?;
    let fstype = CString::new("tmpfs").expect("no NUL");
    let options = CString::new(format!(
        "size={},nr_inodes={},mode={mode:o}",
        quota.bytes, quota.files
    ))
    .expect("no NUL");
    // SAFETY: mount with valid C strings; the data argument is a C string.
    let r = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            options.as_ptr().cast(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The mounts whose filesystem belongs to the tag `paddock-disk-<owner>`: a loop
/// device whose backing file is in such a directory, or a tmpfs of that source.
/// Returns (mount point, owner).
fn tagged_mounts() -> Vec<(PathBuf, String)> {
    tagged_mounts_in("/proc/self/mountinfo", true)
}

/// [`tagged_mounts`] of the mount table at `mountinfo`, tmpfs ones too or not.
fn tagged_mounts_in(mountinfo: &str, with_tmpfs: bool) -> Vec<(PathBuf, String)> {
    let Ok(mountinfo) = super::sys::read_small(mountinfo) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for m in super::sys::mount_lines(&mountinfo) {
        let (fstype, source, point) = (m.fstype, m.source, m.point);
        let tag = match fstype {
            "tmpfs" if with_tmpfs => source.to_string(),
            "ext4" => match source.strip_prefix("/dev/") {
                Some(dev) if dev.starts_with("loop") => {
                    let backing = format!("/sys/block/{dev}/loop/backing_file");
                    match super::sys::read_small(&backing) {
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
fn sweep_stale(parent: &Path) {
    sweep_stale_mounts();
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(owner) = name.strip_prefix("paddock-disk-") {
            if super::owner::owner_is_gone(owner) {
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
        if super::owner::owner_is_gone(&owner) {
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
    let suffix = super::owner::namespace_suffix();
    tagged_mounts()
        .into_iter()
        .filter(|(_, owner)| owner.starts_with(&own) && owner.ends_with(&suffix))
        .map(|(p, _)| p)
        .collect()
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
    fn the_loop_config_has_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
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

    fn root() -> bool {
        super::super::sys::effective_uid() == 0
    }

    #[test]
    fn a_volume_bounds_writes_and_leaves_no_mount() {
        if !root() {
            eprintln!("skipped: mounting needs root");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let disks = Disks::new(t.path());
        let Some(backend) = disks.backend() else {
            panic!("no disk backend works as root: {:?}", disks.notes());
        };
        let at = t.path().join("sb");
        std::fs::create_dir(&at).unwrap();
        let quota = Quota {
            bytes: 8 << 20,
            files: 100,
        };
        let v = disks.mount(&at, quota).unwrap();
        assert!(
            std::fs::read_dir(&at).unwrap().next().is_none(),
            "starts empty"
        );
        assert_eq!(v.exhausted(), None);
        // Past the file count (first: a removed file with data in flight may hold
        // its inode a moment longer).
        let made = (0..1000)
            .take_while(|i| File::create(at.join(format!("f{i}"))).is_ok())
            .count();
        assert!((90..=100).contains(&made), "{made} files");
        if backend == "loop" {
            // Exactly the cap: the inodes mke2fs rounded up to are out of sight.
            assert_eq!(made, 100, "{made} files");
        }
        assert_eq!(v.exhausted(), Some(LimitKind::DiskFiles));
        for i in 0..made {
            std::fs::remove_file(at.join(format!("f{i}"))).unwrap();
        }
        assert_eq!(v.exhausted(), None);
        // Past the size: ENOSPC, the file bounded by the quota.
        let mut f = File::create(at.join("big")).unwrap();
        let chunk = vec![7u8; 1 << 20];
        let err = (0..64)
            .find_map(|_| io::Write::write_all(&mut f, &chunk).err())
            .expect("writing 64 MiB into 8 MiB must fail");
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
        drop(f);
        let len = std::fs::metadata(at.join("big")).unwrap().len();
        assert!(len <= quota.bytes, "{len}");
        assert_eq!(v.exhausted(), Some(LimitKind::Disk), "{:?} {len}", v.fill());
        if backend == "loop" {
            let on_host = v.image_bytes().unwrap();
            assert!(on_host <= quota.bytes + (1 << 20), "{on_host}");
        }
        assert!(own_mounts().contains(&at), "{:?}", own_mounts());
        v.unmount().unwrap();
        assert!(!own_mounts().contains(&at));
        assert!(std::fs::read_dir(&at).unwrap().next().is_none());
    }

    #[test]
    fn many_volumes_at_once_each_get_a_device() {
        if !root() {
            eprintln!("skipped: mounting needs root");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let disks = Disks::new(t.path());
        if disks.backend().is_none() {
            panic!("no disk backend works as root: {:?}", disks.notes());
        }
        let quota = Quota {
            bytes: 2 << 20,
            files: 32,
        };
        // More at once than a fresh machine has loop device nodes (16), from
        // as many threads as a burst of 64 sandboxes opened at once uses (which
        // once ran out of retries: every thread was handed the same free device).
        let start = std::sync::Barrier::new(64);
        let volumes: Vec<(PathBuf, Volume)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..64)
                .map(|th| {
                    let (disks, start) = (&disks, &start);
                    let base = t.path().to_path_buf();
                    s.spawn(move || {
                        (0..1)
                            .map(|i| {
                                let at = base.join(format!("v{th}-{i}"));
                                std::fs::create_dir(&at).unwrap();
                                start.wait();
                                let v = disks
                                    .mount(&at, quota)
                                    .unwrap_or_else(|e| panic!("volume {th}-{i}: {e}"));
                                (at, v)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        assert_eq!(volumes.len(), 64);
        for (at, v) in &volumes {
            std::fs::write(at.join("x"), b"own").unwrap();
            assert_eq!(v.exhausted(), None);
        }
        for (at, v) in &volumes {
            assert_eq!(std::fs::read(at.join("x")).unwrap(), b"own");
            v.unmount().unwrap();
            assert!(!own_mounts().contains(at));
        }
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
