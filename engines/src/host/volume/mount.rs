//! The plain mount calls a volume is made and taken apart with: a tmpfs mount, a
//! bind, a lazy unmount, `statvfs` and `syncfs`.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use super::Quota;

pub(super) fn statvfs(p: &Path) -> io::Result<libc::statvfs> {
    let path = cstring(p)?;
    // SAFETY: statvfs is plain data, filled by the kernel from a valid C path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Writes everything of the filesystem mounted at `p` to its device (`syncfs`).
pub(super) fn syncfs(p: &Path) -> io::Result<()> {
    let dir = File::open(p)?;
    // SAFETY: syncfs on a valid fd.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Unmounts `p` lazily (`MNT_DETACH`).
pub(super) fn umount(p: &Path) -> io::Result<()> {
    let path = cstring(p)?;
    // SAFETY: umount2 with a valid C path.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Bind-mounts the directory `from` on `to`, `nosuid,nodev,noatime`.
pub(super) fn bind(from: &Path, to: &Path) -> io::Result<()> {
    let (source, target) = (cstring(from)?, cstring(to)?);
    // SAFETY: mount with valid C strings and no filesystem type or data: a bind,
    // then a remount of the bind with its flags.
    unsafe {
        if libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        if libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME,
            std::ptr::null(),
        ) != 0
        {
            let e = io::Error::last_os_error();
            libc::umount2(target.as_ptr(), libc::MNT_DETACH);
            return Err(e);
        }
    }
    Ok(())
}

pub(super) fn cstring(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path holds a NUL byte"))
}

/// Mounts a tmpfs of `quota` and root directory `mode` on `at`, its source tagged
/// with the owner.
pub(super) fn mount_tmpfs(tag: &str, at: &Path, quota: Quota, mode: u32) -> io::Result<()> {
    let source = CString::new(tag).expect("a tag holds no NUL");
    let target = cstring(at)?;
    let fstype = CString::new("tmpfs").expect("no NUL");
    let options = CString::new(format!(
        "size={},nr_inodes={},mode={mode:o}",
        quota.bytes, quota.files
    ))
    .expect("no NUL");
    // SAFETY: mount with valid C strings; the data argument is a C string.
    let r = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            options.as_ptr().cast(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
