//! Thin, checked wrappers over the Linux calls the engines make.
//!
//! Everything `unsafe` in the crate lives here or in [`crate::spawn`].

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

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

/// A `CString` from a Rust string that is known not to contain NUL (validated
/// earlier); NULs are rejected with `InvalidInput` all the same.
pub(crate) fn cstring(s: impl Into<Vec<u8>>) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in string"))
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
