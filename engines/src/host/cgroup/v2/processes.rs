//! What acts on a v2 group's processes: the kill (`cgroup.kill`), the freeze
//! (`cgroup.freeze`), a kill that spares some processes, and the removal of groups
//! (stale ones included), which kills first.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use super::super::fs::{keyed, parse_pids, CgroupFs};

/// Whether a process is in group `dir` or below it (`populated` of `cgroup.events`).
pub(crate) fn populated(fs: &dyn CgroupFs, dir: &Path) -> io::Result<bool> {
    let events = fs.read(&dir.join("cgroup.events"))?;
    Ok(keyed(&events, "populated").unwrap_or(0) != 0)
}

/// How long a kill waits for the group to empty.
pub(crate) const KILL_WAIT: Duration = Duration::from_secs(5);

/// Kills every process in group `dir` and below it (`cgroup.kill`: atomic, a fork
/// in flight included; frozen tasks die too) and waits until the kernel reports the
/// group empty, up to `wait`.
pub(crate) fn kill(fs: &dyn CgroupFs, dir: &Path, wait: Duration) -> io::Result<()> {
    if !populated(fs, dir)? {
        return Ok(());
    }
    let deadline = Instant::now() + wait;
    fs.write(&dir.join("cgroup.kill"), "1")?;
    let mut pause = Duration::from_micros(100);
    loop {
        if !populated(fs, dir)? {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "`{}` still had processes {} ms after cgroup.kill",
                    dir.display(),
                    wait.as_millis()
                ),
            ));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

/// Freezes (`cgroup.freeze` 1) group `dir` and everything below it and waits, up to
/// `wait`, until the kernel reports it `frozen 1`; one that does not freeze in time
/// is thawed again, so that a failed freeze leaves it running, not half frozen.
/// Thawing (`frozen` false) writes 0 and returns.
pub(crate) fn set_frozen(
    fs: &dyn CgroupFs,
    dir: &Path,
    frozen: bool,
    wait: Duration,
) -> io::Result<()> {
    let file = dir.join("cgroup.freeze");
    if !frozen {
        return fs.write(&file, "0");
    }
    fs.write(&file, "1")?;
    let deadline = Instant::now() + wait;
    loop {
        let events = fs.read(&dir.join("cgroup.events"))?;
        if keyed(&events, "frozen") == Some(1) {
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = fs.write(&file, "0");
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "`{}` did not freeze within {} ms (a task stuck in the kernel); it was thawed again",
                    dir.display(),
                    wait.as_millis()
                ),
            ));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Kills the processes directly in group `dir` except those in `keep`, with the
/// group frozen so that none forks past the pass, and waits (up to 5 s) until only
/// they are left. Returns how many were killed.
pub(crate) fn kill_except(
    fs: &dyn CgroupFs,
    dir: &Path,
    keep: &[libc::pid_t],
) -> io::Result<usize> {
    let procs = dir.join("cgroup.procs");
    let others = |fs: &dyn CgroupFs| -> io::Result<Vec<libc::pid_t>> {
        Ok(parse_pids(&fs.read(&procs)?)
            .into_iter()
            .filter(|p| !keep.contains(p))
            .collect())
    };
    let mut killed = 0;
    if set_frozen(fs, dir, true, Duration::from_secs(1)).is_ok() {
        for pid in others(fs)? {
            fs.kill(pid);
            killed += 1;
        }
        // Thawed, the killed tasks die; a v2-frozen task dies of SIGKILL anyway.
        let _ = set_frozen(fs, dir, false, Duration::ZERO);
    }
    let deadline = Instant::now() + KILL_WAIT;
    loop {
        let left = others(fs)?;
        if left.is_empty() {
            return Ok(killed);
        }
        for &pid in &left {
            fs.kill(pid);
        }
        killed += left.len();
        if Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("processes in `{}` survived SIGKILL for 5 s", dir.display()),
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Kills what runs in group `dir` (and below), then removes it and every group
/// below it, deepest first. A missing `dir` is not an error.
pub(crate) fn remove_tree(fs: &dyn CgroupFs, dir: &Path) -> io::Result<()> {
    if !fs.exists(dir) {
        return Ok(());
    }
    if fs.exists(&dir.join("cgroup.kill")) {
        let _ = kill(fs, dir, KILL_WAIT);
    }
    remove_dirs(fs, dir)
}

fn remove_dirs(fs: &dyn CgroupFs, dir: &Path) -> io::Result<()> {
    for child in fs.list_dirs(dir).unwrap_or_default() {
        remove_dirs(fs, &dir.join(child))?;
    }
    // The kernel may take a moment to let go of exited tasks.
    let mut tries = 0;
    loop {
        match fs.remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 500 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Removes the groups below `base` that Paddock processes which no longer run left
/// (names `paddock-<pid>…` whose owner is gone, see `owner`), killing what still
/// runs in them. `prefix` is the name prefix (`paddock-`, `paddock-ct-`).
pub(crate) fn remove_stale(fs: &dyn CgroupFs, base: &Path, prefix: &str) {
    for name in fs.list_dirs(base).unwrap_or_default() {
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        if crate::host::owner::owner_is_gone(rest) {
            let _ = remove_tree(fs, &base.join(&name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::cgroup::fs::{FakeFs, Op};
    use std::path::PathBuf;

    const MNT: &str = "/sys/fs/cgroup";

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn kill_writes_cgroup_kill_and_waits_for_the_group_to_empty() {
        let fs = FakeFs::v2(MNT, "");
        fs.mkgroup("/sys/fs/cgroup/g/leaf", "");
        let g = p("/sys/fs/cgroup/g");
        // Empty: nothing is written.
        kill(&fs, &g, KILL_WAIT).unwrap();
        assert!(fs.ops().is_empty());
        fs.add_proc("/sys/fs/cgroup/g/leaf", 10);
        fs.add_proc("/sys/fs/cgroup/g/leaf", 11);
        assert!(populated(&fs, &g).unwrap());
        kill(&fs, &g, KILL_WAIT).unwrap();
        assert_eq!(
            fs.writes(),
            [("/sys/fs/cgroup/g/cgroup.kill".into(), "1".into())]
        );
        assert!(!populated(&fs, &g).unwrap());
        // A process that does not die is a timeout, not a hang.
        fs.add_proc("/sys/fs/cgroup/g/leaf", 12);
        fs.unkillable(12);
        let e = kill(&fs, &g, Duration::from_millis(20)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }

    #[test]
    fn freeze_waits_for_frozen_and_thaws_again_on_timeout() {
        let fs = FakeFs::v2(MNT, "");
        fs.mkgroup("/sys/fs/cgroup/g/leaf", "");
        let g = p("/sys/fs/cgroup/g");
        fs.add_proc("/sys/fs/cgroup/g/leaf", 10);
        set_frozen(&fs, &g, true, Duration::from_secs(1)).unwrap();
        let events = fs.read(&g.join("cgroup.events")).unwrap();
        assert_eq!(keyed(&events, "frozen"), Some(1));
        set_frozen(&fs, &g, false, Duration::ZERO).unwrap();
        let freeze = "/sys/fs/cgroup/g/cgroup.freeze".to_string();
        assert_eq!(
            fs.writes(),
            [(freeze.clone(), "1".into()), (freeze.clone(), "0".into())]
        );
        // A task stuck in the kernel: the freeze gives up and thaws.
        fs.clear_ops();
        fs.stuck_freezing("/sys/fs/cgroup/g/leaf");
        let e = set_frozen(&fs, &g, true, Duration::from_millis(20)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(
            fs.writes(),
            [(freeze.clone(), "1".into()), (freeze, "0".into())]
        );
        assert_eq!(fs.get("/sys/fs/cgroup/g/cgroup.freeze").unwrap(), "0");
    }

    #[test]
    fn kill_except_spares_the_kept_processes_under_a_freeze() {
        let fs = FakeFs::v2(MNT, "");
        fs.mkgroup("/sys/fs/cgroup/w/leaf", "");
        let leaf = "/sys/fs/cgroup/w/leaf";
        for pid in [20, 21, 22] {
            fs.add_proc(leaf, pid);
        }
        let killed = kill_except(&fs, Path::new(leaf), &[20]).unwrap();
        assert_eq!(killed, 2);
        assert_eq!(fs.get(&format!("{leaf}/cgroup.procs")).unwrap(), "20\n");
        let ops = fs.ops();
        let freeze = ops
            .iter()
            .position(|o| *o == Op::Write(p(&format!("{leaf}/cgroup.freeze")), "1".into()));
        let first_kill = ops.iter().position(|o| matches!(o, Op::Kill(_)));
        let thaw = ops
            .iter()
            .position(|o| *o == Op::Write(p(&format!("{leaf}/cgroup.freeze")), "0".into()));
        assert!(freeze < first_kill && first_kill < thaw, "{ops:?}");
        assert!(!ops.contains(&Op::Kill(20)));
    }

    #[test]
    fn remove_tree_kills_then_removes_deepest_first_and_sweeps_only_dead_owners() {
        let fs = FakeFs::v2(MNT, "");
        let ns = crate::host::owner::namespace_suffix();
        let dead = format!("/sys/fs/cgroup/paddock-{}-0{ns}", u32::MAX - 1);
        let alive = format!("/sys/fs/cgroup/paddock-{}-0{ns}", std::process::id());
        let foreign = "/sys/fs/cgroup/paddock-1-0-ns1";
        for g in [&dead, &alive, &foreign.to_string()] {
            fs.mkgroup(&format!("{g}/sb/leaf"), "");
        }
        fs.add_proc(&format!("{dead}/sb/leaf"), 30);
        remove_stale(&fs, Path::new(MNT), "paddock-");
        assert!(!fs.has_dir(&dead));
        assert!(fs.has_dir(&alive) && fs.has_dir(foreign));
        let ops = fs.ops();
        assert_eq!(
            ops[0],
            Op::Write(p(&format!("{dead}/cgroup.kill")), "1".into())
        );
        let rmdirs: Vec<_> = ops
            .iter()
            .filter_map(|o| match o {
                Op::Rmdir(d) => Some(d.display().to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(
            rmdirs,
            [
                format!("{dead}/sb/leaf"),
                format!("{dead}/sb"),
                dead.clone()
            ]
        );
        // Missing: not an error.
        remove_tree(&fs, Path::new("/sys/fs/cgroup/nothing")).unwrap();
    }
}
