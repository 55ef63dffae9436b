//! The engine-level parent groups ([`CgroupRoot`]): finding the host's layout,
//! creating the engine's groups in each hierarchy it uses, what it reports to
//! `paddock doctor`, and creating a sandbox's groups below them.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::layout::HostLayout;
use super::v1::remove_stale;
use super::v2::{self, LEAF};
use super::{
    Cgroup, CgroupFs, CgroupReport, CgroupRoot, Layout, RealFs, V1Group, V1Root, V2Group, V2Root,
};
use crate::host::sys;

static NEXT_ROOT: AtomicU64 = AtomicU64::new(0);

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
            crate::host::owner::namespace_suffix()
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

#[cfg(test)]
mod tests {
    use super::super::fs::{FakeFs, Op};
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
}
