//! Reading and replacing a file's user metadata ([`FileMetadata`]) in its extended
//! attributes, for the engines on the host and the agent in containers.

use std::io;
use std::path::Path;

use rustix::fs::XattrFlags;

use crate::files::{
    check_metadata, FileMetadata, MAX_METADATA_BYTES, MAX_METADATA_KEY, METADATA_XATTR_PREFIX,
};

/// The attribute names of `path`, NUL-separated (`follow`: through a symlink at
/// `path`). A file system without attributes has none.
fn names(path: &Path, follow: bool) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 1024];
    loop {
        let listed = if follow {
            rustix::fs::listxattr(path, &mut buf[..])
        } else {
            rustix::fs::llistxattr(path, &mut buf[..])
        };
        match listed {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            // Bounded: the kernel lists at most 64 KiB of names.
            Err(rustix::io::Errno::RANGE) if buf.len() < 1 << 16 => buf.resize(1 << 16, 0),
            Err(rustix::io::Errno::NOTSUP) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// The user metadata of `path` (`follow`: through a symlink at `path`): its
/// attributes in the [`METADATA_XATTR_PREFIX`] namespace, the prefix stripped,
/// within the bounds [`check_metadata`] sets on what is written (a program in the
/// sandbox may set others): an attribute whose key or value is not printable ASCII,
/// whose key is longer than [`MAX_METADATA_KEY`], or that goes while it is read, is
/// left out, and reading stops at [`MAX_METADATA_BYTES`] in all. A path that cannot
/// be read has none.
pub fn read_metadata(path: &Path, follow: bool) -> FileMetadata {
    let mut out = FileMetadata::new();
    let Ok(names) = names(path, follow) else {
        return out;
    };
    let printable = |b: &[u8]| b.iter().all(|c| (0x20..=0x7e).contains(c));
    let mut total = 0usize;
    let mut value = vec![0u8; MAX_METADATA_BYTES];
    for name in names.split(|b| *b == 0) {
        let Some(key) = name.strip_prefix(METADATA_XATTR_PREFIX.as_bytes()) else {
            continue;
        };
        if key.is_empty() || key.len() > MAX_METADATA_KEY || !printable(key) {
            continue;
        }
        let Ok(key) = std::str::from_utf8(key) else {
            continue;
        };
        let read = if follow {
            rustix::fs::getxattr(path, name, &mut value[..])
        } else {
            rustix::fs::lgetxattr(path, name, &mut value[..])
        };
        let Ok(n) = read else { continue };
        let v = &value[..n];
        if !printable(v) {
            continue;
        }
        total += METADATA_XATTR_PREFIX.len() + key.len() + n;
        if total > MAX_METADATA_BYTES {
            break;
        }
        out.insert(key.to_string(), String::from_utf8_lossy(v).into_owned());
    }
    out
}

/// Replaces the user metadata of `path` with `metadata` (checked first with
/// [`check_metadata`]; `follow`: through a symlink at `path`): attributes of the
/// namespace that `metadata` does not name are removed, the others set.
pub fn replace_metadata(path: &Path, follow: bool, metadata: &FileMetadata) -> crate::Result<()> {
    check_metadata("metadata", metadata)?;
    let failed = |e: io::Error| -> crate::Error {
        let errno = e.raw_os_error().map(rustix::io::Errno::from_raw_os_error);
        match errno {
            Some(rustix::io::Errno::NOENT) => crate::Error::new(
                crate::ErrorCode::NotFound,
                format!("`{}` does not exist", path.display()),
            ),
            Some(rustix::io::Errno::NOTSUP) => crate::Error::invalid_options(
                "metadata",
                format!(
                    "`{}`'s file system keeps no extended attributes",
                    path.display()
                ),
            ),
            Some(rustix::io::Errno::PERM) => crate::Error::invalid_options(
                "metadata",
                format!(
                    "`{}` cannot carry metadata (only files and directories can)",
                    path.display()
                ),
            ),
            _ => crate::Error::new(
                crate::ErrorCode::EngineFailed,
                format!("setting the metadata of `{}`: {e}", path.display()),
            ),
        }
    };
    let present = names(path, follow).map_err(failed)?;
    for name in present.split(|b| *b == 0) {
        let Some(key) = name.strip_prefix(METADATA_XATTR_PREFIX.as_bytes()) else {
            continue;
        };
        if std::str::from_utf8(key).is_ok_and(|k| metadata.contains_key(k)) {
            continue;
        }
        let removed = if follow {
            rustix::fs::removexattr(path, name)
        } else {
            rustix::fs::lremovexattr(path, name)
        };
        match removed {
            Ok(()) | Err(rustix::io::Errno::NODATA) => {}
            Err(e) => return Err(failed(e.into())),
        }
    }
    for (key, value) in metadata {
        let name = format!("{METADATA_XATTR_PREFIX}{key}");
        let set = if follow {
            rustix::fs::setxattr(path, name.as_str(), value.as_bytes(), XattrFlags::empty())
        } else {
            rustix::fs::lsetxattr(path, name.as_str(), value.as_bytes(), XattrFlags::empty())
        };
        set.map_err(|e| failed(e.into()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_replaced_and_read_back_and_foreign_attributes_stay() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        // A file system without user attributes (some tmpfs): nothing to check here.
        if rustix::fs::setxattr(&file, "user.other", b"keep", XattrFlags::empty()).is_err() {
            eprintln!("skipped: the temp dir's file system keeps no user attributes");
            return;
        }
        let meta: FileMetadata = [("author", "mish"), ("purpose", "upload")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        replace_metadata(&file, false, &meta).unwrap();
        assert_eq!(read_metadata(&file, false), meta);
        // Replaced: a key left out goes; an empty map clears it all.
        let one: FileMetadata = [("author".to_string(), "ann".to_string())].into();
        replace_metadata(&file, false, &one).unwrap();
        assert_eq!(read_metadata(&file, false), one);
        replace_metadata(&file, false, &FileMetadata::new()).unwrap();
        assert!(read_metadata(&file, false).is_empty());
        // Attributes outside the namespace are not metadata and are left alone.
        let mut v = [0u8; 8];
        let n = rustix::fs::getxattr(&file, "user.other", &mut v[..]).unwrap();
        assert_eq!(&v[..n], b"keep");
        // Set from outside (as a program in the sandbox would), read as metadata;
        // a value that is not printable ASCII is left out.
        rustix::fs::setxattr(&file, "user.e2b.tag", b"seen", XattrFlags::empty()).unwrap();
        rustix::fs::setxattr(&file, "user.e2b.bin", b"\x01\x02", XattrFlags::empty()).unwrap();
        assert_eq!(
            read_metadata(&file, false),
            [("tag".to_string(), "seen".to_string())].into()
        );
        // Refused before anything is written.
        let bad: FileMetadata = [("a b\n".to_string(), "v".to_string())].into();
        assert!(replace_metadata(&file, false, &bad).is_err());
        // A symlink carries none.
        let link = dir.path().join("l");
        std::os::unix::fs::symlink("f", &link).unwrap();
        let e = replace_metadata(&link, false, &one).unwrap_err();
        assert_eq!(e.code, crate::ErrorCode::InvalidOptions, "{e}");
        assert!(read_metadata(&link, false).is_empty());
        // A missing path has none, and cannot be given any.
        assert!(read_metadata(&dir.path().join("missing"), false).is_empty());
        assert!(replace_metadata(&dir.path().join("missing"), false, &one).is_err());
    }

    #[test]
    fn what_a_program_sets_beyond_the_bounds_is_not_read() {
        // tmpfs keeps more attributes on an inode than one ext4 block holds.
        let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
            eprintln!("skipped: no /dev/shm");
            return;
        };
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let big = vec![b'v'; 2000];
        for k in ["a", "b", "c"] {
            let name = format!("user.e2b.{k}");
            if rustix::fs::setxattr(&file, name.as_str(), &big, XattrFlags::empty()).is_err() {
                eprintln!("skipped: the file system keeps no 6 KB of user attributes");
                return;
            }
        }
        rustix::fs::setxattr(&file, "user.e2b.bad key\t", b"v", XattrFlags::empty()).unwrap();
        let read = read_metadata(&file, false);
        let bytes: usize = read
            .iter()
            .map(|(k, v)| METADATA_XATTR_PREFIX.len() + k.len() + v.len())
            .sum();
        assert!(bytes <= MAX_METADATA_BYTES, "{bytes}");
        assert_eq!(read.len(), 2, "{:?}", read.keys());
        assert!(!read.contains_key("bad key\t"));
    }
}
