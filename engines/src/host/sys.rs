//! Thin, checked wrappers over the Linux calls the engines make.
//!
//! Each function here is safe to call: it checks what the system call needs (valid
//! pointers, descriptors the caller owns or borrows) and turns its answer into an
//! `io::Result`. The rest of the crate calls these instead of `libc` directly.

// The system calls themselves are `unsafe` to make; this module is where they are
// made, each behind a safe function with its reasoning beside it.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Messages with descriptors attached, on a `SOCK_SEQPACKET` socket: the container
/// agent's control channel and the subprocess engine's zygote both speak through
/// these (they live with the agent, which is built on its own; see `paddock_agent`).
pub(crate) use paddock_agent::control::{recv_with_fds, send_with_fds, MAX_PASSED_FDS};
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

/// Whether the kernel lacks `listxattrat` (learned at the first call that says so).
static NO_LISTXATTRAT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The size of the attribute names of entry `name` of directory `dir` (not
/// following a symlink there), by `listxattrat(2)` (Linux 6.13): one system call,
/// where going through `/proc/self/fd` costs a path walk in procfs. `None` where
/// the kernel lacks the call (or a filter refuses it): the caller goes the long
/// way.
pub(crate) fn xattr_names_len(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::CStr,
) -> Option<usize> {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::Ordering;
    // The same number on every architecture with the unified table.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    const SYS_LISTXATTRAT: libc::c_long = 465;
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    return None;
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        if name.is_empty() || NO_LISTXATTRAT.load(Ordering::Relaxed) {
            return None;
        }
        // SAFETY: `dir` is an open descriptor and `name` a NUL-terminated string;
        // a null list of size 0 asks for the size only, so nothing is written.
        let n = unsafe {
            libc::syscall(
                SYS_LISTXATTRAT,
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW as libc::c_uint,
                std::ptr::null_mut::<libc::c_char>(),
                0usize,
            )
        };
        if n >= 0 {
            return Some(n as usize);
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ENOSYS) | Some(libc::EPERM) => {
                NO_LISTXATTRAT.store(true, Ordering::Relaxed);
                None
            }
            // A file system without attributes has none.
            Some(libc::ENOTSUP) => Some(0),
            _ => None,
        }
    }
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
