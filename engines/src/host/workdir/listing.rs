//! Listing a directory beneath the workdir, recursively and without following
//! symlinks, within [`MAX_LIST_ENTRIES`] entries and [`MAX_LIST_DEPTH`] levels.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use paddock_core::{Error, ErrorCode, FileEntry, Result};

use super::resolve::{cpath, map_io, openat_beneath};
use super::{Workdir, MAX_LIST_DEPTH, MAX_LIST_ENTRIES};

impl Workdir {
    /// Lists `path` recursively: absolute host paths with sizes. A missing directory
    /// lists as empty; symlinks are listed, never followed.
    pub fn list_files(&self, path: &str) -> Result<Vec<FileEntry>> {
        let rel = self.relative(path)?;
        let dir = match openat_beneath(
            self.fd.as_raw_fd(),
            &cpath(&rel)?,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            0,
        ) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(Vec::new()),
            Err(e) => return Err(map_io(e, path)),
        };
        let mut out = Vec::new();
        self.walk(dir, &rel, &mut out, path)?;
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Walks iteratively (no recursion, one directory fd open at a time): each
    /// directory is opened from the workdir's fd with `RESOLVE_BENEATH`, so the walk
    /// stays inside whatever a program does meanwhile.
    fn walk(&self, first: OwnedFd, rel: &Path, out: &mut Vec<FileEntry>, arg: &str) -> Result<()> {
        let too_many = || {
            Error::new(
                ErrorCode::LimitsExceeded,
                format!("`{arg}` holds more than {MAX_LIST_ENTRIES} entries or is nested deeper than {MAX_LIST_DEPTH} levels; list a subdirectory"),
            )
        };
        let mut pending: Vec<(PathBuf, usize)> = Vec::new();
        let mut current = Some((first, rel.to_path_buf(), 0usize));
        while let Some((dir, dir_rel, depth)) = current.take() {
            // Reading through the fd's /proc link reads the directory we opened, even
            // if the path has since been swapped for a symlink.
            let proc_path = format!("/proc/self/fd/{}", dir.as_raw_fd());
            let entries = std::fs::read_dir(&proc_path).map_err(|e| map_io(e, arg))?;
            for entry in entries {
                let entry = entry.map_err(|e| map_io(e, arg))?;
                if out.len() >= MAX_LIST_ENTRIES {
                    return Err(too_many());
                }
                let name = entry.file_name();
                let file_type = entry.file_type().map_err(|e| map_io(e, arg))?;
                let child_rel = dir_rel.join(&name);
                let shown = self.shown.join(&child_rel).to_string_lossy().into_owned();
                if file_type.is_dir() {
                    out.push(FileEntry {
                        path: shown,
                        size: 0,
                        is_dir: true,
                    });
                    if depth + 1 > MAX_LIST_DEPTH {
                        return Err(too_many());
                    }
                    pending.push((child_rel, depth + 1));
                } else {
                    let size = if file_type.is_symlink() {
                        0
                    } else {
                        entry.metadata().map(|m| m.len()).unwrap_or(0)
                    };
                    out.push(FileEntry {
                        path: shown,
                        size,
                        is_dir: false,
                    });
                }
            }
            drop(dir);
            while let Some((next_rel, next_depth)) = pending.pop() {
                match openat_beneath(
                    self.fd.as_raw_fd(),
                    &cpath(&next_rel)?,
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                    0,
                ) {
                    Ok(fd) => {
                        current = Some((fd, next_rel, next_depth));
                        break;
                    }
                    // Removed or replaced by something else while we walked: skip it.
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP)
                        ) => {}
                    Err(e) => return Err(map_io(e, arg)),
                }
            }
        }
        Ok(())
    }
}
