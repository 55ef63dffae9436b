//! Pseudo-terminals for background processes that ask for one.
//!
//! Both sides are close-on-exec from the moment they exist (`O_CLOEXEC` at open), so
//! a command started meanwhile never inherits a terminal it was not given.

use std::io;
use std::os::fd::OwnedFd;

use paddock_core::TerminalSize;
use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;

/// A new pseudo-terminal of `size`: (master, slave), both close-on-exec, neither the
/// agent's controlling terminal.
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
    rustix::termios::tcsetwinsize(
        &slave,
        Winsize {
            ws_row: size.rows,
            ws_col: size.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )?;
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

    fn close_on_exec(fd: &OwnedFd) -> bool {
        rustix::io::fcntl_getfd(fd)
            .unwrap()
            .contains(rustix::io::FdFlags::CLOEXEC)
    }

    #[test]
    fn both_sides_are_close_on_exec_and_the_size_is_set() {
        let (master, slave) = open(TerminalSize { rows: 24, cols: 80 }).unwrap();
        assert!(close_on_exec(&master), "the master");
        assert!(close_on_exec(&slave), "the slave");
        let size = rustix::termios::tcgetwinsize(&master).unwrap();
        assert_eq!((size.ws_row, size.ws_col), (24, 80));
    }
}
