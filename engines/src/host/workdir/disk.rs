//! The workdir's disk quota as executions see it: the limit used up, a request
//! that asks for another quota, and the verdict on a run that filled the disk.

use paddock_core::{Error, ExecResult, LimitKind, Limits, Result};

use super::Workdir;

/// The most entries [`Workdir::disk_usage`] adds up in a workdir without a file
/// system of its own.
const MAX_DISK_WALK: usize = 20_000;

impl Workdir {
    /// The bytes its files take on disk, and the most they may take. With a disk
    /// quota, both come from its own file system (`statvfs`); without, its files'
    /// blocks are added up (at most `MAX_DISK_WALK` entries: beyond, what was
    /// counted), against the size of the file system it is on.
    pub fn disk_usage(&self) -> (u64, u64) {
        if let Some(volume) = &self.volume {
            let total = volume.quota().bytes;
            let free = volume.fill().map_or(total, |f| f.free_bytes.min(total));
            return (total - free, total);
        }
        let total =
            rustix::fs::statvfs(self.root()).map_or(0, |s| s.f_blocks.saturating_mul(s.f_frsize));
        let mut used = 0u64;
        let mut seen = 0usize;
        let mut dirs = vec![self.root().to_path_buf()];
        'walk: while let Some(dir) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                seen += 1;
                if seen > MAX_DISK_WALK {
                    break 'walk;
                }
                // Not followed: a symlink counts as itself.
                let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
                    continue;
                };
                use std::os::unix::fs::MetadataExt;
                used = used.saturating_add(meta.blocks().saturating_mul(512));
                if meta.is_dir() {
                    dirs.push(entry.path());
                }
            }
        }
        (used, total)
    }

    /// The disk limit that is used up now, if any (see [`crate::volume::Fill`]).
    pub fn disk_exhausted(&self) -> Option<LimitKind> {
        self.volume.as_ref().and_then(|v| v.exhausted())
    }

    /// Refuses an execution whose request sets a disk limit other than the
    /// sandbox's: the filesystem is made when the sandbox is opened, and stays.
    pub fn check_disk_request(&self, asked: &Limits) -> Result<()> {
        let quota = self.volume.as_ref().map(|v| v.quota());
        let checks = [
            ("disk_bytes", asked.disk_bytes, quota.map(|q| q.bytes)),
            ("disk_files", asked.disk_files, quota.map(|q| q.files)),
        ];
        for (field, want, have) in checks {
            if let Some(want) = want {
                if Some(want) != have {
                    let had = have.map_or_else(|| "no quota".to_string(), |h| h.to_string());
                    return Err(Error::invalid_options(
                        &format!("limits.{field}"),
                        format!(
                            "{want} differs from this sandbox's {field} ({had}): a sandbox's disk is made when it is opened; set it there, or leave it unset here"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Says in `result` whether the disk quota was used up by this execution:
    /// `before` is [`disk_exhausted`](Workdir::disk_exhausted) from before it ran. A
    /// program that filled the disk and then failed (a non-zero exit) is
    /// `limit_exceeded` (`disk` or `disk_files`), its exit status kept in a warning;
    /// one that succeeded anyway, or was stopped otherwise (deadline, cancel,
    /// another limit), keeps its outcome and gets the warning. A disk that was
    /// already full before gets a warning only. (Judged from the filesystem after
    /// the run: a program that hit the quota and then deleted what it wrote leaves
    /// no trace.)
    pub fn judge_disk(
        &self,
        before: Option<LimitKind>,
        result: Result<ExecResult>,
    ) -> Result<ExecResult> {
        let mut r = result?;
        let (Some(limit), Some(volume)) = (self.disk_exhausted(), &self.volume) else {
            return Ok(r);
        };
        let quota = volume.quota();
        let what = match limit {
            LimitKind::DiskFiles => format!("the file-count cap ({} files)", quota.files),
            _ => format!("the disk quota ({} bytes)", quota.bytes),
        };
        match (&r.outcome, before) {
            (paddock_core::Outcome::Completed { exit_code, signal }, None)
                if *exit_code != 0 =>
            {
                r.warnings.push(format!(
                    "{what} was used up: writes failed with ENOSPC; the program then exited with code {exit_code}{}",
                    signal.map_or_else(String::new, |s| format!(" (signal {s})"))
                ));
                r.outcome = paddock_core::Outcome::LimitExceeded { limit };
            }
            (_, None) => r.warnings.push(format!(
                "{what} was used up during the run: writes failed with ENOSPC"
            )),
            (_, Some(_)) => r.warnings.push(format!(
                "{what} is used up (it was before this run too): writes fail with ENOSPC until files are removed"
            )),
        }
        Ok(r)
    }
}
