//! Thin, checked wrappers over the Linux calls the engines make.
//!
//! Each function here is safe to call: it checks what the system call needs (valid
//! pointers, descriptors the caller owns or borrows) and turns its answer into an
//! `io::Result`. The rest of the crate calls these instead of `libc` directly.

// The system calls themselves are `unsafe` to make; this module is where they are
// made, each behind a safe function with its reasoning beside it.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Converts a libc return value into an `io::Result`.
pub(crate) fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A pipe whose both ends are close-on-exec.
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded, so both fds are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

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

/// Sends a signal through a pidfd (no pid-reuse race).
pub(crate) fn pidfd_send_signal(pidfd: &OwnedFd, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: raw syscall with an fd we own and a null siginfo, as the man page allows.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A pidfd for process `pid` (close-on-exec): signals through it and polling it
/// cannot reach another process that later gets the same pid.
pub(crate) fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid.max(0))
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    Ok(rustix::process::pidfd_open(
        pid,
        rustix::process::PidfdFlags::empty(),
    )?)
}

/// The process group of `pid`.
pub(crate) fn process_group(pid: libc::pid_t) -> io::Result<libc::pid_t> {
    // SAFETY: getpgid has no memory-safety preconditions.
    let pgid = unsafe { libc::getpgid(pid) };
    if pgid == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(pgid)
    }
}

/// How a reaped child ended, with its resource usage.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExitStatus {
    /// Exit code if it exited.
    pub(crate) code: Option<i32>,
    /// Signal if it was killed.
    pub(crate) signal: Option<i32>,
    /// User + system CPU time of the child and its reaped descendants.
    pub(crate) cpu_ms: u64,
    /// Peak RSS in bytes.
    pub(crate) max_rss_bytes: u64,
}

/// Reaps `pid` (which must have exited: its pidfd was readable) and collects usage.
pub(crate) fn reap(pid: libc::pid_t) -> io::Result<ExitStatus> {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data; zeroed is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: valid pointers to locals.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == -1 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        break;
    }
    let tv_ms = |tv: libc::timeval| tv.tv_sec as u64 * 1000 + tv.tv_usec as u64 / 1000;
    let (code, signal) = if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else if libc::WIFSIGNALED(status) {
        (None, Some(libc::WTERMSIG(status)))
    } else {
        (None, None)
    };
    Ok(ExitStatus {
        code,
        signal,
        cpu_ms: tv_ms(usage.ru_utime) + tv_ms(usage.ru_stime),
        max_rss_bytes: usage.ru_maxrss.max(0) as u64 * 1024,
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

/// Current soft and hard limits of a resource.
pub(crate) fn getrlimit(resource: libc::__rlimit_resource_t) -> (u64, u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointer to a local.
    unsafe { libc::getrlimit(resource, &mut lim) };
    (lim.rlim_cur, lim.rlim_max)
}

/// `RLIMIT_CPU` for a CPU-time limit of `ms`: the soft limit at the limit in whole
/// seconds (the kernel counts seconds) sends SIGXCPU, which ends a program that does
/// not handle it and says unambiguously why; the hard limit a second later kills one
/// that ignores it. Both within this process's own hard limit.
pub(crate) fn cpu_rlimit(ms: u64) -> (u64, u64) {
    let (_, ceiling) = getrlimit(libc::RLIMIT_CPU);
    let soft = ms.div_ceil(1000).max(1);
    (soft.min(ceiling), soft.saturating_add(1).min(ceiling))
}

/// A `CString` from a Rust string that is known not to contain NUL (validated
/// earlier); NULs are rejected with `InvalidInput` all the same.
pub(crate) fn cstring(s: impl Into<Vec<u8>>) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in string"))
}

/// The fields of one `/proc/<pid>/mountinfo` line that Paddock reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MountLine<'a> {
    /// The path in the filesystem the mount exposes (`/` unless a subtree is).
    pub(crate) root: &'a str,
    /// Where it is mounted.
    pub(crate) point: &'a str,
    /// The filesystem type.
    pub(crate) fstype: &'a str,
    /// The mount source (a device, or a tag such as a tmpfs's).
    pub(crate) source: &'a str,
    /// The superblock options (a v1 cgroup's controllers among them).
    pub(crate) super_opts: &'a str,
}

/// The mounts a mountinfo text lists; a malformed line is skipped.
pub(crate) fn mount_lines(mountinfo: &str) -> impl Iterator<Item = MountLine<'_>> {
    mountinfo.lines().filter_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut fields = left.split_whitespace().skip(3);
        let (root, point) = (fields.next()?, fields.next()?);
        let mut rf = right.split_whitespace();
        Some(MountLine {
            root,
            point,
            fstype: rf.next()?,
            source: rf.next()?,
            super_opts: rf.next().unwrap_or(""),
        })
    })
}

/// Reads a small kernel file (`/proc`, cgroupfs) with one `open` and as few `read`s as
/// its size needs. Such files report size 0, so `std::fs::read_to_string` probes with
/// a growing buffer: eight system calls for `/proc/<pid>/status` instead of three.
pub(crate) fn read_small(path: impl AsRef<std::path::Path>) -> io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    String::from_utf8(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Whether the process behind `pidfd` has exited, without waiting.
pub(crate) fn pidfd_exited(pidfd: &impl std::os::fd::AsRawFd) -> bool {
    let mut pfd = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents & libc::POLLIN != 0
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

/// One `write(2)` of `buf` to `fd`; how many bytes it took.
pub(crate) fn write(fd: impl AsFd, buf: &[u8]) -> io::Result<usize> {
    Ok(rustix::io::write(fd, buf)?)
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

/// Registers `fd` with tokio's reactor for `interest`.
pub(crate) fn async_fd(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the AsyncFd owns the OwnedFd for its whole life, so the descriptor stays
    // open and the same, as registration requires; nothing in the crate swaps it out
    // through `get_mut`.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(Into::into)
}

/// The effective user id of this process.
pub(crate) fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Clock ticks a second, the unit of the CPU times in `/proc/<pid>/stat`.
pub(crate) fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64
}

/// CPU time the calling thread has used; zero if the clock cannot be read.
pub(crate) fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
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

/// The descriptor a warm container's agent gets its control channel on.
const INHERITED_CONTROL_FD: RawFd = 3;
/// Whether [`take_inherited_control_socket`] has taken it.
static CONTROL_FD_TAKEN: AtomicBool = AtomicBool::new(false);

/// Descriptor 3, when this process was started with a `SOCK_SEQPACKET` socket there
/// (the container agent's control channel), owned from now on and close-on-exec, so
/// that no command the process starts inherits it. Meant for the start of a process
/// that was handed the socket across `exec`; only the first call can take it, later
/// ones answer `None`, so it never has two owners.
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

/// Most descriptors one control message carries.
pub(crate) const MAX_PASSED_FDS: usize = 12;

/// Room for one `SCM_RIGHTS` message of [`MAX_PASSED_FDS`] descriptors.
const FD_SPACE: usize = rustix::cmsg_space!(ScmRights(MAX_PASSED_FDS));

/// Sends one message on a `SOCK_SEQPACKET` socket with `fds` attached.
pub(crate) fn send_with_fds(
    sock: impl AsFd,
    data: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    assert!(
        fds.len() <= MAX_PASSED_FDS,
        "at most {MAX_PASSED_FDS} descriptors"
    );
    let mut space = [MaybeUninit::<u8>::uninit(); FD_SPACE];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        let fits = control.push(SendAncillaryMessage::ScmRights(fds));
        debug_assert!(fits, "the buffer holds {MAX_PASSED_FDS} descriptors");
    }
    loop {
        match rustix::net::sendmsg(
            &sock,
            &[IoSlice::new(data)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(_) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receives one message from a `SOCK_SEQPACKET` socket into `buf`, with the
/// descriptors attached to it (close-on-exec). `Ok((0, _))` at the end. A message
/// cut to fit, its data or its descriptors (more than [`MAX_PASSED_FDS`]; the kernel
/// drops those that do not fit), is an `InvalidData` error, and the descriptors that
/// did arrive with it are closed.
pub(crate) fn recv_with_fds(sock: impl AsFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = [MaybeUninit::<u8>::uninit(); FD_SPACE];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = loop {
        match rustix::net::recvmsg(
            &sock,
            &mut [IoSliceMut::new(&mut *buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) => break r,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(passed) = message {
            fds.extend(passed);
        }
    }
    if received.flags.contains(ReturnFlags::TRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a control message larger than the buffer was cut",
        ));
    }
    if received.flags.contains(ReturnFlags::CTRUNC) {
        // `fds` goes with the error: what arrived is closed, not half-delivered.
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "a control message carried more descriptors than the {MAX_PASSED_FDS} it may; \
                 those past the room were lost, and the message is refused"
            ),
        ));
    }
    Ok((received.bytes, fds))
}

/// A connected pair of `SOCK_SEQPACKET` unix sockets, close-on-exec.
pub(crate) fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid array of two ints for socketpair to fill.
    cvt(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: both fds are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod read_small_tests {
    #[test]
    fn reads_a_proc_file_whole() {
        let status = super::read_small("/proc/self/status").unwrap();
        assert!(status.starts_with("Name:"), "{status}");
        assert!(status.contains("VmRSS:"), "{status}");
        assert_eq!(
            super::read_small("/proc/self/no-such-file")
                .unwrap_err()
                .kind(),
            std::io::ErrorKind::NotFound
        );
    }
}

#[cfg(test)]
mod fd_passing_tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn descriptors_travel_with_their_message() {
        let (a, b) = seqpacket_pair().unwrap();
        let (r, w) = pipe().unwrap();
        send_with_fds(&a, b"first", &[w.as_fd()]).unwrap();
        drop(w);
        send_with_fds(&a, b"second", &[]).unwrap();
        let mut buf = [0u8; 64];
        let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"first");
        assert_eq!(fds.len(), 1);
        // The received descriptor is the pipe's write end.
        let mut writer = std::fs::File::from(fds.into_iter().next().unwrap());
        writer.write_all(b"through").unwrap();
        drop(writer);
        let mut got = String::new();
        std::fs::File::from(r).read_to_string(&mut got).unwrap();
        assert_eq!(got, "through");
        let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!((&buf[..n], fds.len()), (&b"second"[..], 0));
        drop(a);
        assert_eq!(recv_with_fds(&b, &mut buf).unwrap().0, 0);
    }

    #[test]
    fn more_descriptors_than_the_buffer_holds_are_an_error_and_none_stays_open() {
        let (a, b) = seqpacket_pair().unwrap();
        let (r, w) = pipe().unwrap();
        {
            // Four times what a message may carry, past the receiver's room: the kernel
            // installs what fits and drops the rest.
            let many = vec![w.as_fd(); 4 * MAX_PASSED_FDS];
            let mut space =
                vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(many.len()))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            assert!(control.push(SendAncillaryMessage::ScmRights(&many)));
            rustix::net::sendmsg(
                &a,
                &[IoSlice::new(b"many")],
                &mut control,
                SendFlags::empty(),
            )
            .unwrap();
        }
        drop(w);
        let mut buf = [0u8; 64];
        let e = recv_with_fds(&b, &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        // The copies that did arrive were closed: the pipe has no writer left. (A
        // program another test starts meanwhile may hold a copy until its exec, hence
        // the wait.)
        let mut ready = [libc::pollfd {
            fd: r.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        assert_eq!(
            poll(&mut ready, 5_000).unwrap(),
            1,
            "a received copy stayed open"
        );
        assert_ne!(ready[0].revents & libc::POLLHUP, 0);
    }

    #[test]
    fn an_oversized_message_is_an_error_not_a_cut() {
        let (a, b) = seqpacket_pair().unwrap();
        send_with_fds(&a, &[7u8; 100], &[]).unwrap();
        let mut small = [0u8; 10];
        let e = recv_with_fds(&b, &mut small).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
