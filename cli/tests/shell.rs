//! `paddock shell` driven the way a person uses it: on a real pseudo-terminal, with a
//! window size, typed input, a resize, and the remote shell's exit status.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn open_pty(rows: u16, cols: u16) -> (OwnedFd, OwnedFd) {
    let (mut master, mut slave) = (-1, -1);
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two descriptors.
    let r = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &ws,
        )
    };
    assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: fresh descriptors nobody else owns.
    unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) }
}

fn resize(master: &OwnedFd, rows: u16, cols: u16) {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize; the kernel signals the foreground group.
    assert_eq!(
        unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) },
        0
    );
}

/// Reads the master until `needle` shows up; panics after 30 s with what came.
fn read_until(master: &OwnedFd, seen: &mut Vec<u8>, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !String::from_utf8_lossy(seen).contains(needle) {
        assert!(
            Instant::now() < deadline,
            "no {needle:?} on the terminal; it showed {:?}",
            String::from_utf8_lossy(seen)
        );
        let mut pfd = libc::pollfd {
            fd: master.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one descriptor.
        if unsafe { libc::poll(&mut pfd, 1, 200) } <= 0 {
            continue;
        }
        let mut buf = [0u8; 4096];
        // SAFETY: read into a local buffer.
        let n = unsafe { libc::read(master.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            panic!(
                "the terminal closed before {needle:?}; it showed {:?}",
                String::from_utf8_lossy(seen)
            );
        }
        seen.extend_from_slice(&buf[..n as usize]);
    }
}

fn type_in(master: &OwnedFd, text: &str) {
    // SAFETY: write from a local buffer.
    let n = unsafe { libc::write(master.as_raw_fd(), text.as_ptr().cast(), text.len()) };
    assert_eq!(n as usize, text.len());
}

fn drive(engine: &str) {
    let (master, slave) = open_pty(33, 99);
    let stdio = |fd: &OwnedFd| Stdio::from(fd.try_clone().unwrap());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_paddock"));
    cmd.args(["shell", "--engine", engine])
        .stdin(stdio(&slave))
        .stdout(stdio(&slave))
        .stderr(stdio(&slave));
    // SAFETY: setsid and TIOCSCTTY are async-signal-safe: the pty becomes the
    // controlling terminal of `paddock shell`, as in a real terminal window.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() == -1 || libc::ioctl(0, libc::TIOCSCTTY, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("paddock shell starts");
    drop(slave);
    let mut seen = Vec::new();
    // The markers are computed remotely, so the echo of the typed line never matches.
    type_in(
        &master,
        "echo sum-$((40+2)); stty size | tr ' ' x; test -t 0 && echo a-tty\n",
    );
    read_until(&master, &mut seen, "sum-42");
    read_until(&master, &mut seen, "33x99");
    read_until(&master, &mut seen, "a-tty\r\n");
    resize(&master, 44, 111);
    // SIGWINCH reaches `paddock shell`, which resizes the remote terminal.
    std::thread::sleep(Duration::from_millis(300));
    type_in(&master, "stty size | tr ' ' y\n");
    read_until(&master, &mut seen, "44y111");
    type_in(&master, "exit 7\n");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "paddock shell did not exit");
        // Keep the master drained so the child never blocks on output.
        let mut buf = [0u8; 4096];
        // SAFETY: non-blocking enough: poll first.
        let mut pfd = libc::pollfd {
            fd: master.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        if unsafe { libc::poll(&mut pfd, 1, 50) } > 0 {
            let _ = unsafe { libc::read(master.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        }
    };
    assert_eq!(status.code(), Some(7), "the remote shell's exit status");
}

#[test]
fn a_shell_on_a_real_terminal_with_resize_and_exit_status() {
    drive("subprocess");
}

#[test]
fn a_shell_in_a_container() {
    let on_path = |name: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
            || ["/usr/sbin", "/usr/bin", "/sbin"]
                .iter()
                .any(|d| std::path::Path::new(d).join(name).is_file())
    };
    if std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none()
        && !on_path("crun")
        && !on_path("runc")
    {
        println!("skipped: no OCI runtime on this host (set PADDOCK_REQUIRE_CONTAINERS=1 to require one)");
        return;
    }
    drive("container");
}

#[test]
fn the_isolate_engine_has_no_shell() {
    let out = Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args(["shell", "--engine", "isolate"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--engine subprocess or container"), "{err}");
}
