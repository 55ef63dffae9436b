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
            paddock_egress::loopback_up()?;
            paddock_egress::thread_netns()
        })?
        .join()
        .map_err(|_| io::Error::other("the namespace thread panicked"))?
}

/// `lstat` of `path` as a sandbox without privileges sees it: on a short-lived
/// thread that joins the mount namespace `mntns` (when the sandbox has one) and
/// takes the file system identity of `nobody` (uid and gid 65534, no supplementary
/// groups), so the answer is what any unprivileged program of the sandbox could
/// see, never what only the host's root may. With a symlink, its target.
pub fn lstat_unprivileged(
    mntns: Option<std::os::fd::BorrowedFd<'_>>,
    path: &std::path::Path,
) -> io::Result<(rustix::fs::Stat, Option<std::ffi::OsString>)> {
    use std::os::fd::AsRawFd;
    let ns = mntns.map(|fd| fd.as_raw_fd());
    let path = path.to_path_buf();
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("paddock-stat".into())
            .spawn_scoped(scope, move || {
                // SAFETY: each call changes only this thread's own attributes (its fs
                // state, mount namespace, groups and file system ids: raw system
                // calls, never the C library's process-wide wrappers), and the thread
                // exits right after; `ns` is an open fd the caller borrows for the
                // whole scope.
                unsafe {
                    if let Some(ns) = ns {
                        if libc::unshare(libc::CLONE_FS) == -1
                            || libc::setns(ns, libc::CLONE_NEWNS) == -1
                        {
                            return Err(io::Error::last_os_error());
                        }
                    }
                    if libc::geteuid() == 0 {
                        if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>())
                            == -1
                        {
                            return Err(io::Error::last_os_error());
                        }
                        libc::syscall(libc::SYS_setfsgid, 65534);
                        libc::syscall(libc::SYS_setfsuid, 65534);
                    }
                }
                let st = rustix::fs::lstat(&path)?;
                let target = if rustix::fs::FileType::from_raw_mode(st.st_mode)
                    == rustix::fs::FileType::Symlink
                {
                    std::fs::read_link(&path).ok().map(|t| t.into_os_string())
                } else {
                    None
                };
                Ok((st, target))
            })?
            .join()
            .map_err(|_| io::Error::other("the stat thread panicked"))?
    })
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

/// Creates a mount namespace in which `workdir` (a host directory) is seen at `home`
/// (an absolute path checked by `paddock_core::engine::check_home`), and returns an
/// fd that keeps it alive. It is a copy of the host's, its mounts slaves of the
/// host's, so nothing done in it reaches the host. The top directory of `home`
/// (`/home` for `/home/user`) is covered by a small read-only tmpfs holding only the
/// path down to `home`: a sandbox sees no other home directory of the host. Fails
/// when that top directory does not exist on the host.
pub fn private_home(workdir: &std::path::Path, home: &str) -> io::Result<OwnedFd> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let rel = home.trim_start_matches('/');
    let top = rel.split('/').next().unwrap_or_default();
    if top.is_empty() || rel.split('/').count() < 2 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{home}` needs two components"),
        ));
    }
    let top_dir = format!("/{top}");
    if !std::path::Path::new(&top_dir).is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("`{top_dir}` does not exist on the host, so `{home}` has nowhere to go"),
        ));
    }
    let cstr = |s: &[u8]| CString::new(s).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
    let top_c = cstr(top_dir.as_bytes())?;
    let home_c = cstr(home.as_bytes())?;
    let workdir_c = cstr(workdir.as_os_str().as_bytes())?;
    let workdir = workdir.to_path_buf();
    // Every directory from the top one down to `home`, made inside the tmpfs.
    let mut below = Vec::new();
    let mut at = top_dir.clone();
    for part in rel.split('/').skip(1) {
        at.push('/');
        at.push_str(part);
        below.push(cstr(at.as_bytes())?);
    }
    std::thread::Builder::new()
        .name("paddock-mntns".into())
        .spawn(move || {
            // SAFETY: unshare(CLONE_NEWNS) gives only this thread (which exits right
            // after) its own mount namespace and fs state; every pointer passed is a
            // NUL-terminated string that outlives the call, and the fds are our own.
            unsafe {
                if libc::unshare(libc::CLONE_NEWNS) == -1 {
                    return Err(io::Error::last_os_error());
                }
                let none = std::ptr::null();
                if libc::mount(
                    none,
                    c"/".as_ptr(),
                    none,
                    libc::MS_REC | libc::MS_SLAVE,
                    none.cast(),
                ) == -1
                {
                    return Err(io::Error::last_os_error());
                }
                // Other sandboxes' filesystems are not kept alive by this one.
                crate::host::volume::detach_copied_volumes_except(Some(&workdir));
                // The workdir, opened in this namespace (a bind takes its source
                // from the caller's own) before anything covers it (it may lie under
                // the top directory).
                let src = libc::open(
                    workdir_c.as_ptr(),
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                );
                if src == -1 {
                    return Err(io::Error::last_os_error());
                }
                let src = OwnedFd::from_raw_fd(src);
                let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
                if libc::mount(
                    c"tmpfs".as_ptr(),
                    top_c.as_ptr(),
                    c"tmpfs".as_ptr(),
                    flags,
                    c"size=64k,nr_inodes=64,mode=755".as_ptr().cast(),
                ) == -1
                {
                    return Err(io::Error::last_os_error());
                }
                for dir in &below {
                    if libc::mkdir(dir.as_ptr(), 0o755) == -1 {
                        return Err(io::Error::last_os_error());
                    }
                }
                if libc::mount(
                    none,
                    top_c.as_ptr(),
                    none,
                    libc::MS_REMOUNT | libc::MS_RDONLY | flags,
                    none.cast(),
                ) == -1
                {
                    return Err(io::Error::last_os_error());
                }
                use std::os::fd::AsRawFd;
                let from = cstr(format!("/proc/thread-self/fd/{}", src.as_raw_fd()).as_bytes())?;
                if libc::mount(
                    from.as_ptr(),
                    home_c.as_ptr(),
                    none,
                    libc::MS_BIND | libc::MS_REC,
                    none.cast(),
                ) == -1
                {
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

/// Runs `f` on a thread of its own inside the network namespace `netns` (an fd of
/// `/proc/<pid>/ns/net`, or of a namespace made with `ip netns`), and returns what it
/// returns: a socket it binds or connects stays in that namespace once the thread has
/// ended. No other thread changes namespace.
pub fn run_in<T: Send>(
    netns: std::os::fd::BorrowedFd<'_>,
    f: impl FnOnce() -> T + Send,
) -> io::Result<T> {
    use std::os::fd::AsRawFd;
    let fd = netns.as_raw_fd();
    std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY: setns moves this thread only, which ends after `f`; the
            // descriptor is borrowed for the whole call.
            if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("a thread in the namespace panicked")))
    })
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
