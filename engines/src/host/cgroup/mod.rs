//! Per-sandbox cgroups: memory, pids and CPU-bandwidth limits, peak and OOM
//! accounting, and a kill that no process escapes (`setsid` included).
//!
//! The backend is chosen at start from what the host mounts ([`Layout`], see
//! `docs/cgroups.md`):
//! - **v1**: the `pids`, `memory` and (when mounted) `cpu` and `freezer`
//!   hierarchies; the kill freezes the group, sends SIGKILL to every member and
//!   thaws it.
//! - **hybrid** (v1 controllers and a v2 mount beside them): the limits and the
//!   accounting in v1, where the controllers are; the kill through `cgroup.kill` of
//!   a group in the v2 mount, which every process also joins (atomic: a fork in
//!   flight dies too), falling back to the v1 kill where v2 cannot be used.
//! - **v2**: everything in the one hierarchy: `memory.max` (with `memory.swap.max`
//!   0), `pids.max`, `cpu.max`, `memory.events`, `pids.events`, `cgroup.kill`,
//!   `cgroup.freeze`. Groups go under the process's own group, which must be given
//!   the `memory` and `pids` controllers (a delegated subtree; the rules below).
//!
//! Paddock places its groups under the cgroup the host process already lives in,
//! one parent per engine (`paddock-<pid>-<n>-ns<inode>`) and one child per sandbox.
//! In v2 no group that has children holds a process itself: a group's processes
//! live in its `leaf` child, and where the process's own group must hand controllers
//! to Paddock's groups while holding processes, Paddock moves itself into a leaf of
//! its own first, but only when it is the only process there.

mod fs;
mod layout;
mod v2;

pub use fs::{CgroupFs, RealFs};
pub use layout::Layout;

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::host::sys;
use layout::HostLayout;
pub(crate) use v2::CPU_PERIOD_US;
use v2::{GroupLimits, Placement, LEAF};

static NEXT_ROOT: AtomicU64 = AtomicU64::new(0);

/// What a [`CgroupRoot`] uses on this host, for `paddock doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupReport {
    /// The layout the host mounts.
    pub layout: Layout,
    /// The engine's parent groups (one per hierarchy used).
    pub groups: Vec<PathBuf>,
    /// What enforces the memory and pids limits (`v1 memory, pids` or
    /// `v2 memory.max, pids.max`).
    pub limits: String,
    /// How a sandbox's processes are killed.
    pub kill: String,
    /// How a group is frozen, or why it cannot be.
    pub freeze: Result<String, String>,
    /// What enforces `cpu_millicores`, or why nothing does.
    pub cpu: Result<String, String>,
    /// The leaf this process moved itself into (v2, see the module's doc).
    pub moved_into: Option<PathBuf>,
}

#[derive(Debug)]
struct V1Root {
    pids: PathBuf,
    memory: PathBuf,
    cpu: Option<PathBuf>,
    freezer: Option<PathBuf>,
}

#[derive(Debug)]
struct V2Root {
    dir: PathBuf,
    /// Whether the limits and the accounting are here (no v1 backend).
    limits: bool,
    cpu: bool,
    /// Whether `cgroup.kill` is offered (kernel 5.14 and later).
    kill: bool,
    placement: Placement,
}

/// The engine-level parent groups.
#[derive(Debug)]
pub struct CgroupRoot {
    fs: Arc<dyn CgroupFs>,
    layout: Layout,
    v1: Option<V1Root>,
    v2: Option<V2Root>,
    /// Why the v2 hierarchy of a hybrid host is not used for the kill, if it is not.
    v2_unused: Option<String>,
}

#[derive(Debug)]
struct V1Group {
    pids: PathBuf,
    memory: PathBuf,
    cpu: Option<PathBuf>,
    freezer: Option<PathBuf>,
}

#[derive(Debug)]
struct V2Group {
    /// The group: limits and accounting (v2 backend).
    dir: PathBuf,
    /// `dir/leaf`: its own processes.
    leaf: PathBuf,
    limits: bool,
    cpu: bool,
    kill: bool,
}

/// One sandbox's groups (or a background process's, inside its sandbox's).
#[derive(Debug)]
pub struct Cgroup {
    fs: Arc<dyn CgroupFs>,
    v1: Option<V1Group>,
    v2: Option<V2Group>,
    procs_files: Vec<CString>,
    /// The limits last written, to skip rewriting them.
    applied: parking_lot::Mutex<Option<GroupLimits>>,
    /// Event counters as last seen, so each check reports only new events.
    seen_oom: AtomicU64,
    seen_pids_max: AtomicU64,
}

/// This process's group directory in the v1 hierarchy of `controller`.
fn v1_dir(host: &HostLayout, controller: &str) -> Option<PathBuf> {
    host.v1_dir(controller)
}

impl CgroupRoot {
    /// Finds the host's cgroup layout and creates this engine's parent groups, or
    /// says why not.
    pub fn create() -> Result<CgroupRoot, String> {
        CgroupRoot::create_with(Arc::new(RealFs), &HostLayout::detect(), std::process::id())
    }

    /// The layout the host mounts (read now), whatever an engine would use.
    pub fn host_layout() -> Layout {
        HostLayout::detect().layout()
    }

    fn engine_name() -> String {
        format!(
            "paddock-{}-{}{}",
            std::process::id(),
            NEXT_ROOT.fetch_add(1, Ordering::Relaxed),
            super::owner::namespace_suffix()
        )
    }

    fn create_with(
        fs: Arc<dyn CgroupFs>,
        host: &HostLayout,
        self_pid: u32,
    ) -> Result<CgroupRoot, String> {
        let layout = host.layout();
        let name = CgroupRoot::engine_name();
        let v1_limits = v1_dir(host, "pids").is_some() && v1_dir(host, "memory").is_some();
        match layout {
            Layout::None => Err("no cgroup hierarchy is mounted".into()),
            Layout::V1 | Layout::Hybrid if v1_limits => {
                let v1 = CgroupRoot::create_v1(host, &name)?;
                let mut root = CgroupRoot {
                    fs: fs.clone(),
                    layout,
                    v1: Some(v1),
                    v2: None,
                    v2_unused: None,
                };
                if layout == Layout::Hybrid {
                    // The v2 mount holds no controller we need, but its groups can
                    // be killed with `cgroup.kill`.
                    match CgroupRoot::create_v2(fs.as_ref(), host, &name, self_pid, false) {
                        Ok(v2) if v2.kill => root.v2 = Some(v2),
                        Ok(v2) => {
                            let _ = v2::remove_tree(fs.as_ref(), &v2.dir);
                            root.v2_unused = Some("the v2 mount offers no cgroup.kill".into());
                        }
                        Err(why) => root.v2_unused = Some(why),
                    }
                }
                Ok(root)
            }
            Layout::V1 => Err(match v1_dir(host, "pids") {
                None => "no cgroup v1 `pids` hierarchy is mounted".into(),
                Some(_) => "no cgroup v1 `memory` hierarchy is mounted".into(),
            }),
            Layout::Hybrid | Layout::V2 => {
                let v2 = CgroupRoot::create_v2(fs.as_ref(), host, &name, self_pid, true)?;
                Ok(CgroupRoot {
                    fs,
                    layout,
                    v1: None,
                    v2: Some(v2),
                    v2_unused: None,
                })
            }
        }
    }

    fn create_v1(host: &HostLayout, name: &str) -> Result<V1Root, String> {
        let pids = v1_dir(host, "pids").ok_or("no cgroup v1 `pids` hierarchy is mounted")?;
        let memory = v1_dir(host, "memory").ok_or("no cgroup v1 `memory` hierarchy is mounted")?;
        let cpu = v1_dir(host, "cpu").filter(|d| d.join("cpu.cfs_quota_us").exists());
        let freezer = v1_dir(host, "freezer");
        remove_stale(&pids, &memory, cpu.as_deref(), freezer.as_deref());
        let mut made = Vec::new();
        let mut mk = |base: &Path| -> Result<PathBuf, String> {
            let dir = base.join(name);
            std::fs::create_dir(&dir)
                .map_err(|e| format!("cannot create cgroup `{}`: {e}", dir.display()))?;
            made.push(dir.clone());
            Ok(dir)
        };
        let result = (|| {
            Ok(V1Root {
                pids: mk(&pids)?,
                memory: mk(&memory)?,
                cpu: match &cpu {
                    Some(c) => Some(mk(c)?),
                    None => None,
                },
                freezer: match &freezer {
                    Some(f) => Some(mk(f)?),
                    None => None,
                },
            })
        })();
        if result.is_err() {
            for dir in made.iter().rev() {
                let _ = std::fs::remove_dir(dir);
            }
        }
        result
    }

    /// The engine's group in the v2 hierarchy; with `limits`, with the controllers
    /// handed down to its sandboxes.
    fn create_v2(
        fs: &dyn CgroupFs,
        host: &HostLayout,
        name: &str,
        self_pid: u32,
        limits: bool,
    ) -> Result<V2Root, String> {
        let own = host.v2_dir().ok_or(
            "this process's cgroup v2 group is unknown (no `0::` line in /proc/self/cgroup)",
        )?;
        let placement = v2::place(fs, &own, self_pid, limits)?;
        v2::remove_stale(fs, &placement.base, "paddock-");
        let dir = placement.base.join(name);
        v2::create_parent(fs, &dir, &placement.controllers)
            .map_err(|e| format!("cannot create cgroup `{}`: {e}", dir.display()))?;
        Ok(V2Root {
            kill: fs.exists(&dir.join("cgroup.kill")),
            limits,
            cpu: placement.has("cpu"),
            dir,
            placement,
        })
    }

    /// Whether a freezer is available (a kill that cannot race a fork bomb, and
    /// pausing).
    pub fn has_freezer(&self) -> bool {
        self.v1.as_ref().is_some_and(|v| v.freezer.is_some()) || self.v2.is_some()
    }

    /// Whether `cpu_millicores` is enforced (a CPU controller is in use).
    pub fn has_cpu(&self) -> bool {
        match (&self.v1, &self.v2) {
            (Some(v1), _) => v1.cpu.is_some(),
            (None, Some(v2)) => v2.cpu,
            (None, None) => false,
        }
    }

    /// The layout the root was made for.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// What this root uses on this host.
    pub fn report(&self) -> CgroupReport {
        let mut groups = Vec::new();
        if let Some(v1) = &self.v1 {
            groups.extend([v1.pids.clone(), v1.memory.clone()]);
            groups.extend(v1.cpu.clone());
            groups.extend(v1.freezer.clone());
        }
        if let Some(v2) = &self.v2 {
            groups.push(v2.dir.clone());
        }
        let v2_kill = self.v2.as_ref().is_some_and(|v| v.kill);
        let v1_freezer = self.v1.as_ref().is_some_and(|v| v.freezer.is_some());
        CgroupReport {
            layout: self.layout,
            groups,
            limits: match &self.v1 {
                Some(_) => "v1 memory, pids".into(),
                None => "v2 memory.max, memory.swap.max, pids.max".into(),
            },
            kill: match (v2_kill, v1_freezer) {
                (true, _) => "v2 cgroup.kill".into(),
                (false, true) => "v1 freezer, then SIGKILL to every member".into(),
                (false, false) => "repeated SIGKILL to every member (no freezer)".into(),
            },
            freeze: if v1_freezer {
                Ok("v1 freezer".into())
            } else if self.v2.is_some() {
                Ok("v2 cgroup.freeze".into())
            } else {
                Err("no freezer hierarchy is mounted".into())
            },
            cpu: match (&self.v1, &self.v2) {
                (Some(v1), _) if v1.cpu.is_some() => Ok("v1 cpu.cfs_quota_us".into()),
                (Some(_), _) => Err("no cgroup v1 `cpu` hierarchy is mounted".into()),
                (None, Some(v2)) if v2.cpu => Ok("v2 cpu.max".into()),
                (None, Some(v2)) => Err(v2
                    .placement
                    .no_cpu
                    .clone()
                    .unwrap_or_else(|| "the cpu controller is not enabled".into())),
                (None, None) => Err("no cgroup".into()),
            },
            moved_into: self
                .v2
                .as_ref()
                .and_then(|v| v.placement.moved_into.clone()),
        }
    }

    /// Why the v2 mount of a hybrid host is not used for the kill, when it is not.
    pub fn v2_unused(&self) -> Option<&str> {
        self.v2_unused.as_deref()
    }

    /// Creates a sandbox's groups (`name` may hold a `/`: a group inside another).
    pub fn create_group(&self, name: &str) -> io::Result<Cgroup> {
        let mut made: Vec<PathBuf> = Vec::new();
        let undo = |made: &[PathBuf]| {
            for dir in made.iter().rev() {
                let _ = std::fs::remove_dir(dir);
            }
        };
        let v1 = match &self.v1 {
            Some(root) => {
                let g = V1Group {
                    pids: root.pids.join(name),
                    memory: root.memory.join(name),
                    cpu: root.cpu.as_ref().map(|c| c.join(name)),
                    freezer: root.freezer.as_ref().map(|f| f.join(name)),
                };
                for dir in [
                    Some(&g.pids),
                    Some(&g.memory),
                    g.cpu.as_ref(),
                    g.freezer.as_ref(),
                ]
                .into_iter()
                .flatten()
                {
                    if let Err(e) = std::fs::create_dir(dir) {
                        undo(&made);
                        return Err(e);
                    }
                    made.push(dir.clone());
                }
                Some(g)
            }
            None => None,
        };
        let v2 = match &self.v2 {
            Some(root) => {
                let dir = root.dir.join(name);
                if let Err(e) = v2::create_group(self.fs.as_ref(), &dir) {
                    undo(&made);
                    return Err(e);
                }
                Some(V2Group {
                    leaf: dir.join(LEAF),
                    dir,
                    limits: root.limits,
                    cpu: root.cpu,
                    kill: root.kill,
                })
            }
            None => None,
        };
        let mut procs_files = Vec::new();
        let mut procs_dirs: Vec<&PathBuf> = Vec::new();
        if let Some(g) = &v1 {
            procs_dirs.extend(
                [
                    Some(&g.pids),
                    Some(&g.memory),
                    g.cpu.as_ref(),
                    g.freezer.as_ref(),
                ]
                .into_iter()
                .flatten(),
            );
        }
        if let Some(g) = &v2 {
            procs_dirs.push(&g.leaf);
        }
        for dir in procs_dirs {
            procs_files.push(sys::cstring(
                dir.join("cgroup.procs")
                    .into_os_string()
                    .into_encoded_bytes(),
            )?);
        }
        Ok(Cgroup {
            fs: self.fs.clone(),
            v1,
            v2,
            procs_files,
            applied: parking_lot::Mutex::new(None),
            seen_oom: AtomicU64::new(0),
            seen_pids_max: AtomicU64::new(0),
        })
    }
}

impl Drop for CgroupRoot {
    fn drop(&mut self) {
        if let Some(v1) = &self.v1 {
            for dir in [
                Some(&v1.pids),
                Some(&v1.memory),
                v1.cpu.as_ref(),
                v1.freezer.as_ref(),
            ]
            .into_iter()
            .flatten()
            {
                let _ = std::fs::remove_dir(dir);
            }
        }
        if let Some(v2) = &self.v2 {
            let _ = self.fs.remove_dir(&v2.dir);
        }
    }
}

/// Removes groups left behind by Paddock processes that no longer exist (of this pid
/// namespace: see `owner`).
fn remove_stale(pids: &Path, memory: &Path, cpu: Option<&Path>, freezer: Option<&Path>) {
    for base in [Some(pids), Some(memory), cpu, freezer]
        .into_iter()
        .flatten()
    {
        let Ok(entries) = std::fs::read_dir(base) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix("paddock-") else {
                continue;
            };
            if !super::owner::owner_is_gone(rest) {
                continue;
            }
            // Sandboxes, and the groups of their background processes below them.
            let _ = remove_tree(&entry.path());
        }
    }
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value)
}

/// Sets a v1 memory group's limit, for memory and swap together where swap is
/// accounted (`None`: no limit). `memory.memsw.limit_in_bytes` must never be below
/// the memory limit, so it is lifted first and set last.
pub(crate) fn write_memory_limit(dir: &Path, bytes: Option<u64>) -> io::Result<()> {
    let value = bytes.map_or_else(|| "-1".to_string(), |b| b.to_string());
    let memsw = dir.join("memory.memsw.limit_in_bytes");
    let has_memsw = memsw.exists();
    if has_memsw {
        let _ = write(&memsw, "-1");
    }
    write(&dir.join("memory.limit_in_bytes"), &value)?;
    if has_memsw {
        let _ = write(&memsw, &value);
    }
    Ok(())
}

/// The error of a failed [`Cgroup::set_limits`] (`context` says which). The kernel
/// refuses a memory limit below what the group already holds (the sandbox's live
/// processes, memory it cannot reclaim) with `EBUSY`: that limit is the request's to
/// fix, `INVALID_OPTIONS` naming `limits.memory_bytes`, not an engine failure.
pub(crate) fn limits_error(
    e: io::Error,
    memory_bytes: Option<u64>,
    context: &str,
) -> paddock_core::Error {
    match (e.raw_os_error(), memory_bytes) {
        (Some(libc::EBUSY), Some(bytes)) => paddock_core::Error::invalid_options(
            "limits.memory_bytes",
            format!(
                "{bytes} bytes is less than the sandbox already uses (its running processes); raise it, or stop them first"
            ),
        ),
        _ => paddock_core::Error::engine_io(context, e),
    }
}

/// The `max` count of a `pids.events` file: forks the group's pids limit refused.
pub(crate) fn pids_max_count(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("max ")?.trim().parse().ok())
        .unwrap_or(0)
}

/// The warning a result carries when the pids limit refused a fork.
pub(crate) fn pids_warning(refused: bool, limits: &paddock_core::Limits) -> Vec<String> {
    if refused {
        vec![format!(
            "the pids limit ({}) refused at least one fork",
            limits.pids.unwrap_or(0)
        )]
    } else {
        Vec::new()
    }
}

/// The `oom_kill N` count of a `memory.oom_control` (or `/proc/vmstat`) text.
pub(crate) fn oom_kill_count(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
        .unwrap_or(0)
}

/// Writes a v1 cpu group's bandwidth: `cpu.cfs_period_us`, then
/// `cpu.cfs_quota_us` (-1: unlimited).
fn write_v1_cpu(dir: &Path, millicores: Option<u64>) -> io::Result<()> {
    write(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
    let quota = millicores.map_or_else(
        || "-1".to_string(),
        |m| {
            (m.saturating_mul(CPU_PERIOD_US) / 1000)
                .max(1000)
                .to_string()
        },
    );
    write(&dir.join("cpu.cfs_quota_us"), &quota)
}

impl Cgroup {
    /// The `cgroup.procs` files a child writes "0" to, to join every hierarchy.
    pub(crate) fn procs_files(&self) -> &[CString] {
        &self.procs_files
    }

    /// Moves process `pid` into the group, in every hierarchy it has.
    pub fn add_process(&self, pid: libc::pid_t) -> io::Result<()> {
        for file in &self.procs_files {
            use std::os::unix::ffi::OsStrExt;
            let path = Path::new(std::ffi::OsStr::from_bytes(file.as_bytes()));
            self.fs.write(path, &pid.to_string())?;
        }
        Ok(())
    }

    /// The group's directory in the v2 hierarchy, when it has one (v2, or the kill
    /// group of a hybrid host).
    pub fn v2_dir(&self) -> Option<&Path> {
        self.v2.as_ref().map(|v| v.dir.as_path())
    }

    /// The group's v1 freezer directory, when the host mounts that hierarchy.
    pub fn v1_freezer_dir(&self) -> Option<&Path> {
        self.v1.as_ref().and_then(|v| v.freezer.as_deref())
    }

    /// The directory whose `cgroup.procs` lists the group's own processes.
    fn members_dir(&self) -> Option<&Path> {
        match (&self.v1, &self.v2) {
            (Some(v1), _) => Some(&v1.pids),
            (None, Some(v2)) => Some(&v2.leaf),
            (None, None) => None,
        }
    }

    /// The group's own processes (not those of groups below it).
    fn members(&self) -> io::Result<Vec<libc::pid_t>> {
        let dir = self.members_dir().ok_or(io::ErrorKind::NotFound)?;
        Ok(fs::parse_pids(&self.fs.read(&dir.join("cgroup.procs"))?))
    }

    /// Sets the memory limit (with no swap beyond it), the pids limit and the CPU
    /// bandwidth (`cpu_millicores`, where a CPU controller is in use) from
    /// `limits`; a no-op when they are what was last written.
    pub fn set_limits(&self, limits: &paddock_core::Limits) -> io::Result<()> {
        let wanted = GroupLimits {
            memory_bytes: limits.memory_bytes,
            pids: limits.pids,
            cpu_millicores: limits.cpu_millicores,
        };
        let mut applied = self.applied.lock();
        if *applied == Some(wanted) {
            return Ok(());
        }
        *applied = None;
        if let Some(v1) = &self.v1 {
            write_memory_limit(&v1.memory, wanted.memory_bytes)?;
            let pids_value = wanted
                .pids
                .map_or_else(|| "max".to_string(), |p| p.to_string());
            write(&v1.pids.join("pids.max"), &pids_value)?;
            if let Some(cpu) = &v1.cpu {
                write_v1_cpu(cpu, wanted.cpu_millicores)?;
            }
        } else if let Some(v2) = self.v2.as_ref().filter(|v| v.limits) {
            v2::set_limits(self.fs.as_ref(), &v2.dir, wanted, v2.cpu)?;
        }
        *applied = Some(wanted);
        Ok(())
    }

    /// Sets the limits unless some were set already (by an execution).
    pub fn set_limits_if_unset(&self, limits: &paddock_core::Limits) -> io::Result<()> {
        if self.applied.lock().is_some() {
            return Ok(());
        }
        self.set_limits(limits)
    }

    /// How many processes the kernel OOM-killed in the group since the last call.
    pub fn new_oom_kills(&self) -> u64 {
        let now = match (&self.v1, &self.v2) {
            (Some(v1), _) => crate::host::sys::read_small(v1.memory.join("memory.oom_control"))
                .map_or(0, |s| oom_kill_count(&s)),
            (None, Some(v2)) => v2::oom_kills(self.fs.as_ref(), &v2.dir),
            (None, None) => 0,
        };
        now.saturating_sub(self.seen_oom.swap(now, Ordering::AcqRel))
    }

    /// How many forks the pids limit refused since the last call.
    pub fn new_pids_max_hits(&self) -> u64 {
        let now = match (&self.v1, &self.v2) {
            (Some(v1), _) => crate::host::sys::read_small(v1.pids.join("pids.events"))
                .map_or(0, |s| pids_max_count(&s)),
            (None, Some(v2)) => v2::pids_max_hits(self.fs.as_ref(), &v2.dir),
            (None, None) => 0,
        };
        now.saturating_sub(self.seen_pids_max.swap(now, Ordering::AcqRel))
    }

    /// Whether any process is still in the group (its own, not those of groups
    /// below it).
    pub fn is_populated(&self) -> bool {
        self.members().map(|m| !m.is_empty()).unwrap_or(false)
    }

    /// Whether the group holds a process that is not in `keep`.
    pub fn has_other_than(&self, keep: &[libc::pid_t]) -> bool {
        self.members()
            .map(|m| m.iter().any(|pid| !keep.contains(pid)))
            .unwrap_or(true)
    }

    /// Kills every process in the group (its own: groups below it are spared) and
    /// waits (up to 5 s) until it is empty: through `cgroup.kill` of its v2 leaf
    /// where it has one, else frozen (v1 freezer), SIGKILLed and thawed.
    pub fn kill_all(&self) -> io::Result<()> {
        if !self.has_other_than(&[]) {
            // Empty: nothing to freeze or kill.
            return Ok(());
        }
        if let Some(v2) = self.v2.as_ref().filter(|v| v.kill) {
            v2::kill(self.fs.as_ref(), &v2.leaf, v2::KILL_WAIT)?;
            // Hybrid: the same processes, gone from v1 too (one read when empty).
            return match &self.v1 {
                Some(v1) => kill_procs(&v1.pids),
                None => Ok(()),
            };
        }
        let Some(v1) = &self.v1 else {
            return Ok(());
        };
        if let Some(f) = &v1.freezer {
            // Frozen tasks cannot fork, so one pass catches every one of them; they
            // die once thawed.
            if freeze(f, KILL_FREEZE_WAIT) {
                let _ = signal_procs(&v1.pids);
            }
            let _ = write(&f.join("freezer.state"), "THAWED");
        }
        kill_procs(&v1.pids)
    }

    /// Kills every process in the group except those in `keep` (warm workers between
    /// turns) and waits (up to 5 s) until only they are left. Returns how many were
    /// killed.
    pub fn kill_all_except(&self, keep: &[libc::pid_t]) -> io::Result<usize> {
        if !self.has_other_than(keep) {
            // The common case after a turn: nothing but the worker, no freeze needed.
            return Ok(0);
        }
        let Some(v1) = &self.v1 else {
            return match &self.v2 {
                Some(v2) => v2::kill_except(self.fs.as_ref(), &v2.leaf, keep),
                None => Ok(0),
            };
        };
        let mut killed = 0;
        if let Some(f) = &v1.freezer {
            if freeze(f, KILL_FREEZE_WAIT) {
                killed += signal_procs_except(&v1.pids, keep).unwrap_or(0);
            }
            let _ = write(&f.join("freezer.state"), "THAWED");
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let n = signal_procs_except(&v1.pids, keep)?;
            if n == 0 {
                return Ok(killed);
            }
            killed += n;
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "processes in `{}` survived SIGKILL for 5 s",
                        v1.pids.display()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Kills everything and removes the group's directories (in v2, with every
    /// group below it).
    pub fn remove(&self) -> io::Result<()> {
        self.kill_all()?;
        if let Some(v1) = &self.v1 {
            for dir in [
                Some(&v1.pids),
                Some(&v1.memory),
                v1.cpu.as_ref(),
                v1.freezer.as_ref(),
            ]
            .into_iter()
            .flatten()
            {
                // The kernel may take a moment to drop exited tasks from the group.
                let mut tries = 0;
                loop {
                    match std::fs::remove_dir(dir) {
                        Ok(()) => break,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                        Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 500 => {
                            tries += 1;
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        if let Some(v2) = &self.v2 {
            v2::remove_tree(self.fs.as_ref(), &v2.dir)?;
        }
        Ok(())
    }
}

/// Freezes the group and waits until the kernel reports it frozen (up to 1 s).
fn freeze(dir: &Path, wait: Duration) -> bool {
    let state = dir.join("freezer.state");
    if write(&state, "FROZEN").is_err() {
        return false;
    }
    let deadline = Instant::now() + wait;
    let mut polls: u32 = 0;
    while Instant::now() < deadline {
        match crate::host::sys::read_small(&state) {
            Ok(s) if s.trim() == "FROZEN" => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
        polls += 1;
        // The v1 freezer walks the group's tasks once per write. A task forked while
        // that walk runs can escape it and keep the group in `FREEZING` for good (a
        // shell loop that forks every few ms hits this about one pause in fifteen; each of those froze on the second write).
        // Writing `FROZEN` again walks the tasks again; a short thaw now and then
        // also frees a task caught halfway through its fork.
        if polls.is_multiple_of(250) {
            let _ = write(&state, "THAWED");
            std::thread::sleep(Duration::from_micros(100));
            if write(&state, "FROZEN").is_err() {
                return false;
            }
        } else if polls.is_multiple_of(25) && write(&state, "FROZEN").is_err() {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    false
}

/// Kills what is listed in `dir/cgroup.procs` until it stays empty (up to 5 s).
fn kill_procs(dir: &Path) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if signal_procs(dir)? == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("processes in `{}` survived SIGKILL for 5 s", dir.display()),
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sends SIGKILL to every process listed in `dir/cgroup.procs`; returns how many.
fn signal_procs(dir: &Path) -> io::Result<usize> {
    signal_procs_except(dir, &[])
}

/// [`signal_procs`], sparing the processes in `keep`.
fn signal_procs_except(dir: &Path, keep: &[libc::pid_t]) -> io::Result<usize> {
    let procs = crate::host::sys::read_small(dir.join("cgroup.procs"))?;
    let mut n = 0;
    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        if keep.contains(&pid) {
            continue;
        }
        sys::kill_pid(pid, libc::SIGKILL);
        n += 1;
    }
    Ok(n)
}

/// One mounted cgroup hierarchy (v1 or v2), for groups an OCI runtime creates in
/// every hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// The hierarchy path the mount exposes (`/` unless a subtree is mounted).
    pub mount_root: String,
    /// Its controllers (`["memory"]`, or `[]` for v2 and named hierarchies).
    pub controllers: Vec<String>,
}

impl Hierarchy {
    /// The directory of the absolute cgroup path `path` in this hierarchy.
    pub fn dir(&self, path: &str) -> PathBuf {
        let rel = path.strip_prefix(self.mount_root.as_str()).unwrap_or(path);
        self.mount_point.join(rel.trim_start_matches('/'))
    }
}

/// Every cgroup hierarchy mounted in this mount namespace.
pub fn hierarchies() -> Vec<Hierarchy> {
    let Ok(mountinfo) = crate::host::sys::read_small("/proc/self/mountinfo") else {
        return Vec::new();
    };
    crate::host::sys::mount_lines(&mountinfo)
        .filter(|m| m.fstype == "cgroup" || m.fstype == "cgroup2")
        .map(|m| Hierarchy {
            mount_point: PathBuf::from(m.point),
            mount_root: m.root.to_string(),
            controllers: if m.fstype == "cgroup" {
                v1_controllers(m.super_opts)
            } else {
                Vec::new()
            },
        })
        .collect()
}

/// The controllers among a v1 cgroup mount's superblock options (`[]` for a named
/// hierarchy such as `name=systemd`).
pub(crate) fn v1_controllers(super_opts: &str) -> Vec<String> {
    super_opts
        .split(',')
        .filter(|o| {
            !o.contains('=')
                && !matches!(*o, "rw" | "ro" | "relatime" | "noexec" | "nosuid" | "nodev")
        })
        .map(String::from)
        .collect()
}

/// This process's own path in the hierarchy holding `controller` (v1).
pub fn own_path(controller: &str) -> Option<String> {
    let cgroups = crate::host::sys::read_small("/proc/self/cgroup").ok()?;
    cgroups.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let _id = parts.next()?;
        let controllers = parts.next()?;
        let path = parts.next()?;
        controllers
            .split(',')
            .any(|c| c == controller)
            .then(|| path.to_string())
    })
}

/// Moves `pid` into this process's own groups, in every hierarchy with
/// controllers (and the v2 one): out of a sandbox's CPU and memory limits.
///
/// For a child that was killed before it could exec (see `spawn::START_LIMIT`): a
/// task dies only once it is scheduled, and in a sandbox whose CPU quota its other
/// processes use up, or whose memory they keep at the limit, it may not run for
/// minutes. It runs no code of its own after the kill, so it may run where Paddock
/// does. Returns how many hierarchies it was moved in.
pub(crate) fn return_to_own_groups(pid: libc::pid_t) -> usize {
    let Ok(own) = crate::host::sys::read_small("/proc/self/cgroup") else {
        return 0;
    };
    let mounted = hierarchies();
    let mut moved = 0;
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let wanted: Vec<&str> = controllers.split(',').filter(|c| !c.is_empty()).collect();
        // Named v1 hierarchies (`name=systemd`) limit nothing.
        if wanted.iter().any(|c| c.contains('=')) {
            continue;
        }
        // Every mount of the hierarchy, whole ones first: the first that takes it.
        let mut candidates: Vec<&Hierarchy> = mounted
            .iter()
            .filter(|h| {
                if wanted.is_empty() {
                    h.controllers.is_empty() && h.mount_point.join("cgroup.controllers").exists()
                } else {
                    wanted
                        .iter()
                        .all(|c| h.controllers.iter().any(|have| have == c))
                }
            })
            .collect();
        candidates.sort_by_key(|h| h.mount_root != "/");
        if candidates
            .iter()
            .any(|h| std::fs::write(h.dir(path).join("cgroup.procs"), pid.to_string()).is_ok())
        {
            moved += 1;
        }
    }
    if moved == 0 {
        tracing::warn!(
            pid,
            "a killed child could not be moved out of its sandbox's cgroups"
        );
    }
    moved
}

/// How long a pause waits for the kernel to freeze every task. A task in an
/// uninterruptible sleep (disk I/O on a loaded host) holds the group in `FREEZING`
/// until it wakes, which can take well over a second.
const PAUSE_FREEZE_WAIT: Duration = Duration::from_secs(5);

/// How long a kill waits for the group to freeze before it signals anyway.
const KILL_FREEZE_WAIT: Duration = Duration::from_secs(1);

/// Freezes (or thaws) the v1 freezer group at `dir` and, when freezing, waits (up
/// to 5 s) until the kernel reports every task frozen. A group that does not freeze
/// in time is thawed again, so that a failed pause leaves it running, not half
/// frozen.
pub fn set_frozen(dir: &Path, frozen: bool) -> io::Result<()> {
    if frozen {
        if freeze(dir, PAUSE_FREEZE_WAIT) {
            Ok(())
        } else {
            let _ = write(&dir.join("freezer.state"), "THAWED");
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "`{}` did not freeze within {} s (a task stuck in the kernel); it was thawed again",
                    dir.display(),
                    PAUSE_FREEZE_WAIT.as_secs()
                ),
            ))
        }
    } else {
        write(&dir.join("freezer.state"), "THAWED")
    }
}

/// Where the container engine's groups go on a pure v2 host: the v2 placement
/// (see the module's doc) as a cgroup path, its directory, and the controllers
/// enabled there.
pub(crate) fn v2_container_base() -> Result<(String, PathBuf, Vec<String>), String> {
    let host = HostLayout::detect();
    let (Some(mount), Some(own)) = (host.v2.as_ref(), host.v2_dir()) else {
        return Err("no cgroup2 hierarchy is mounted".into());
    };
    let placed = v2::place(&RealFs, &own, std::process::id(), true)?;
    let rel = placed
        .base
        .strip_prefix(&mount.mount_point)
        .map_err(|_| "the v2 placement lies outside the cgroup2 mount".to_string())?;
    let root = mount.mount_root.trim_end_matches('/');
    let path = format!("{root}/{}", rel.display());
    Ok((path, placed.base, placed.controllers))
}

/// Creates the v2 group `dir` unless it exists, and hands `controllers` to its
/// children (a sandbox's containers) unless it does already; its parent must exist.
pub(crate) fn ensure_v2_parent(dir: &Path, controllers: &[String]) -> io::Result<()> {
    v2::ensure_parent(&RealFs, dir, controllers)
}

/// Writes a v2 group's memory (no swap beyond it) and pids limits.
pub(crate) fn write_v2_limits(
    dir: &Path,
    memory_bytes: Option<u64>,
    pids: Option<u64>,
) -> io::Result<()> {
    let limits = GroupLimits {
        memory_bytes,
        pids,
        cpu_millicores: None,
    };
    v2::set_limits(&RealFs, dir, limits, false)
}

/// Removes the v2 group `dir` and every group below it, killing what runs there
/// first (`cgroup.kill`). A missing `dir` is not an error.
pub(crate) fn remove_tree_v2(dir: &Path) -> io::Result<()> {
    v2::remove_tree(&RealFs, dir)
}

/// Removes what dead Paddock processes left below the v2 group `base`: groups
/// named `<prefix><pid>…` whose owner is gone.
pub(crate) fn remove_stale_v2(base: &Path, prefix: &str) {
    v2::remove_stale(&RealFs, base, prefix)
}

/// CPU time in a v2 `cpu.stat` text (`usage_usec`), in nanoseconds.
pub(crate) fn v2_cpu_usage_ns(text: &str) -> u64 {
    v2::cpu_usage_ns(text)
}

/// The cgroup2 mount point of this mount namespace, if one is mounted.
pub fn v2_mount() -> Option<PathBuf> {
    HostLayout::detect().v2.map(|m| m.mount_point)
}

/// Kills every process in the v2 group `dir` and in every group below it through
/// `cgroup.kill` (atomic: a fork in flight dies too, and so do frozen tasks), and
/// waits, up to 5 s, until the kernel reports it empty (`populated 0` in
/// `cgroup.events`). An empty group is left alone.
pub fn kill_v2(dir: &Path) -> io::Result<()> {
    v2::kill(&RealFs, dir, v2::KILL_WAIT)
}

/// Freezes (`cgroup.freeze`) or thaws the v2 group `dir` and every group below it;
/// a freeze waits, up to 5 s, until the kernel reports it `frozen 1` in
/// `cgroup.events`, and a group that does not freeze in time is thawed again.
pub fn set_frozen_v2(dir: &Path, frozen: bool) -> io::Result<()> {
    v2::set_frozen(&RealFs, dir, frozen, PAUSE_FREEZE_WAIT)
}

/// Kills everything in the v1 group whose `pids` (and optionally `freezer`)
/// directory is given: frozen first when it can be, so nothing forks past the kill.
pub fn kill_dirs(pids: &Path, freezer: Option<&Path>) -> io::Result<()> {
    if !pids.exists() {
        return Ok(());
    }
    if let Some(f) = freezer.filter(|f| f.exists()) {
        if freeze(f, KILL_FREEZE_WAIT) {
            let _ = signal_procs(pids);
        }
        let _ = write(&f.join("freezer.state"), "THAWED");
    }
    kill_procs(pids)
}

/// Removes `dir` and every group below it, deepest first, killing what still runs in
/// one that will not go. A missing `dir` is not an error.
pub fn remove_tree(dir: &Path) -> io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    // A frozen task does not die until thawed (a paused sandbox's, say); in the
    // freezer hierarchy the thaw reaches every group below.
    let _ = write(&dir.join("freezer.state"), "THAWED");
    for entry in entries.flatten() {
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            remove_tree(&entry.path())?;
        }
    }
    let mut tries = 0;
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 500 => {
                if tries % 50 == 0 {
                    let _ = signal_procs(dir);
                }
                tries += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fs::{FakeFs, Op};
    use super::*;

    const V2_MOUNT: &str = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate";

    /// A pure v2 host where Paddock runs alone in a delegated scope.
    fn pure_v2(controllers: &str) -> (Arc<FakeFs>, HostLayout) {
        let fs = Arc::new(FakeFs::v2("/sys/fs/cgroup", controllers));
        fs.mkgroup("/sys/fs/cgroup/paddock.scope", controllers);
        fs.add_proc("/sys/fs/cgroup/paddock.scope", 42);
        let host = HostLayout::parse(V2_MOUNT, "0::/paddock.scope\n");
        (fs, host)
    }

    fn limits(memory: u64, pids: u64, millicores: Option<u64>) -> paddock_core::Limits {
        paddock_core::Limits {
            memory_bytes: Some(memory),
            pids: Some(pids),
            cpu_millicores: millicores,
            ..Default::default()
        }
    }

    #[test]
    fn on_pure_v2_a_sandbox_gets_its_limits_accounting_kill_and_removal_in_v2() {
        let (fs, host) = pure_v2("cpu memory pids");
        let root = CgroupRoot::create_with(fs.clone(), &host, 42).unwrap();
        assert_eq!(root.layout(), Layout::V2);
        assert!(root.has_cpu() && root.has_freezer());
        let report = root.report();
        let engine = report.groups[0].clone();
        assert!(
            engine.starts_with("/sys/fs/cgroup/paddock.scope/"),
            "{engine:?}"
        );
        assert!(report.moved_into.is_some());
        assert_eq!(report.kill, "v2 cgroup.kill");
        assert_eq!(report.cpu, Ok("v2 cpu.max".into()));
        // Controllers are handed to the sandboxes.
        let engine_s = engine.display().to_string();
        assert_eq!(
            fs.get(&format!("{engine_s}/cgroup.subtree_control"))
                .unwrap(),
            "cpu memory pids"
        );

        let g = root.create_group("sb").unwrap();
        let sb = format!("{engine_s}/sb");
        let files: Vec<_> = g
            .procs_files()
            .iter()
            .map(|f| f.to_str().unwrap().to_string())
            .collect();
        assert_eq!(files, [format!("{sb}/leaf/cgroup.procs")]);
        fs.clear_ops();
        g.set_limits(&limits(1 << 20, 8, Some(500))).unwrap();
        // The same limits again: nothing written.
        g.set_limits(&limits(1 << 20, 8, Some(500))).unwrap();
        assert_eq!(
            fs.writes(),
            [
                (format!("{sb}/memory.max"), "1048576".into()),
                (format!("{sb}/memory.swap.max"), "0".into()),
                (format!("{sb}/pids.max"), "8".into()),
                (format!("{sb}/cpu.max"), "50000 100000".into()),
            ]
        );

        g.add_process(100).unwrap();
        g.add_process(101).unwrap();
        assert!(g.is_populated() && g.has_other_than(&[100]) && !g.has_other_than(&[100, 101]));
        fs.set(&format!("{sb}/memory.events"), "oom 1\noom_kill 1\n");
        fs.set(&format!("{sb}/pids.events"), "max 3\n");
        assert_eq!((g.new_oom_kills(), g.new_pids_max_hits()), (1, 3));
        // Only new events count.
        assert_eq!((g.new_oom_kills(), g.new_pids_max_hits()), (0, 0));

        // A background process's group inside the sandbox's survives its kill.
        let p = root.create_group("sb/p1").unwrap();
        p.add_process(200).unwrap();
        fs.clear_ops();
        assert_eq!(g.kill_all_except(&[100]).unwrap(), 1);
        g.kill_all().unwrap();
        assert!(!g.is_populated());
        assert!(fs
            .writes()
            .contains(&(format!("{sb}/leaf/cgroup.kill"), "1".into())));
        assert!(p.is_populated());
        // Removal kills the whole subtree and removes it, deepest first.
        fs.clear_ops();
        g.remove().unwrap();
        assert!(!fs.has_dir(&sb));
        assert!(!p.is_populated());
        assert!(fs.ops().contains(&Op::Write(
            PathBuf::from(format!("{sb}/cgroup.kill")),
            "1".into()
        )));
        drop(root);
        assert!(!fs.has_dir(&engine_s));
    }

    #[test]
    fn without_the_cpu_controller_cpu_millicores_is_not_enforced_and_limits_still_work() {
        let (fs, host) = pure_v2("memory pids");
        let root = CgroupRoot::create_with(fs.clone(), &host, 42).unwrap();
        assert!(!root.has_cpu());
        assert!(root.report().cpu.is_err());
        let g = root.create_group("sb").unwrap();
        fs.clear_ops();
        g.set_limits(&limits(4096, 2, Some(100))).unwrap();
        assert!(!fs.writes().iter().any(|(p, _)| p.ends_with("cpu.max")));
        assert_eq!(fs.writes().len(), 3);
    }

    #[test]
    fn a_shared_group_or_one_without_controllers_is_refused_with_the_reason() {
        let (fs, host) = pure_v2("memory pids");
        fs.add_proc("/sys/fs/cgroup/paddock.scope", 43);
        let why = CgroupRoot::create_with(fs.clone(), &host, 42).unwrap_err();
        assert!(why.contains("other process"), "{why}");
        let (fs, host) = pure_v2("pids");
        let why = CgroupRoot::create_with(fs, &host, 42).unwrap_err();
        assert!(why.contains("memory controller"), "{why}");
        let none = HostLayout::parse("", "");
        let why = CgroupRoot::create_with(Arc::new(FakeFs::default()), &none, 1).unwrap_err();
        assert!(why.contains("no cgroup"), "{why}");
    }

    #[test]
    fn the_oom_and_pids_counters_read_both_versions_files() {
        let v2_events = "low 0\nhigh 2\nmax 7\noom 4\noom_kill 3\noom_group_kill 1\n";
        assert_eq!(oom_kill_count(v2_events), 3);
        let v1_control = "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n";
        assert_eq!(oom_kill_count(v1_control), 5);
        assert_eq!(pids_max_count("max 9\n"), 9);
        assert_eq!(oom_kill_count(""), 0);
    }

    #[test]
    fn v1_cpu_quota_is_the_millicores_share_of_the_period() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["cpu.cfs_period_us", "cpu.cfs_quota_us"] {
            std::fs::write(dir.path().join(f), "").unwrap();
        }
        write_v1_cpu(dir.path(), Some(200)).unwrap();
        let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
        assert_eq!(read("cpu.cfs_period_us"), "100000");
        assert_eq!(read("cpu.cfs_quota_us"), "20000");
        write_v1_cpu(dir.path(), None).unwrap();
        assert_eq!(read("cpu.cfs_quota_us"), "-1");
    }
}
