//! One engine's sandbox filesystems ([`Disks`]): the backend found by trying
//! `loop` then `tmpfs` when the engine starts, the formatted templates kept per
//! quota, and mounting a sandbox's [`Volume`] from them.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::loopdev::mount_loop;
use super::mkfs::{find_mkfs, make_template, sparse_copy, DATA_DIR};
use super::mount::{bind, cstring, mount_tmpfs, umount};
use super::mountinfo::sweep_stale;
use super::{Quota, Volume};

static NEXT_DISKS: AtomicU64 = AtomicU64::new(0);

/// How many formatted templates an engine keeps (one per distinct quota).
const MAX_TEMPLATES: usize = 8;

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
            crate::host::owner::namespace_suffix()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::volume::own_mounts;
    use paddock_core::LimitKind;

    fn root() -> bool {
        crate::host::sys::effective_uid() == 0
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
}
