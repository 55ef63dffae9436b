//! Empty network namespaces for network policy `none`.

// `unshare`, `setns`, `mount` and the interface ioctls are `unsafe` to call; each
// is made here behind a safe function.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// Creates a new, empty network namespace and returns an fd that keeps it alive. Its
/// only device is the loopback, brought up so that processes in the namespace reach
/// each other (a dev server and its client); nothing outside is reachable. A
/// short-lived thread does the `unshare`, so no thread of the host ever changes
/// namespace.
pub fn create_empty() -> io::Result<OwnedFd> {
    std::thread::Builder::new()
        .name("paddock-netns".into())
        .spawn(|| {
            // SAFETY: unshare only affects this thread, which exits right after.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } == -1 {
                return Err(io::Error::last_os_error());
            }
            loopback_up()?;
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
                crate::host::volume::detach_copied_volumes();
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

/// Brings `lo` up in the calling thread's network namespace.
fn loopback_up() -> io::Result<()> {
    // SAFETY: a datagram socket for the interface ioctls, closed below.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    // SAFETY: ifreq is plain data; the name is NUL-terminated within IFNAMSIZ.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    use std::os::fd::AsRawFd;
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the ifreq we pass.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) == -1 {
            return Err(io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) == -1 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Connects to `addr` from inside the network namespace `netns` (an fd of
/// `/proc/<pid>/ns/net` or of a namespace Paddock made, open for the whole call). A
/// short-lived thread enters the namespace and makes the socket there; the socket
/// stays in that namespace, and no thread of the host changes namespace for longer
/// than the connect.
pub(crate) fn connect_in(
    netns: std::os::fd::RawFd,
    addr: std::net::SocketAddr,
) -> io::Result<std::net::TcpStream> {
    std::thread::Builder::new()
        .name("paddock-connect".into())
        .spawn(move || {
            // SAFETY: setns changes this thread's network namespace only; the thread
            // ends right after the connect.
            if unsafe { libc::setns(netns, libc::CLONE_NEWNET) } == -1 {
                return Err(io::Error::last_os_error());
            }
            std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5))
        })?
        .join()
        .map_err(|_| io::Error::other("the connecting thread panicked"))?
}
