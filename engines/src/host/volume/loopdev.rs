//! Loop devices: attaching an image to a free one (`LOOP_CTL_GET_FREE`,
//! `LOOP_CONFIGURE`, autoclear) and mounting it as ext4.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::mount::cstring;

// The loop device ABI (linux/loop.h).
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// Attaches `image` to a free loop device (detached by the kernel once unmounted)
/// and mounts it on `at` as ext4, `nosuid,nodev`.
pub(super) fn mount_loop(image: &Path, at: &Path) -> io::Result<()> {
    let context =
        |what: String| move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
    let img = OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .map_err(context(format!("opening the image `{}`", image.display())))?;
    let ctl = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
        .map_err(context("opening /dev/loop-control".to_string()))?;
    // One attach at a time in this process: threads that asked for a free device
    // together would all get the same one, and all but one would have to try
    // again, as many rounds as there are threads. Other processes can still take a
    // device first; that is retried, a bounded number of times.
    static ATTACH: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
    let _one = ATTACH.lock();
    let mut tries = 0;
    let (dev_path, dev) = loop {
        // SAFETY: an ioctl without argument on the loop-control fd.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let dev_path = PathBuf::from(format!("/dev/loop{n}"));
        let dev = open_loop_device(&dev_path, n as u32)
            .map_err(context(format!("opening `{}`", dev_path.display())))?;
        // SAFETY: LoopConfig is plain data; zero is a valid value of every field.
        let mut config: LoopConfig = unsafe { std::mem::zeroed() };
        config.fd = img.as_raw_fd() as u32;
        config.info.flags = LO_FLAGS_AUTOCLEAR;
        let name = image.as_os_str().as_encoded_bytes();
        let keep = name.len().min(config.info.file_name.len() - 1);
        config.info.file_name[..keep].copy_from_slice(&name[name.len() - keep..]);
        // SAFETY: LOOP_CONFIGURE reads one LoopConfig, which outlives the call.
        let r = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE as _, &config) };
        if r == 0 {
            drop(_one);
            break (dev_path, dev);
        }
        let e = io::Error::last_os_error();
        // Another process took the free device first.
        if e.raw_os_error() == Some(libc::EBUSY) && tries < 64 {
            tries += 1;
            std::thread::sleep(std::time::Duration::from_micros(200 * tries));
            continue;
        }
        return Err(context(format!(
            "attaching the image to `{}`",
            dev_path.display()
        ))(e));
    };
    let source = cstring(&dev_path)?;
    let target = cstring(at)?;
    let fstype = CString::new("ext4").expect("no NUL");
    // `discard`: blocks the sandbox frees are punched out of the sparse image, so a
    // pooled sandbox's image shrinks again when it is emptied between leases.
    let options = CString::new("discard").expect("no NUL");
    // SAFETY: mount with valid C strings; the data argument is a C string.
    let r = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME,
            options.as_ptr().cast(),
        )
    };
    let result = if r == 0 {
        Ok(())
    } else {
        Err(context(format!(
            "mounting `{}` on `{}`",
            dev_path.display(),
            at.display()
        ))(io::Error::last_os_error()))
    };
    // The mount holds the device now; closing ours lets autoclear detach it once
    // the filesystem is unmounted (or at once, if the mount failed).
    drop(dev);
    drop(img);
    result
}

/// Opens the loop device `/dev/loop<n>` that `LOOP_CTL_GET_FREE` just made. Its
/// node appears in a devtmpfs `/dev` as the kernel adds the device, which can trail
/// the ioctl by a moment; a static `/dev` never gets one, so after a short wait it is
/// made here (block device 7:`n`).
fn open_loop_device(path: &Path, n: u32) -> io::Result<File> {
    let open = || OpenOptions::new().read(true).write(true).open(path);
    for _ in 0..50 {
        match open() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::thread::sleep(std::time::Duration::from_millis(2))
            }
            other => return other,
        }
    }
    // The device number as the kernel gave it (the minor is not `n` when the loop
    // driver reserves minors for partitions).
    let dev = crate::host::sys::read_small(format!("/sys/block/loop{n}/dev"))?;
    let (major, minor) = dev
        .trim()
        .split_once(':')
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
        .ok_or_else(|| io::Error::other(format!("unreadable device number `{}`", dev.trim())))?;
    let node = cstring(path)?;
    // SAFETY: mknod with a valid C path; makedev is plain arithmetic.
    let r = unsafe {
        libc::mknod(
            node.as_ptr(),
            libc::S_IFBLK | 0o600,
            libc::makedev(major, minor),
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
    }
    open()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loop_config_has_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
    }
}
