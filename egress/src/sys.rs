//! The system calls of the gateway: a network namespace set up from a thread of its
//! own, and a redirected connection's original destination.

// `unshare`, the interface and route ioctls, `getsockopt` and the netlink socket
// calls are `unsafe` to call; each is made here behind a safe function.
#![allow(unsafe_code)]

use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::process::{Command, Stdio};

/// The address the namespace's own traffic comes from: the IPv4 dummy address
/// (RFC 7600), on the loopback device, so that the default route has a source.
pub(crate) const SOURCE_ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 0, 8);

/// What one new namespace holds: its fd and the gateway's sockets, made in it.
#[derive(Debug)]
pub(crate) struct Namespace {
    pub(crate) netns: OwnedFd,
    pub(crate) proxy: std::net::TcpListener,
    pub(crate) transparent: std::net::TcpListener,
    pub(crate) dns_udp: std::net::UdpSocket,
    pub(crate) dns_tcp: std::net::TcpListener,
    /// A netfilter netlink socket of the namespace, for its firewall's sets.
    pub(crate) control: OwnedFd,
    /// Another, for its firewall's log of refused connections.
    pub(crate) log: OwnedFd,
}

/// Makes a network namespace whose only device is its loopback, with a default route
/// over it, the firewall `ruleset` loaded by `nft`, and the gateway's sockets bound in
/// it (its listeners, and two netlink sockets to its firewall). A short-lived thread does the work, so no thread of the host changes
/// namespace.
pub(crate) fn make_namespace(
    nft: &Path,
    ruleset: &str,
    ports: crate::Ports,
) -> io::Result<Namespace> {
    let nft = nft.to_path_buf();
    let ruleset = ruleset.to_string();
    std::thread::Builder::new()
        .name("paddock-egress-ns".into())
        .spawn(move || {
            // SAFETY: unshare only affects this thread, which exits right after.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } == -1 {
                return Err(io::Error::last_os_error());
            }
            let sock = datagram_socket()?;
            set_flags_up(&sock, b"lo")?;
            set_addr(&sock, b"lo:1", libc::SIOCSIFADDR, SOURCE_ADDR)?;
            set_addr(&sock, b"lo:1", libc::SIOCSIFNETMASK, Ipv4Addr::BROADCAST)?;
            add_default_route(&sock, b"lo")?;
            let lo = |port| SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
            let proxy = std::net::TcpListener::bind(lo(ports.proxy))?;
            let transparent = std::net::TcpListener::bind(lo(ports.transparent))?;
            let dns_udp = std::net::UdpSocket::bind(lo(ports.dns))?;
            let dns_tcp = std::net::TcpListener::bind(lo(ports.dns))?;
            let control = netfilter_socket()?;
            let log = netfilter_socket()?;
            load_rules(&nft, &ruleset)?;
            let netns = thread_netns()?;
            for s in [&proxy, &transparent, &dns_tcp] {
                s.set_nonblocking(true)?;
            }
            dns_udp.set_nonblocking(true)?;
            Ok(Namespace {
                netns,
                proxy,
                transparent,
                dns_udp,
                dns_tcp,
                control,
                log,
            })
        })?
        .join()
        .map_err(|_| io::Error::other("the namespace thread panicked"))?
}

/// Runs `nft -f -` with `ruleset`; the child is in the calling thread's namespace.
fn load_rules(nft: &Path, ruleset: &str) -> io::Result<()> {
    let mut child = Command::new(nft)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env_clear()
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("starting {}: {e}", nft.display())))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(ruleset.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{} refused the sandbox's rules ({}): {}",
            nft.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// An fd of the calling thread's network namespace, which keeps it alive.
pub(crate) fn thread_netns() -> io::Result<OwnedFd> {
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
}

pub(crate) fn datagram_socket() -> io::Result<OwnedFd> {
    // SAFETY: a datagram socket for the interface ioctls.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(sock) })
}

fn ifreq(name: &[u8]) -> libc::ifreq {
    // SAFETY: ifreq is plain data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req
        .ifr_name
        .iter_mut()
        .zip(name.iter().take(libc::IFNAMSIZ - 1))
    {
        *dst = *src as libc::c_char;
    }
    req
}

fn sockaddr_v4(addr: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(addr).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr are the same size, and the kernel reads a
    // sockaddr_in through it for AF_INET.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

pub(crate) fn set_flags_up(sock: &OwnedFd, name: &[u8]) -> io::Result<()> {
    let mut req = ifreq(name);
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

fn set_addr(sock: &OwnedFd, name: &[u8], request: libc::Ioctl, addr: Ipv4Addr) -> io::Result<()> {
    let mut req = ifreq(name);
    req.ifr_ifru.ifru_addr = sockaddr_v4(addr);
    // SAFETY: the address ioctls read the ifreq we pass.
    if unsafe { libc::ioctl(sock.as_raw_fd(), request, &req) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn add_default_route(sock: &OwnedFd, dev: &[u8]) -> io::Result<()> {
    let mut name = [0 as libc::c_char; libc::IFNAMSIZ];
    for (d, s) in name.iter_mut().zip(dev) {
        *d = *s as libc::c_char;
    }
    // SAFETY: rtentry is plain data; all zeroes is a valid value.
    let mut rt: libc::rtentry = unsafe { std::mem::zeroed() };
    rt.rt_dst = sockaddr_v4(Ipv4Addr::UNSPECIFIED);
    rt.rt_genmask = sockaddr_v4(Ipv4Addr::UNSPECIFIED);
    rt.rt_flags = libc::RTF_UP;
    rt.rt_dev = name.as_mut_ptr();
    // SAFETY: SIOCADDRT reads the rtentry, and the device name it points to, which
    // outlives the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCADDRT, &rt) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The destination a redirected connection was meant for (`SO_ORIGINAL_DST`), or
/// `None` when it was not redirected.
pub(crate) fn original_dst(stream: &tokio::net::TcpStream) -> Option<SocketAddr> {
    const SO_ORIGINAL_DST: libc::c_int = 80;
    // SAFETY: sockaddr_in is plain data.
    let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `sin`.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_IP,
            SO_ORIGINAL_DST,
            (&mut sin as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    };
    if r == -1 || sin.sin_family != libc::AF_INET as libc::sa_family_t {
        return None;
    }
    Some(SocketAddr::V4(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
        u16::from_be(sin.sin_port),
    )))
}

/// A pipe for [`splice`], both ends non-blocking, grown to 1 MiB where the host
/// allows it (the default is 64 KiB).
pub(crate) fn splice_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: fcntl on a descriptor we own; a refusal leaves the default size.
    unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20) };
    Ok((r, w))
}

/// Moves up to `len` bytes from `from` to `to` in the kernel (one of them a pipe),
/// without blocking: `WouldBlock` when either side is not ready.
pub(crate) fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    loop {
        // SAFETY: splice between two descriptors the caller holds open, with no
        // offsets.
        let n = unsafe {
            libc::splice(
                from,
                std::ptr::null_mut(),
                to,
                std::ptr::null_mut(),
                len,
                libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Shuts down the writing side of socket `fd` (the peer reads EOF).
pub(crate) fn shutdown_write(fd: RawFd) {
    // SAFETY: shutdown on a descriptor the caller holds open.
    unsafe { libc::shutdown(fd, libc::SHUT_WR) };
}

/// A netfilter netlink socket (`NETLINK_NETFILTER`) of the calling thread's network
/// namespace, bound with a port id the kernel picks. It stays in that namespace
/// whichever thread uses it later.
pub(crate) fn netfilter_socket() -> io::Result<OwnedFd> {
    // SAFETY: a netlink socket; the descriptor is checked and owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        )
    };
    if fd == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_nl is plain data; all zeroes (port id 0: the kernel picks one)
    // is a valid value.
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: bind reads `sa`, of the length given.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    // An error's answer carries the request's header only, not the whole request
    // (which may be long: every address of a DNS answer).
    set_socket_option(
        &fd,
        libc::SOL_NETLINK,
        libc::NETLINK_CAP_ACK,
        1 as libc::c_int,
    )?;
    Ok(fd)
}

fn set_socket_option<T>(
    fd: &OwnedFd,
    level: libc::c_int,
    name: libc::c_int,
    value: T,
) -> io::Result<()> {
    // SAFETY: setsockopt reads `value`, of the length given.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes `recv` on `fd` give up (`WouldBlock`) after `timeout`.
pub(crate) fn set_recv_timeout(fd: &OwnedFd, timeout: std::time::Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    set_socket_option(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, tv)
}

/// Grows `fd`'s receive buffer to `bytes`: past the host's `rmem_max` where Paddock
/// may (`CAP_NET_ADMIN`), else as far as that allows.
pub(crate) fn set_recv_buffer(fd: &OwnedFd, bytes: usize) -> io::Result<()> {
    let bytes = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    set_socket_option(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, bytes)
        .or_else(|_| set_socket_option(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, bytes))
}

/// Sends one datagram, all of `bytes`, on netlink socket `fd` (to the kernel).
pub(crate) fn netlink_send(fd: RawFd, bytes: &[u8]) -> io::Result<()> {
    loop {
        // SAFETY: send reads `bytes`, of the length given, from a descriptor the caller
        // holds open.
        let n = unsafe { libc::send(fd, bytes.as_ptr().cast(), bytes.len(), 0) };
        if n >= 0 {
            if n as usize != bytes.len() {
                return Err(io::Error::other(
                    "the kernel took part of a netlink message",
                ));
            }
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one datagram from netlink socket `fd` into `buf` (`MSG_DONTWAIT` when
/// `nonblocking`); its length, which may exceed `buf`'s (the rest is lost).
pub(crate) fn netlink_recv(fd: RawFd, buf: &mut [u8], nonblocking: bool) -> io::Result<usize> {
    let flags = if nonblocking { libc::MSG_DONTWAIT } else { 0 } | libc::MSG_TRUNC;
    loop {
        // SAFETY: recv writes at most `buf.len()` bytes into `buf`, from a descriptor
        // the caller holds open.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Moves the calling thread into network namespace `netns` (for tests, from a thread
/// of their own).
#[cfg(test)]
pub(crate) fn enter_netns(netns: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: setns changes the calling thread's namespace only.
    if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `fd`, registered with the current tokio runtime's reactor for reading.
pub(crate) fn watch_readable(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is open, and refers to the same file description, for as
    // long as it lives, and the `AsyncFd` owns it.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(io::Error::from)
}

/// Every address of the calling thread's network namespace's interfaces
/// (`getifaddrs`), IPv4 and IPv6, up or down.
pub(crate) fn interface_addrs() -> io::Result<Vec<std::net::IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success the list is freed below.
    if unsafe { libc::getifaddrs(&mut head) } == -1 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut at = head;
    while !at.is_null() {
        // SAFETY: `at` is a node of the list getifaddrs returned, alive until
        // freeifaddrs; `ifa_addr` is null or points at a sockaddr of its family.
        unsafe {
            let sa = (*at).ifa_addr;
            if !sa.is_null() {
                match i32::from((*sa).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(sa as *const libc::sockaddr_in);
                        out.push(std::net::IpAddr::V4(Ipv4Addr::from(u32::from_be(
                            sin.sin_addr.s_addr,
                        ))));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(sa as *const libc::sockaddr_in6);
                        out.push(std::net::IpAddr::V6(std::net::Ipv6Addr::from(
                            sin6.sin6_addr.s6_addr,
                        )));
                    }
                    _ => {}
                }
            }
            at = (*at).ifa_next;
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}
