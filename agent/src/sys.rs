//! Thin, checked wrappers over the Linux calls the agent makes.
//!
//! Each function here is safe to call: it checks what the system call needs (valid
//! pointers, descriptors the caller owns or borrows) and turns its answer into an
//! `io::Result`. The rest of the crate calls these instead of `libc` directly. (The
//! host's side has its own, in `paddock-engines`' `host::sys`: the agent is a
//! separate program, kept small, and shares only the control channel with it.)

// The system calls themselves are `unsafe` to make; this module is where they are
// made, each behind a safe function with its reasoning beside it.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// Sends `signal` to every process in process group `pgid`. Missing groups are fine.
pub(crate) fn kill_group(pgid: libc::pid_t, signal: libc::c_int) {
    if pgid > 1 {
        // SAFETY: kill has no memory-safety preconditions; pgid > 1 never targets init
        // or "every process".
        unsafe { libc::kill(-pgid, signal) };
    }
}

/// Sends `signal` to one process.
pub(crate) fn kill_pid(pid: libc::pid_t, signal: libc::c_int) {
    if pid > 1 {
        // SAFETY: as in `kill_group`.
        unsafe { libc::kill(pid, signal) };
    }
}

/// A pidfd for process `pid` (close-on-exec): polling it cannot mistake another
/// process that later gets the same pid for this one.
pub(crate) fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid.max(0))
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    Ok(rustix::process::pidfd_open(
        pid,
        rustix::process::PidfdFlags::empty(),
    )?)
}

/// How a reaped child ended.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExitStatus {
    /// Exit code if it exited.
    pub(crate) code: Option<i32>,
    /// Signal if it was killed.
    pub(crate) signal: Option<i32>,
}

/// Reaps `pid`, which must have exited.
pub(crate) fn reap(pid: libc::pid_t) -> io::Result<ExitStatus> {
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: a valid pointer to a local.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == -1 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        break;
    }
    Ok(if libc::WIFEXITED(status) {
        ExitStatus {
            code: Some(libc::WEXITSTATUS(status)),
            signal: None,
        }
    } else if libc::WIFSIGNALED(status) {
        ExitStatus {
            code: None,
            signal: Some(libc::WTERMSIG(status)),
        }
    } else {
        ExitStatus {
            code: None,
            signal: None,
        }
    })
}

/// A child of this process that has exited, left waitable (`waitid` with
/// `WNOWAIT`): `Ok(None)` while every child still runs, `ECHILD` when there is no
/// child at all.
pub(crate) fn exited_child() -> io::Result<Option<libc::pid_t>> {
    loop {
        // SAFETY: siginfo_t is plain data; zeroed is a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid with a valid out pointer; WNOWAIT only peeks.
        let r = unsafe {
            libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        if r == -1 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // SAFETY: si_pid is valid for the child-state info waitid fills (and 0 in the
        // zeroed info when no child has changed state).
        let pid = unsafe { info.si_pid() };
        return Ok((pid != 0).then_some(pid));
    }
}

/// Whether child `pid` has exited (and waits to be reaped), without reaping it.
pub(crate) fn has_exited(pid: libc::pid_t) -> bool {
    loop {
        // SAFETY: siginfo_t is plain data; zeroed is a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid with a valid out pointer; WNOWAIT only peeks.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        if r == -1 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // Not a child (any more): nothing to wait for.
            return true;
        }
        // SAFETY: si_pid is valid for the child-state info waitid fills (0 when the
        // child has not changed state).
        return unsafe { info.si_pid() } != 0;
    }
}

/// Reaps `pid` if it has exited, without waiting, and forgets how it ended.
pub(crate) fn discard_exited(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: waitpid with a valid pointer to a local.
    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
}

/// Puts a descriptor this process owns into non-blocking mode.
pub(crate) fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl on a descriptor the caller owns.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
}

/// One `read(2)` from `fd` into `buf`; `Ok(0)` at the end.
pub(crate) fn read(fd: impl AsFd, buf: &mut [u8]) -> io::Result<usize> {
    Ok(rustix::io::read(fd, buf)?)
}

/// `poll(2)` over `fds` (an fd of -1 is skipped), waiting up to `timeout_ms`
/// (-1: without end); how many have events.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout_ms: libc::c_int) -> io::Result<usize> {
    // SAFETY: poll reads and writes exactly `fds.len()` pollfd entries of the slice;
    // the kernel checks each descriptor and reports a bad one as POLLNVAL.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Blocks `signal` in the calling thread and answers a non-blocking, close-on-exec
/// descriptor that reads it instead (`signalfd(2)`).
pub(crate) fn signal_fd(signal: libc::c_int) -> io::Result<OwnedFd> {
    let set = signal_set(signal);
    // SAFETY: pthread_sigmask reads the local set; no old mask is asked for.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    // SAFETY: signalfd(-1, …) makes a new descriptor from the local set.
    let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Runs `f` with `signal` unblocked in the calling thread, then blocks it again.
pub(crate) fn with_signal_unblocked<T>(signal: libc::c_int, f: impl FnOnce() -> T) -> T {
    let set = signal_set(signal);
    // SAFETY: pthread_sigmask reads the local set; no old mask is asked for.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
    let out = f();
    // SAFETY: as above.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    out
}

/// A signal set holding `signal` alone.
fn signal_set(signal: libc::c_int) -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset and sigaddset fill the local.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        set
    }
}

/// The descriptor the agent gets its control channel on.
const INHERITED_CONTROL_FD: RawFd = 3;
/// Whether [`take_inherited_control_socket`] has taken it.
static CONTROL_FD_TAKEN: AtomicBool = AtomicBool::new(false);

/// Descriptor 3, when this process was started with a `SOCK_SEQPACKET` socket there
/// (the agent's control channel), owned from now on and close-on-exec, so that no
/// command the process starts inherits it. Meant for the start of a process that was
/// handed the socket across `exec`; only the first call can take it, later ones
/// answer `None`, so it never has two owners.
pub(crate) fn take_inherited_control_socket() -> Option<OwnedFd> {
    let fd = INHERITED_CONTROL_FD;
    let mut kind: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt into a local int; fails harmlessly when fd 3 is no socket.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut kind as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r != 0 || kind != libc::SOCK_SEQPACKET {
        return None;
    }
    if CONTROL_FD_TAKEN.swap(true, Ordering::AcqRel) {
        return None;
    }
    // SAFETY: fd 3 is open (getsockopt succeeded); it was inherited across exec, and
    // the flag above makes this the only place that ever takes ownership of it.
    unsafe {
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        Some(OwnedFd::from_raw_fd(fd))
    }
}

/// Makes `cmd`'s child start a new session (so it leads its own process group) and,
/// with `controlling_tty`, take the terminal on its stdin as its controlling
/// terminal, before it executes the program.
pub(crate) fn in_new_session(cmd: &mut std::process::Command, controlling_tty: bool) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and makes only
    // async-signal-safe calls (setsid, ioctl); it neither allocates nor locks.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            if controlling_tty && libc::ioctl(0, libc::TIOCSCTTY, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Makes `fd` the child's fd 3 (open across exec): a warm runner writes its frames
/// there. `fd` must stay open until the spawn returns.
pub(crate) fn onto_fd3(cmd: &mut std::process::Command, fd: RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and makes only
    // async-signal-safe calls (dup2, fcntl); it neither allocates nor locks.
    unsafe {
        cmd.pre_exec(move || {
            if fd == 3 {
                // dup2 onto itself would keep close-on-exec.
                if libc::fcntl(3, libc::F_SETFD, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
            } else if libc::dup2(fd, 3) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Makes this process non-dumpable (`PR_SET_DUMPABLE` 0): a process of the same
/// user without `CAP_SYS_PTRACE` can then no longer open its memory, descriptors or
/// environment through `/proc` (the agent outlives the tenants whose code runs
/// beside it). Programs it starts are dumpable again after their `exec`.
pub(crate) fn set_not_dumpable() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this process is dumpable (`PR_GET_DUMPABLE`).
pub(crate) fn is_dumpable() -> bool {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) == 1 }
}

/// A System V IPC namespace's kind of object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ipc {
    /// Shared memory segments (`/proc/sysvipc/shm`).
    Shm,
    /// Message queues (`/proc/sysvipc/msg`).
    Msg,
    /// Semaphore sets (`/proc/sysvipc/sem`).
    Sem,
}

/// Removes the System V IPC object `id` of kind `kind` (`IPC_RMID`). One already
/// gone (`EINVAL`, `EIDRM`) is not an error.
pub(crate) fn ipc_remove(kind: Ipc, id: libc::c_int) -> io::Result<()> {
    // SAFETY: IPC_RMID reads no buffer; a null one is allowed.
    let r = unsafe {
        match kind {
            Ipc::Shm => libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()),
            Ipc::Msg => libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()),
            Ipc::Sem => libc::semctl(id, 0, libc::IPC_RMID),
        }
    };
    if r == -1 {
        let e = io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EIDRM)) {
            return Ok(());
        }
        return Err(e);
    }
    Ok(())
}

/// The filesystem type (`f_type` of `statfs(2)`) of the filesystem `path` is on.
pub(crate) fn fs_type(path: &std::path::Path) -> io::Result<i64> {
    let c = cstr(path)?;
    // SAFETY: statfs is plain data; zeroed is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a valid out pointer.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type as i64)
}

/// The magic number of the mqueue filesystem (`MQUEUE_MAGIC`).
pub(crate) const MQUEUE_MAGIC: i64 = 0x1980_0202;

fn cstr(path: &std::path::Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The extended attributes of `path` itself (not of what a symlink names): names
/// and values.
pub(crate) fn xattrs(path: &std::path::Path) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let c = cstr(path)?;
    let mut names = vec![0u8; 1024];
    let len = loop {
        // SAFETY: the buffer is valid for `names.len()` bytes.
        let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ERANGE) if names.len() < 1 << 20 => names.resize(names.len() * 4, 0),
            Some(libc::ENOTSUP) => return Ok(Vec::new()),
            _ => return Err(e),
        }
    };
    let mut out = Vec::new();
    for name in names[..len].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let cname = std::ffi::CString::new(name).expect("split at NUL");
        let mut value = vec![0u8; 256];
        let got = loop {
            // SAFETY: NUL-terminated path and name; the buffer is valid for its length.
            let n = unsafe {
                libc::lgetxattr(
                    c.as_ptr(),
                    cname.as_ptr(),
                    value.as_mut_ptr().cast(),
                    value.len(),
                )
            };
            if n >= 0 {
                break Some(n as usize);
            }
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::ERANGE) if value.len() < 1 << 20 => value.resize(value.len() * 4, 0),
                // Gone meanwhile, or not readable: named with an empty value.
                _ => break None,
            }
        };
        value.truncate(got.unwrap_or(0));
        out.push((name.to_vec(), value));
    }
    Ok(out)
}

/// Removes the extended attribute `name` of `path` itself.
pub(crate) fn remove_xattr(path: &std::path::Path, name: &[u8]) -> io::Result<()> {
    let c = cstr(path)?;
    let cname =
        std::ffi::CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: NUL-terminated path and name.
    if unsafe { libc::lremovexattr(c.as_ptr(), cname.as_ptr()) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The number of resource limits (`RLIM_NLIMITS`).
pub(crate) const RLIMITS: libc::c_int = 16;

/// This process's soft and hard limit of `resource`.
pub(crate) fn get_rlimit(resource: libc::c_int) -> io::Result<(libc::rlim_t, libc::rlim_t)> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out pointer; an unknown resource is EINVAL.
    if unsafe { libc::getrlimit(resource as _, &mut r) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok((r.rlim_cur, r.rlim_max))
}

/// Sets this process's soft and hard limit of `resource`.
pub(crate) fn set_rlimit(
    resource: libc::c_int,
    (rlim_cur, rlim_max): (libc::rlim_t, libc::rlim_t),
) -> io::Result<()> {
    let r = libc::rlimit { rlim_cur, rlim_max };
    // SAFETY: reads the local.
    if unsafe { libc::setrlimit(resource as _, &r) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// This process's nice value.
pub(crate) fn nice() -> io::Result<i32> {
    // getpriority may answer -1 as a value: errno tells.
    // SAFETY: sets the calling thread's errno.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: no pointers.
    let n = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    let e = io::Error::last_os_error();
    if n == -1 && e.raw_os_error() != Some(0) {
        return Err(e);
    }
    Ok(n)
}

/// Sets this process's nice value (lowering it needs `CAP_SYS_NICE`).
pub(crate) fn set_nice(value: i32) -> io::Result<()> {
    // SAFETY: no pointers.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, value) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// This process's scheduling policy (with `SCHED_RESET_ON_FORK` when set) and
/// static priority.
pub(crate) fn scheduler() -> io::Result<(i32, i32)> {
    // SAFETY: no pointers.
    let policy = unsafe { libc::sched_getscheduler(0) };
    if policy == -1 {
        return Err(io::Error::last_os_error());
    }
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a valid out pointer.
    if unsafe { libc::sched_getparam(0, &mut param) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok((policy, param.sched_priority))
}

/// Sets this process's scheduling policy and static priority (leaving
/// `SCHED_IDLE` needs `CAP_SYS_NICE`).
pub(crate) fn set_scheduler((policy, priority): (i32, i32)) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: reads the local.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Words of a CPU mask: 1024 CPUs, the size of glibc's `cpu_set_t`.
const CPU_WORDS: usize = 16;

/// The CPUs this process may run on, as a bit mask.
pub(crate) fn affinity() -> io::Result<Vec<u64>> {
    let mut words = [0u64; CPU_WORDS];
    // SAFETY: the buffer is valid for the size given; the kernel writes at most that.
    let r = unsafe {
        libc::sched_getaffinity(
            0,
            std::mem::size_of_val(&words),
            words.as_mut_ptr().cast::<libc::cpu_set_t>(),
        )
    };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(words.to_vec())
}

/// Sets the CPUs this process may run on.
pub(crate) fn set_affinity(mask: &[u64]) -> io::Result<()> {
    let mut words = [0u64; CPU_WORDS];
    for (w, m) in words.iter_mut().zip(mask) {
        *w = *m;
    }
    // SAFETY: the buffer is valid for the size given; the kernel only reads it.
    let r = unsafe {
        libc::sched_setaffinity(
            0,
            std::mem::size_of_val(&words),
            words.as_ptr().cast::<libc::cpu_set_t>(),
        )
    };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `IOPRIO_WHO_PROCESS` of `ioprio_get(2)` and `ioprio_set(2)`.
const IOPRIO_WHO_PROCESS: libc::c_long = 1;

/// This process's I/O priority (class and level, as `ioprio_get(2)` answers).
pub(crate) fn io_priority() -> io::Result<i64> {
    // SAFETY: ioprio_get takes integers only.
    let r = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0 as libc::c_long) };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as i64)
}

/// Sets this process's I/O priority.
pub(crate) fn set_io_priority(value: i64) -> io::Result<()> {
    // SAFETY: ioprio_set takes integers only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0 as libc::c_long,
            value as libc::c_long,
        )
    };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
