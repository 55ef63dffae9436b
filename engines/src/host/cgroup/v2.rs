//! The cgroup v2 backend: placement under a delegated subtree, enabling
//! controllers, the limit files (`memory.max`, `memory.swap.max`, `pids.max`,
//! `cpu.max`), accounting (`memory.peak`, `memory.events`, `pids.events`,
//! `cpu.stat`), the kill (`cgroup.kill`) and the freeze (`cgroup.freeze`). Every
//! function works through a [`CgroupFs`], so the logic is tested with a fake.
//!
//! **No internal processes.** A v2 group that hands a controller to its children
//! (`cgroup.subtree_control`) may hold no process itself (the root excepted). Paddock
//! therefore never puts a process in a group that has children: a group's processes
//! live in its `leaf` child. Where the process's own group must enable controllers
//! for Paddock's groups and holds processes, Paddock moves itself into a leaf of its
//! own (`paddock-<pid>-self…`) first, but only when it is the group's only process;
//! it never moves other programs' processes, and refuses instead, naming the fix (a
//! delegated subtree, see `docs/cgroups.md`).

mod processes;

use std::io;
use std::path::{Path, PathBuf};

use super::fs::{keyed, parse_pids, CgroupFs};

pub(crate) use processes::{kill, kill_except, remove_stale, remove_tree, set_frozen, KILL_WAIT};

/// The child that holds a group's own processes.
pub(crate) const LEAF: &str = "leaf";

/// The controllers Paddock's limits need; `cpu` is optional.
const REQUIRED: [&str; 2] = ["memory", "pids"];

/// The CFS period `cpu.max` is written with, in microseconds.
pub(crate) const CPU_PERIOD_US: u64 = 100_000;

/// Where Paddock's v2 groups go, and what they may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placement {
    /// The group Paddock's groups are made in.
    pub(crate) base: PathBuf,
    /// The controllers enabled for them (of `memory`, `pids`, `cpu`).
    pub(crate) controllers: Vec<String>,
    /// The leaf Paddock moved itself into, when it had to.
    pub(crate) moved_into: Option<PathBuf>,
    /// Why `cpu` is not among `controllers`, when it is not.
    pub(crate) no_cpu: Option<String>,
}

impl Placement {
    /// Whether `controller` is enabled for Paddock's groups.
    pub(crate) fn has(&self, controller: &str) -> bool {
        self.controllers.iter().any(|c| c == controller)
    }
}

/// The name of the leaf a Paddock process moves itself into.
pub(crate) fn self_leaf_name(pid: u32) -> String {
    format!(
        "paddock-{pid}-self{}",
        crate::host::owner::namespace_suffix()
    )
}

fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(String::from).collect()
}

/// Finds where Paddock's groups go, starting from the process's own group
/// `own_dir`, and enables the controllers they need there. With `controllers`
/// false (a hybrid host, whose v2 hierarchy serves only the kill and the freeze),
/// no controller is needed or enabled.
pub(crate) fn place(
    fs: &dyn CgroupFs,
    own_dir: &Path,
    self_pid: u32,
    controllers: bool,
) -> Result<Placement, String> {
    // A Paddock process already in its own leaf places its groups beside it.
    let in_own_leaf = own_dir
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(&format!("paddock-{self_pid}-self")));
    let base = match own_dir.parent() {
        Some(parent) if in_own_leaf => parent.to_path_buf(),
        _ => own_dir.to_path_buf(),
    };
    let mut placement = Placement {
        base: base.clone(),
        controllers: Vec::new(),
        moved_into: None,
        no_cpu: None,
    };
    if !controllers {
        return Ok(placement);
    }
    let offered = fs
        .read(&base.join("cgroup.controllers"))
        .map(|t| words(&t))
        .map_err(|e| format!("cannot read `{}/cgroup.controllers`: {e}", base.display()))?;
    let missing: Vec<&str> = REQUIRED
        .iter()
        .copied()
        .filter(|c| !offered.iter().any(|o| o == c))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "the cgroup v2 group `{}` is not given the {} controller{} (it has: `{}`); start Paddock in a delegated subtree, for example `systemd-run --scope -p Delegate=yes`",
            base.display(),
            missing.join(" and "),
            if missing.len() > 1 { "s" } else { "" },
            offered.join(" "),
        ));
    }
    let enabled = fs
        .read(&base.join("cgroup.subtree_control"))
        .map(|t| words(&t))
        .unwrap_or_default();
    let mut wanted: Vec<&str> = REQUIRED.to_vec();
    if offered.iter().any(|o| o == "cpu") {
        wanted.push("cpu");
    } else {
        placement.no_cpu = Some(format!(
            "the cgroup `{}` is not given the cpu controller",
            base.display()
        ));
    }
    let todo: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|c| !enabled.iter().any(|e| e == c))
        .collect();
    if !todo.is_empty() {
        let control = base.join("cgroup.subtree_control");
        let first = fs.write(&control, &format!("+{}", todo[0]));
        if let Err(e) = first {
            if e.raw_os_error() != Some(libc::EBUSY) {
                return Err(format!(
                    "cannot enable the {} controller in `{}`: {e}",
                    todo[0],
                    control.display()
                ));
            }
            // No internal processes: whoever lives in `base` must move out first.
            let procs = fs
                .read(&base.join("cgroup.procs"))
                .map(|t| parse_pids(&t))
                .unwrap_or_default();
            let others: Vec<_> = procs
                .iter()
                .filter(|&&p| p != self_pid as libc::pid_t)
                .collect();
            if !others.is_empty() {
                return Err(format!(
                    "the cgroup `{}` holds {} other process{}, and cgroup v2 lets a group that hands controllers to its children hold none; start Paddock in a cgroup of its own with controllers delegated (`systemd-run --scope -p Delegate=yes`, `Delegate=yes` in its unit, or a container with a cgroup namespace)",
                    base.display(),
                    others.len(),
                    if others.len() > 1 { "es" } else { "" },
                ));
            }
            let leaf = base.join(self_leaf_name(self_pid));
            match fs.create_dir(&leaf) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(format!("cannot create `{}`: {e}", leaf.display())),
            }
            fs.write(&leaf.join("cgroup.procs"), &self_pid.to_string())
                .map_err(|e| format!("cannot move Paddock into `{}`: {e}", leaf.display()))?;
            placement.moved_into = Some(leaf);
            fs.write(&control, &format!("+{}", todo[0])).map_err(|e| {
                format!(
                    "cannot enable the {} controller in `{}`: {e}",
                    todo[0],
                    control.display()
                )
            })?;
        }
        for c in &todo[1..] {
            if let Err(e) = fs.write(&control, &format!("+{c}")) {
                if *c == "cpu" {
                    // Real-time threads in the subtree, say: limits work without it.
                    placement.no_cpu = Some(format!(
                        "cannot enable the cpu controller in `{}`: {e}",
                        control.display()
                    ));
                    wanted.retain(|w| *w != "cpu");
                    continue;
                }
                return Err(format!(
                    "cannot enable the {c} controller in `{}`: {e}",
                    control.display()
                ));
            }
        }
    }
    placement.controllers = wanted.into_iter().map(String::from).collect();
    Ok(placement)
}

/// Creates group `dir` (it must not exist) and hands `controllers` to its children.
pub(crate) fn create_parent(
    fs: &dyn CgroupFs,
    dir: &Path,
    controllers: &[String],
) -> io::Result<()> {
    fs.create_dir(dir)?;
    if controllers.is_empty() {
        return Ok(());
    }
    let value: Vec<String> = controllers.iter().map(|c| format!("+{c}")).collect();
    if let Err(e) = fs.write(&dir.join("cgroup.subtree_control"), &value.join(" ")) {
        let _ = fs.remove_dir(dir);
        return Err(e);
    }
    Ok(())
}

/// Makes sure group `dir` exists and hands `controllers` to its children, whoever
/// made it (an OCI runtime creates the groups on a container's path itself).
pub(crate) fn ensure_parent(
    fs: &dyn CgroupFs,
    dir: &Path,
    controllers: &[String],
) -> io::Result<()> {
    match fs.create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let enabled = fs
        .read(&dir.join("cgroup.subtree_control"))
        .map(|t| words(&t))
        .unwrap_or_default();
    let missing: Vec<String> = controllers
        .iter()
        .filter(|c| !enabled.contains(c))
        .map(|c| format!("+{c}"))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    fs.write(&dir.join("cgroup.subtree_control"), &missing.join(" "))
}

/// Creates a group whose processes live in its leaf: `dir` and `dir/leaf`.
pub(crate) fn create_group(fs: &dyn CgroupFs, dir: &Path) -> io::Result<()> {
    fs.create_dir(dir)?;
    if let Err(e) = fs.create_dir(&dir.join(LEAF)) {
        let _ = fs.remove_dir(dir);
        return Err(e);
    }
    Ok(())
}

/// The limits a v2 group gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct GroupLimits {
    pub(crate) memory_bytes: Option<u64>,
    pub(crate) pids: Option<u64>,
    pub(crate) cpu_millicores: Option<u64>,
}

/// The `cpu.max` value for a bandwidth in thousandths of a core: "QUOTA PERIOD".
pub(crate) fn cpu_max(millicores: Option<u64>) -> String {
    match millicores {
        // At least the kernel's minimum quota (1 ms).
        Some(m) => format!(
            "{} {CPU_PERIOD_US}",
            (m.saturating_mul(CPU_PERIOD_US) / 1000).max(1000)
        ),
        None => format!("max {CPU_PERIOD_US}"),
    }
}

/// Writes the limits of group `dir`: `memory.max` with no swap beside it
/// (`memory.swap.max` 0, where swap is accounted), `pids.max`, and `cpu.max` when
/// `cpu` is enabled. Unset limits are written as `max`.
///
/// Unlike v1, the kernel does not refuse a memory limit below the group's usage: it
/// reclaims, and OOM-kills in the group what it cannot reclaim.
pub(crate) fn set_limits(
    fs: &dyn CgroupFs,
    dir: &Path,
    limits: GroupLimits,
    cpu: bool,
) -> io::Result<()> {
    let or_max = |v: Option<u64>| v.map_or_else(|| "max".to_string(), |v| v.to_string());
    fs.write(&dir.join("memory.max"), &or_max(limits.memory_bytes))?;
    let swap = dir.join("memory.swap.max");
    if fs.exists(&swap) {
        let value = if limits.memory_bytes.is_some() {
            "0"
        } else {
            "max"
        };
        fs.write(&swap, value)?;
    }
    fs.write(&dir.join("pids.max"), &or_max(limits.pids))?;
    if cpu {
        fs.write(&dir.join("cpu.max"), &cpu_max(limits.cpu_millicores))?;
    }
    Ok(())
}

/// OOM kills counted in group `dir` (and below it): `oom_kill` of `memory.events`.
pub(crate) fn oom_kills(fs: &dyn CgroupFs, dir: &Path) -> u64 {
    fs.read(&dir.join("memory.events"))
        .ok()
        .and_then(|t| keyed(&t, "oom_kill"))
        .unwrap_or(0)
}

/// Forks the pids limit of group `dir` refused: `max` of `pids.events`.
pub(crate) fn pids_max_hits(fs: &dyn CgroupFs, dir: &Path) -> u64 {
    fs.read(&dir.join("pids.events"))
        .ok()
        .and_then(|t| keyed(&t, "max"))
        .unwrap_or(0)
}

/// The group's peak memory use (`memory.peak`), in bytes.
#[cfg(test)]
pub(crate) fn peak_memory(fs: &dyn CgroupFs, dir: &Path) -> u64 {
    fs.read(&dir.join("memory.peak"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// CPU time the group and its descendants used (`usage_usec` of `cpu.stat`), in
/// nanoseconds.
pub(crate) fn cpu_usage_ns(text: &str) -> u64 {
    keyed(text, "usage_usec").unwrap_or(0).saturating_mul(1000)
}

#[cfg(test)]
mod tests {
    use super::super::fs::{FakeFs, Op};
    use super::*;

    const MNT: &str = "/sys/fs/cgroup";

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn a_delegated_group_with_controllers_enabled_is_used_as_it_is() {
        let fs = FakeFs::v2(MNT, "cpu memory pids io");
        fs.mkgroup(
            "/sys/fs/cgroup/app.slice/paddock.service",
            "cpu memory pids",
        );
        fs.set(
            "/sys/fs/cgroup/app.slice/paddock.service/cgroup.subtree_control",
            "cpu memory pids",
        );
        let own = p("/sys/fs/cgroup/app.slice/paddock.service");
        let placed = place(&fs, &own, 7, true).unwrap();
        assert_eq!(placed.base, own);
        assert_eq!(placed.controllers, ["memory", "pids", "cpu"]);
        assert_eq!(placed.moved_into, None);
        assert_eq!(fs.writes(), Vec::<(String, String)>::new());
    }

    #[test]
    fn the_only_process_of_its_group_moves_into_a_leaf_before_enabling_controllers() {
        // `systemd-run --scope -p Delegate=yes paddock …`: the scope holds Paddock.
        let fs = FakeFs::v2(MNT, "cpu memory pids");
        let scope = "/sys/fs/cgroup/run-r1.scope";
        fs.mkgroup(scope, "cpu memory pids");
        fs.add_proc(scope, 42);
        let placed = place(&fs, Path::new(scope), 42, true).unwrap();
        let leaf = format!("{scope}/{}", self_leaf_name(42));
        assert_eq!(placed.base, p(scope));
        assert_eq!(placed.moved_into, Some(p(&leaf)));
        assert_eq!(placed.controllers, ["memory", "pids", "cpu"]);
        // Refused while Paddock was in it, then: mkdir, move, enable each.
        let control = format!("{scope}/cgroup.subtree_control");
        assert_eq!(
            fs.ops(),
            [
                Op::Write(p(&control), "+memory".into()),
                Op::Mkdir(p(&leaf)),
                Op::Write(p(&format!("{leaf}/cgroup.procs")), "42".into()),
                Op::Write(p(&control), "+memory".into()),
                Op::Write(p(&control), "+pids".into()),
                Op::Write(p(&control), "+cpu".into()),
            ]
        );
        assert_eq!(fs.get(&control).unwrap(), "cpu memory pids");
        assert_eq!(fs.get(&format!("{scope}/cgroup.procs")).unwrap(), "");
        // A second engine of the same process, now in its leaf, places beside it.
        fs.clear_ops();
        let again = place(&fs, Path::new(&leaf), 42, true).unwrap();
        assert_eq!(again.base, p(scope));
        assert_eq!(again.moved_into, None);
        assert!(fs.ops().is_empty());
    }

    #[test]
    fn other_processes_in_the_group_are_never_moved() {
        let fs = FakeFs::v2(MNT, "memory pids");
        let unit = "/sys/fs/cgroup/system.slice/app.service";
        fs.mkgroup(unit, "memory pids");
        fs.add_proc(unit, 42);
        fs.add_proc(unit, 43);
        let why = place(&fs, Path::new(unit), 42, true).unwrap_err();
        assert!(why.contains("1 other process"), "{why}");
        assert!(why.contains("Delegate=yes"), "{why}");
        assert!(!fs.ops().iter().any(|op| matches!(op, Op::Mkdir(_))));
        assert_eq!(fs.get(&format!("{unit}/cgroup.procs")).unwrap(), "42\n43\n");
    }

    #[test]
    fn a_group_without_the_controllers_is_refused_with_the_fix_and_cpu_is_optional() {
        let fs = FakeFs::v2(MNT, "memory pids");
        fs.mkgroup("/sys/fs/cgroup/u", "pids");
        let why = place(&fs, Path::new("/sys/fs/cgroup/u"), 1, true).unwrap_err();
        assert!(why.contains("memory controller"), "{why}");
        assert!(why.contains("systemd-run"), "{why}");
        // The root: no cgroup.type, exempt from the rule; cpu is not offered.
        let placed = place(&fs, Path::new(MNT), 1, true).unwrap();
        assert_eq!(placed.controllers, ["memory", "pids"]);
        assert!(placed.no_cpu.is_some());
        // A cpu controller that cannot be enabled (real-time threads, say) is left
        // out, and the limits still work.
        let fs2 = FakeFs::v2(MNT, "cpu memory pids");
        fs2.fail_writes(
            "/sys/fs/cgroup/cgroup.subtree_control",
            "+cpu",
            libc::EINVAL,
        );
        let placed = place(&fs2, Path::new(MNT), 1, true).unwrap();
        assert_eq!(placed.controllers, ["memory", "pids"]);
        assert!(placed.no_cpu.unwrap().contains("cpu controller"));
        // Without controllers (a hybrid host's unified mount) nothing is touched.
        let fs = FakeFs::v2("/sys/fs/cgroup/unified", "hugetlb");
        let placed = place(&fs, Path::new("/sys/fs/cgroup/unified"), 1, false).unwrap();
        assert!(placed.controllers.is_empty());
        assert!(fs.ops().is_empty());
    }

    #[test]
    fn groups_are_made_with_their_leaf_and_limits_written_as_the_kernel_wants() {
        let fs = FakeFs::v2(MNT, "cpu memory pids");
        let ctl: Vec<String> = ["memory", "pids", "cpu"].map(String::from).to_vec();
        let engine = p("/sys/fs/cgroup/paddock-1-0-ns1");
        let sb = engine.join("sb");
        fs.set("/sys/fs/cgroup/cgroup.subtree_control", "cpu memory pids");
        create_parent(&fs, &engine, &ctl).unwrap();
        create_group(&fs, &sb).unwrap();
        assert!(fs.has_dir("/sys/fs/cgroup/paddock-1-0-ns1/sb/leaf"));
        fs.clear_ops();
        let limits = GroupLimits {
            memory_bytes: Some(64 << 20),
            pids: Some(32),
            cpu_millicores: Some(250),
        };
        set_limits(&fs, &sb, limits, true).unwrap();
        let at = |f: &str| sb.join(f).display().to_string();
        assert_eq!(
            fs.writes(),
            [
                (at("memory.max"), (64u64 << 20).to_string()),
                (at("memory.swap.max"), "0".into()),
                (at("pids.max"), "32".into()),
                (at("cpu.max"), "25000 100000".into()),
            ]
        );
        fs.clear_ops();
        set_limits(&fs, &sb, GroupLimits::default(), false).unwrap();
        assert_eq!(
            fs.writes(),
            [
                (at("memory.max"), "max".into()),
                (at("memory.swap.max"), "max".into()),
                (at("pids.max"), "max".into()),
            ]
        );
        assert_eq!(cpu_max(Some(2000)), "200000 100000");
        assert_eq!(cpu_max(Some(1)), "1000 100000");
        assert_eq!(cpu_max(None), "max 100000");
    }

    #[test]
    fn a_parent_made_by_someone_else_still_gets_the_controllers_once() {
        let fs = FakeFs::v2(MNT, "cpu memory pids");
        fs.set("/sys/fs/cgroup/cgroup.subtree_control", "cpu memory pids");
        // The runtime made it first, without handing anything down.
        fs.mkgroup("/sys/fs/cgroup/e", "cpu memory pids");
        let ctl: Vec<String> = ["memory", "pids"].map(String::from).to_vec();
        ensure_parent(&fs, Path::new("/sys/fs/cgroup/e"), &ctl).unwrap();
        assert_eq!(
            fs.get("/sys/fs/cgroup/e/cgroup.subtree_control").unwrap(),
            "memory pids"
        );
        // Again: nothing to write.
        fs.clear_ops();
        ensure_parent(&fs, Path::new("/sys/fs/cgroup/e"), &ctl).unwrap();
        ensure_parent(&fs, Path::new("/sys/fs/cgroup/e/sb"), &ctl).unwrap();
        assert_eq!(
            fs.ops(),
            [
                Op::Mkdir(p("/sys/fs/cgroup/e")),
                Op::Mkdir(p("/sys/fs/cgroup/e/sb")),
                Op::Write(
                    p("/sys/fs/cgroup/e/sb/cgroup.subtree_control"),
                    "+memory +pids".into()
                ),
            ]
        );
    }

    #[test]
    fn accounting_reads_the_v2_files() {
        let fs = FakeFs::v2(MNT, "memory pids");
        fs.mkgroup("/sys/fs/cgroup/g", "memory pids");
        let g = p("/sys/fs/cgroup/g");
        assert_eq!((oom_kills(&fs, &g), pids_max_hits(&fs, &g)), (0, 0));
        fs.set(
            "/sys/fs/cgroup/g/memory.events",
            "low 0\nhigh 0\nmax 9\noom 3\noom_kill 2\noom_group_kill 0\n",
        );
        fs.set("/sys/fs/cgroup/g/pids.events", "max 5\n");
        fs.set("/sys/fs/cgroup/g/memory.peak", "123456\n");
        assert_eq!(oom_kills(&fs, &g), 2);
        assert_eq!(pids_max_hits(&fs, &g), 5);
        assert_eq!(peak_memory(&fs, &g), 123456);
        assert_eq!(cpu_usage_ns("usage_usec 1500\nuser_usec 1000\n"), 1_500_000);
    }
}
