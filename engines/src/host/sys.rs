//! Thin, checked wrappers over the Linux calls the engines make.
//!
//! Everything `unsafe` in the crate lives here or in [`crate::host::spawn`].

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

/// Most descriptors one control message carries.
pub(crate) const MAX_PASSED_FDS: usize = 4;

/// Sends one message on a `SOCK_SEQPACKET` socket with `fds` attached.
pub(crate) fn send_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    assert!(
        fds.len() <= MAX_PASSED_FDS,
        "at most {MAX_PASSED_FDS} descriptors"
    );
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; zeroed is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds);
        // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic.
        let space = unsafe { libc::CMSG_SPACE(bytes as u32) } as usize;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer (64 bytes) holds one cmsghdr with up to four
        // descriptors; CMSG_FIRSTHDR points into it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(bytes as u32) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(cmsg).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
    loop {
        // SAFETY: sendmsg with the message built above.
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one message from a `SOCK_SEQPACKET` socket into `buf`, with the
/// descriptors attached to it (close-on-exec). `Ok((0, _))` at the end.
pub(crate) fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; zeroed is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let n = loop {
        // SAFETY: recvmsg into the buffers above.
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote, within msg_controllen.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a control message larger than the buffer was cut",
        ));
    }
    Ok((n, fds))
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
        send_with_fds(a.as_raw_fd(), b"first", &[w.as_raw_fd()]).unwrap();
        drop(w);
        send_with_fds(a.as_raw_fd(), b"second", &[]).unwrap();
        let mut buf = [0u8; 64];
        let (n, fds) = recv_with_fds(b.as_raw_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"first");
        assert_eq!(fds.len(), 1);
        // The received descriptor is the pipe's write end.
        let mut writer = std::fs::File::from(fds.into_iter().next().unwrap());
        writer.write_all(b"through").unwrap();
        drop(writer);
        let mut got = String::new();
        std::fs::File::from(r).read_to_string(&mut got).unwrap();
        assert_eq!(got, "through");
        let (n, fds) = recv_with_fds(b.as_raw_fd(), &mut buf).unwrap();
        assert_eq!((&buf[..n], fds.len()), (&b"second"[..], 0));
        drop(a);
        assert_eq!(recv_with_fds(b.as_raw_fd(), &mut buf).unwrap().0, 0);
    }

    #[test]
    fn an_oversized_message_is_an_error_not_a_cut() {
        let (a, b) = seqpacket_pair().unwrap();
        send_with_fds(a.as_raw_fd(), &[7u8; 100], &[]).unwrap();
        let mut small = [0u8; 10];
        let e = recv_with_fds(b.as_raw_fd(), &mut small).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
