//! The workdir's disk quota as executions see it: the limit used up, a request
//! that asks for another quota, and the verdict on a run that filled the disk.

use paddock_core::{Error, ExecResult, LimitKind, Limits, Result};

use super::Workdir;

impl Workdir {
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
