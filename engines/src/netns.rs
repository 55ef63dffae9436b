//! Empty network namespaces for network policy `none`.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// Creates a new, empty network namespace (only a loopback device, down) and returns
/// an fd that keeps it alive. A short-lived thread does the `unshare`, so no thread of
/// the host ever changes namespace.
pub fn create_empty() -> io::Result<OwnedFd> {
    std::thread::Builder::new()
        .name("paddock-netns".into())
        .spawn(|| {
            // SAFETY: unshare only affects this thread, which exits right after.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } == -1 {
                return Err(io::Error::last_os_error());
            }
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
        })?
        .join()
        .map_err(|_| io::Error::other("the namespace thread panicked"))?
}
