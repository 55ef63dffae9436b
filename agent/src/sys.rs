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
