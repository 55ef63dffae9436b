//! Empty network namespaces for network policy `none`.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// Creates a new, empty network namespace (only a loopback device, down) and returns
/// an fd that keeps it alive. A short-lived thread does the `unshare`, so no thread of
/// the host ever changes namespace.
pub fn create_empty() -> io::Result<OwnedFd> {
    std::thread::Builder::new()
        .name("paddock-netns".into())
        .spawn(|| {
            // SAFETY: unshare only affects this thread, which exits right after.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } == -1 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: open with a static C string.
            let fd = unsafe {
                libc::open(
                    c"/proc/thread-self/ns/net".as_ptr(),
                    libc::O_RDONLY | libc::O_CLOEXEC,
                )
            };
            if fd == -1 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: a fresh fd we own.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })?
        .join()
        .map_err(|_| io::Error::other("the namespace thread panicked"))?
}

/// Creates a mount namespace that is a copy of the host's, with the cgroup v2 mount at
/// `/sys/fs/cgroup/unified` removed, and returns an fd that keeps it alive. Its
/// mounts are slaves of the host's: mounts and unmounts on the host reach it, and
/// nothing done in it reaches the host.
/// crun refuses a hybrid cgroup layout (v1 controllers plus that v2 mount); run in
/// this namespace it sees a plain v1 layout, and the host's mounts are not touched.
pub fn private_mounts_without_unified_cgroup() -> io::Result<OwnedFd> {
    std::thread::Builder::new()
        .name("paddock-mntns".into())
        .spawn(|| {
            // SAFETY: unshare(CLONE_NEWNS) gives only this thread (which exits right
            // after) its own mount namespace and fs state; the calls take static C
            // strings.
            unsafe {
                if libc::unshare(libc::CLONE_NEWNS) == -1 {
                    return Err(io::Error::last_os_error());
                }
                if libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_SLAVE,
                    std::ptr::null(),
                ) == -1
                {
                    return Err(io::Error::last_os_error());
                }
                if libc::umount2(c"/sys/fs/cgroup/unified".as_ptr(), libc::MNT_DETACH) == -1 {
                    return Err(io::Error::last_os_error());
                }
                let fd = libc::open(
                    c"/proc/thread-self/ns/mnt".as_ptr(),
                    libc::O_RDONLY | libc::O_CLOEXEC,
                );
                if fd == -1 {
                    return Err(io::Error::last_os_error());
                }
                Ok(OwnedFd::from_raw_fd(fd))
            }
        })?
        .join()
        .map_err(|_| io::Error::other("the namespace thread panicked"))?
}
