//! Pseudo-terminals: opening one, and setting its window size.

// Opening a pseudo-terminal and its window-size ioctl are `unsafe` to call; they are
// made here behind safe functions.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use paddock_core::TerminalSize;

use crate::host::sys;

fn winsize(size: TerminalSize) -> libc::winsize {
    libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// Sets the window size of the terminal behind `fd` (either side).
pub(crate) fn set_window_size(fd: RawFd, size: TerminalSize) -> io::Result<()> {
    let ws = winsize(size);
    // SAFETY: TIOCSWINSZ reads a winsize from a valid pointer.
    sys::cvt(unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &ws) }).map(|_| ())
}

/// A new pseudo-terminal of `size`: (master, slave), both close-on-exec.
pub(crate) fn open(size: TerminalSize) -> io::Result<(OwnedFd, OwnedFd)> {
    let (mut master, mut slave) = (-1, -1);
    let ws = winsize(size);
    // SAFETY: openpty writes two descriptors; the name and termios are optional.
    sys::cvt(unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &ws,
        )
    })?;
    // SAFETY: fresh descriptors nobody else owns.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    for fd in [&master, &slave] {
        // SAFETY: fcntl on descriptors we own.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok((master, slave))
}
