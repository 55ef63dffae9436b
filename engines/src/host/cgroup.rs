//! Per-sandbox cgroups: a pids and memory limit, peak and OOM accounting, and a kill
//! that no process escapes (`setsid` included), through the freezer.
//!
//! Paddock places its groups under the cgroup the host process already lives in, one
//! parent per engine (`paddock-<pid>-<n>`) and one child per sandbox. The v1
//! controllers `pids`, `memory` and (optionally) `freezer` are used; on a pure v2 host
//! without a delegated subtree the engine falls back to rlimits and says why.

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::host::sys;

static NEXT_ROOT: AtomicU64 = AtomicU64::new(0);

/// The engine-level parent groups, one directory per controller.
#[derive(Debug)]
pub struct CgroupRoot {
    pids: PathBuf,
    memory: PathBuf,
    freezer: Option<PathBuf>,
}

/// One sandbox's groups.
#[derive(Debug)]
pub struct Cgroup {
    pids: PathBuf,
    memory: PathBuf,
    freezer: Option<PathBuf>,
    procs_files: Vec<CString>,
    /// The (memory, pids) limits last written, to skip rewriting them.
    applied: parking_lot::Mutex<Option<(Option<u64>, Option<u64>)>>,
    /// Event counters as last seen, so each check reports only new events.
    seen_oom: AtomicU64,
    seen_pids_max: AtomicU64,
}

/// A v1 mount: its mount point and our own path inside it, for one controller.
fn v1_dir(controller: &str) -> Option<PathBuf> {
    let mountinfo = crate::host::sys::read_small("/proc/self/mountinfo").ok()?;
    let mount = mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut rf = right.split_whitespace();
        if rf.next()? != "cgroup" {
            return None;
        }
        let _source = rf.next()?;
        let super_opts = rf.next()?;
        if !super_opts.split(',').any(|o| o == controller) {
            return None;
        }
        let fields: Vec<&str> = left.split_whitespace().collect();
        Some((fields.get(3)?.to_string(), PathBuf::from(fields.get(4)?)))
    })?;
    let (mount_root, mount_point) = mount;
    let cgroups = crate::host::sys::read_small("/proc/self/cgroup").ok()?;
    let own = cgroups.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let _id = parts.next()?;
        let controllers = parts.next()?;
        let path = parts.next()?;
        controllers
            .split(',')
            .any(|c| c == controller)
            .then(|| path.to_string())
    })?;
    // Our path is relative to the hierarchy root; the mount may expose a subtree.
    let rel = own.strip_prefix(&mount_root).unwrap_or(&own);
    Some(mount_point.join(rel.trim_start_matches('/')))
}

impl CgroupRoot {
    /// Finds the controllers and creates this engine's parent groups, or says why not.
    pub fn create() -> Result<CgroupRoot, String> {
        let pids = v1_dir("pids").ok_or("no cgroup v1 `pids` hierarchy is mounted")?;
        let memory = v1_dir("memory").ok_or("no cgroup v1 `memory` hierarchy is mounted")?;
        let freezer = v1_dir("freezer");
        remove_stale(&pids, &memory, freezer.as_deref());
        let name = format!(
            "paddock-{}-{}{}",
            std::process::id(),
            NEXT_ROOT.fetch_add(1, Ordering::Relaxed),
            super::owner::namespace_suffix()
        );
        let mut made = Vec::new();
        let mut mk = |base: &Path| -> Result<PathBuf, String> {
            let dir = base.join(&name);
            std::fs::create_dir(&dir)
                .map_err(|e| format!("cannot create cgroup `{}`: {e}", dir.display()))?;
            made.push(dir.clone());
            Ok(dir)
        };
        let result = (|| {
            let pids = mk(&pids)?;
            let memory = mk(&memory)?;
            let freezer = match &freezer {
                Some(f) => Some(mk(f)?),
                None => None,
            };
            Ok(CgroupRoot {
                pids,
                memory,
                freezer,
            })
        })();
        if result.is_err() {
            for dir in made.iter().rev() {
                let _ = std::fs::remove_dir(dir);
            }
        }
        result
    }

    /// Whether a freezer is available (a kill that cannot race a fork bomb).
    pub fn has_freezer(&self) -> bool {
        self.freezer.is_some()
    }

    /// Creates a sandbox's groups.
    pub fn create_group(&self, name: &str) -> io::Result<Cgroup> {
        let pids = self.pids.join(name);
        let memory = self.memory.join(name);
        let freezer = self.freezer.as_ref().map(|f| f.join(name));
        std::fs::create_dir(&pids)?;
        let rest = (|| {
            std::fs::create_dir(&memory)?;
            if let Some(f) = &freezer {
                if let Err(e) = std::fs::create_dir(f) {
                    let _ = std::fs::remove_dir(&memory);
                    return Err(e);
                }
            }
            Ok(())
        })();
        if let Err(e) = rest {
            let _ = std::fs::remove_dir(&pids);
            return Err(e);
        }
        let mut procs_files = Vec::new();
        for dir in [Some(&pids), Some(&memory), freezer.as_ref()]
            .into_iter()
            .flatten()
        {
            procs_files.push(sys::cstring(
                dir.join("cgroup.procs")
                    .into_os_string()
                    .into_encoded_bytes(),
            )?);
        }
        Ok(Cgroup {
            pids,
            memory,
            freezer,
            procs_files,
            applied: parking_lot::Mutex::new(None),
            seen_oom: AtomicU64::new(0),
            seen_pids_max: AtomicU64::new(0),
        })
    }
}

impl Drop for CgroupRoot {
    fn drop(&mut self) {
        for dir in [Some(&self.pids), Some(&self.memory), self.freezer.as_ref()]
            .into_iter()
            .flatten()
        {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Removes groups left behind by Paddock processes that no longer exist (of this pid
/// namespace: see `owner`).
fn remove_stale(pids: &Path, memory: &Path, freezer: Option<&Path>) {
    for base in [Some(pids), Some(memory), freezer].into_iter().flatten() {
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

impl Cgroup {
    /// The `cgroup.procs` files a child writes "0" to, to join every controller.
    pub(crate) fn procs_files(&self) -> &[CString] {
        &self.procs_files
    }

    /// Sets the memory limit (swap included where accounted) and the pids limit;
    /// a no-op when they are what was last written.
    pub fn set_limits(&self, memory_bytes: Option<u64>, pids: Option<u64>) -> io::Result<()> {
        let mut applied = self.applied.lock();
        if *applied == Some((memory_bytes, pids)) {
            return Ok(());
        }
        *applied = None;
        write_memory_limit(&self.memory, memory_bytes)?;
        let pids_value = pids.map_or_else(|| "max".to_string(), |p| p.to_string());
        write(&self.pids.join("pids.max"), &pids_value)?;
        *applied = Some((memory_bytes, pids));
        Ok(())
    }

    /// Sets the limits unless some were set already (by an execution).
    pub fn set_limits_if_unset(
        &self,
        memory_bytes: Option<u64>,
        pids: Option<u64>,
    ) -> io::Result<()> {
        if self.applied.lock().is_some() {
            return Ok(());
        }
        self.set_limits(memory_bytes, pids)
    }

    /// How many processes the kernel OOM-killed in the group since the last call.
    pub fn new_oom_kills(&self) -> u64 {
        let now = crate::host::sys::read_small(self.memory.join("memory.oom_control"))
            .map_or(0, |s| oom_kill_count(&s));
        now.saturating_sub(self.seen_oom.swap(now, Ordering::AcqRel))
    }

    /// How many forks the pids limit refused since the last call.
    pub fn new_pids_max_hits(&self) -> u64 {
        let now = crate::host::sys::read_small(self.pids.join("pids.events"))
            .map_or(0, |s| pids_max_count(&s));
        now.saturating_sub(self.seen_pids_max.swap(now, Ordering::AcqRel))
    }

    /// Whether any process is still in the group.
    pub fn is_populated(&self) -> bool {
        crate::host::sys::read_small(self.pids.join("cgroup.procs"))
            .map(|s| !s.trim().is_empty())
            .unwrap_or(false)
    }

    /// Whether the group holds a process that is not in `keep`.
    pub fn has_other_than(&self, keep: &[libc::pid_t]) -> bool {
        crate::host::sys::read_small(self.pids.join("cgroup.procs"))
            .map(|s| {
                s.lines()
                    .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
                    .any(|pid| !keep.contains(&pid))
            })
            .unwrap_or(true)
    }

    /// Kills every process in the group and waits (up to 5 s) until it is empty.
    pub fn kill_all(&self) -> io::Result<()> {
        if !self.has_other_than(&[]) {
            // Empty: nothing to freeze or kill.
            return Ok(());
        }
        if let Some(f) = &self.freezer {
            // Frozen tasks cannot fork, so one pass catches every one of them; they
            // die once thawed.
            if freeze(f, KILL_FREEZE_WAIT) {
                let _ = signal_procs(&self.pids);
            }
            let _ = write(&f.join("freezer.state"), "THAWED");
        }
        kill_procs(&self.pids)
    }

    /// Kills every process in the group except those in `keep` (warm workers between
    /// turns) and waits (up to 5 s) until only they are left. Returns how many were
    /// killed.
    pub fn kill_all_except(&self, keep: &[libc::pid_t]) -> io::Result<usize> {
        if !self.has_other_than(keep) {
            // The common case after a turn: nothing but the worker, no freeze needed.
            return Ok(0);
        }
        let mut killed = 0;
        if let Some(f) = &self.freezer {
            if freeze(f, KILL_FREEZE_WAIT) {
                killed += signal_procs_except(&self.pids, keep).unwrap_or(0);
            }
            let _ = write(&f.join("freezer.state"), "THAWED");
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let n = signal_procs_except(&self.pids, keep)?;
            if n == 0 {
                return Ok(killed);
            }
            killed += n;
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "processes in `{}` survived SIGKILL for 5 s",
                        self.pids.display()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Kills everything and removes the group's directories.
    pub fn remove(&self) -> io::Result<()> {
        self.kill_all()?;
        for dir in [Some(&self.pids), Some(&self.memory), self.freezer.as_ref()]
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
        Ok(())
    }
}

/// Freezes the group and waits until the kernel reports it frozen (up to 1 s).
fn freeze(dir: &Path, wait: Duration) -> bool {
    if write(&dir.join("freezer.state"), "FROZEN").is_err() {
        return false;
    }
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        match crate::host::sys::read_small(dir.join("freezer.state")) {
            Ok(s) if s.trim() == "FROZEN" => return true,
            Ok(_) => std::thread::sleep(Duration::from_micros(200)),
            Err(_) => return false,
        }
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
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mut rf = right.split_whitespace();
            let fstype = rf.next()?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            let _source = rf.next()?;
            let super_opts = rf.next().unwrap_or("");
            let fields: Vec<&str> = left.split_whitespace().collect();
            let controllers = if fstype == "cgroup" {
                super_opts
                    .split(',')
                    .filter(|o| {
                        !o.contains('=')
                            && !matches!(
                                *o,
                                "rw" | "ro" | "relatime" | "noexec" | "nosuid" | "nodev"
                            )
                    })
                    .map(String::from)
                    .collect()
            } else {
                Vec::new()
            };
            Some(Hierarchy {
                mount_point: PathBuf::from(fields.get(4)?),
                mount_root: fields.get(3)?.to_string(),
                controllers,
            })
        })
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
