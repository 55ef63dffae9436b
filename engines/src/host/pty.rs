//! Pseudo-terminals: opening one, and setting its window size.
//!
//! Both sides of a terminal are close-on-exec from the moment they exist: the master
//! is opened with `O_CLOEXEC` and so is the slave, instead of `FD_CLOEXEC` being set
//! afterwards. A program another thread starts in between with
//! `std::process::Command` (which keeps every descriptor not marked close-on-exec)
//! therefore never inherits a terminal it was not given.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use paddock_core::TerminalSize;
use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;

fn winsize(size: TerminalSize) -> Winsize {
    Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// Sets the window size of the terminal behind `fd` (either side).
pub(crate) fn set_window_size(fd: impl AsFd, size: TerminalSize) -> io::Result<()> {
    Ok(rustix::termios::tcsetwinsize(fd, winsize(size))?)
}

/// A new pseudo-terminal of `size`: (master, slave), both close-on-exec, neither the
/// calling process's controlling terminal.
pub(crate) fn open(size: TerminalSize) -> io::Result<(OwnedFd, OwnedFd)> {
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    // The slave through the master (Linux 4.13 and later), which also finds it when
    // the devpts instance is not the one mounted at /dev/pts; by name otherwise.
    let slave = match rustix::pty::ioctl_tiocgptpeer(&master, flags) {
        Ok(slave) => slave,
        Err(_) => open_slave_by_name(&master)?,
    };
    set_window_size(&slave, size)?;
    Ok((master, slave))
}

/// The slave of `master`, opened by its name (`std` opens with `O_CLOEXEC`).
fn open_slave_by_name(master: &OwnedFd) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::OpenOptionsExt;
    let name = rustix::pty::ptsname(master, Vec::new())?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(std::ffi::OsStr::from_bytes(name.as_bytes()))?;
    Ok(file.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    const SIZE: TerminalSize = TerminalSize { rows: 24, cols: 80 };

    fn close_on_exec(fd: &OwnedFd) -> bool {
        rustix::io::fcntl_getfd(fd)
            .unwrap()
            .contains(rustix::io::FdFlags::CLOEXEC)
    }

    #[test]
    fn both_sides_are_close_on_exec_and_the_size_is_set() {
        let (master, slave) = open(SIZE).unwrap();
        assert!(close_on_exec(&master), "the master");
        assert!(close_on_exec(&slave), "the slave");
        let size = rustix::termios::tcgetwinsize(&slave).unwrap();
        assert_eq!((size.ws_row, size.ws_col), (24, 80));
        set_window_size(
            &master,
            TerminalSize {
                rows: 50,
                cols: 132,
            },
        )
        .unwrap();
        let size = rustix::termios::tcgetwinsize(&slave).unwrap();
        assert_eq!((size.ws_row, size.ws_col), (50, 132));
    }

    #[test]
    fn the_slave_opened_by_name_is_close_on_exec_too() {
        let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
        let master = rustix::pty::openpt(flags).unwrap();
        rustix::pty::unlockpt(&master).unwrap();
        let slave = open_slave_by_name(&master).unwrap();
        assert!(close_on_exec(&slave));
        set_window_size(&slave, SIZE).unwrap();
        let size = rustix::termios::tcgetwinsize(&master).unwrap();
        assert_eq!((size.ws_row, size.ws_col), (24, 80));
    }

    /// A program started (with `std::process::Command`, which keeps whatever is not
    /// close-on-exec) while another thread opens terminals gets none of them: the
    /// descriptors are close-on-exec from the moment they exist.
    #[test]
    fn a_program_started_meanwhile_inherits_no_terminal() {
        let stop = Arc::new(AtomicBool::new(false));
        let opener = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    drop(open(SIZE).unwrap());
                }
            })
        };
        let mut leaked = None;
        for _ in 0..300 {
            let out = std::process::Command::new("/bin/sh")
                .args(["-c", "ls -l /proc/$$/fd"])
                .stdin(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .output()
                .unwrap();
            let listing = String::from_utf8_lossy(&out.stdout).into_owned();
            if listing.contains("/dev/pt") {
                leaked = Some(listing);
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        opener.join().unwrap();
        assert_eq!(leaked, None, "a started program inherited a terminal");
    }
}
