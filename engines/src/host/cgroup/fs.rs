//! The cgroup file operations, behind a small trait: the kernel's cgroupfs
//! ([`RealFs`]), or, in tests, an in-memory model of cgroup v2 that records every
//! change (`FakeFs`), so that the v2 logic is tested on every machine.

use std::io;
use std::path::Path;
#[cfg(test)]
use std::path::PathBuf;

/// What the cgroup backends do to the cgroup filesystem, and the one signal they send.
pub trait CgroupFs: Send + Sync + std::fmt::Debug {
    /// Reads a (small) cgroup file.
    fn read(&self, path: &Path) -> io::Result<String>;
    /// Writes `value` to a cgroup file (one `write`, as the kernel expects).
    fn write(&self, path: &Path, value: &str) -> io::Result<()>;
    /// Creates a group (a directory).
    fn create_dir(&self, path: &Path) -> io::Result<()>;
    /// Removes an empty group.
    fn remove_dir(&self, path: &Path) -> io::Result<()>;
    /// The names of the groups directly below `path`.
    fn list_dirs(&self, path: &Path) -> io::Result<Vec<String>>;
    /// Whether the file or group exists.
    fn exists(&self, path: &Path) -> bool;
    /// Sends SIGKILL to process `pid`.
    fn kill(&self, pid: libc::pid_t);
}

/// The kernel's cgroup filesystem.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFs;

impl CgroupFs for RealFs {
    fn read(&self, path: &Path) -> io::Result<String> {
        crate::host::sys::read_small(path)
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        use std::io::Write;
        // Not `fs::write`: no O_CREAT, so a file the kernel does not offer is an
        // error instead of a new file in a tmpfs.
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)?
            .write_all(value.as_bytes())
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir(path)
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }

    fn list_dirs(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(path)?.flatten() {
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        Ok(names)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn kill(&self, pid: libc::pid_t) {
        crate::host::sys::kill_pid(pid, libc::SIGKILL);
    }
}

/// The processes listed in a `cgroup.procs` text.
pub(crate) fn parse_pids(text: &str) -> Vec<libc::pid_t> {
    text.lines()
        .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
        .collect()
}

/// The value of `key` in a flat keyed file (`cgroup.events`, `memory.events`,
/// `pids.events`, `cpu.stat`): lines of `key value`.
pub(crate) fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

#[cfg(test)]
pub(crate) use fake::{FakeFs, Op};

#[cfg(test)]
mod fake {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    /// The directory a path names, as the fake stores it.
    fn norm(path: &Path) -> PathBuf {
        path.components().collect()
    }

    /// One change the code under test made, in order.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) enum Op {
        Write(PathBuf, String),
        Mkdir(PathBuf),
        Rmdir(PathBuf),
        Kill(libc::pid_t),
    }

    #[derive(Debug, Default)]
    struct State {
        dirs: BTreeSet<PathBuf>,
        files: BTreeMap<PathBuf, String>,
        /// Groups that are the root of their hierarchy (no `cgroup.type`, exempt from
        /// the no-internal-processes rule).
        roots: BTreeSet<PathBuf>,
        ops: Vec<Op>,
        /// Writes that fail, with their errno.
        failing: BTreeMap<(PathBuf, String), i32>,
        /// Groups whose tasks never report frozen (a task stuck in the kernel).
        stuck: BTreeSet<PathBuf>,
        /// Processes that ignore SIGKILL (to test the timeouts).
        unkillable: BTreeSet<libc::pid_t>,
    }

    /// An in-memory cgroup v2 hierarchy that behaves like the kernel's in what the
    /// backend relies on: a new group gets the interface files and those of the
    /// controllers its parent enables; `cgroup.subtree_control` refuses controllers
    /// the group lacks and, outside the root, a group with processes (EBUSY);
    /// `cgroup.procs` moves a process; `cgroup.kill` empties the subtree;
    /// `cgroup.freeze` freezes it; `cgroup.events` is computed on read; `rmdir`
    /// refuses a group with children or processes. Every change is recorded.
    #[derive(Debug, Default)]
    pub(crate) struct FakeFs {
        state: parking_lot::Mutex<State>,
    }

    impl FakeFs {
        /// A v2 hierarchy mounted at `mount`, its root offering `controllers`.
        pub(crate) fn v2(mount: &str, controllers: &str) -> FakeFs {
            let fs = FakeFs::default();
            {
                let mut s = fs.state.lock();
                let root = norm(Path::new(mount));
                s.dirs.insert(root.clone());
                s.roots.insert(root.clone());
                for (f, v) in [
                    ("cgroup.controllers", controllers),
                    ("cgroup.subtree_control", ""),
                    ("cgroup.procs", ""),
                ] {
                    s.files.insert(root.join(f), v.to_string());
                }
            }
            fs
        }

        /// Makes a group (and its parents) as someone else would, offering
        /// `controllers` (written into the parents' `subtree_control`).
        pub(crate) fn mkgroup(&self, path: &str, controllers: &str) {
            let path = norm(Path::new(path));
            let mut chain = Vec::new();
            let mut p = path.as_path();
            loop {
                if self.state.lock().dirs.contains(p) {
                    break;
                }
                chain.push(p.to_path_buf());
                p = p.parent().expect("under the mount");
            }
            for dir in chain.into_iter().rev() {
                let parent = dir.parent().expect("under the mount").to_path_buf();
                self.state
                    .lock()
                    .files
                    .insert(parent.join("cgroup.subtree_control"), controllers.into());
                self.make_group(&dir).expect("parent exists");
            }
            self.state.lock().ops.clear();
        }

        /// Sets a file's content as the kernel would show it.
        pub(crate) fn set(&self, path: &str, value: &str) {
            self.state
                .lock()
                .files
                .insert(norm(Path::new(path)), value.to_string());
        }

        /// A file's content.
        pub(crate) fn get(&self, path: &str) -> Option<String> {
            self.state.lock().files.get(&norm(Path::new(path))).cloned()
        }

        /// Whether a group exists.
        pub(crate) fn has_dir(&self, path: &str) -> bool {
            self.state.lock().dirs.contains(&norm(Path::new(path)))
        }

        /// Puts process `pid` in group `path` (a process the test starts).
        pub(crate) fn add_proc(&self, path: &str, pid: libc::pid_t) {
            let mut s = self.state.lock();
            move_proc(&mut s, &norm(Path::new(path)), pid);
        }

        /// Writes of `value` to `path` fail with `errno`.
        pub(crate) fn fail_writes(&self, path: &str, value: &str, errno: i32) {
            self.state
                .lock()
                .failing
                .insert((norm(Path::new(path)), value.to_string()), errno);
        }

        /// The group at `path` never reports frozen.
        pub(crate) fn stuck_freezing(&self, path: &str) {
            self.state.lock().stuck.insert(norm(Path::new(path)));
        }

        /// Process `pid` survives SIGKILL and `cgroup.kill`.
        pub(crate) fn unkillable(&self, pid: libc::pid_t) {
            self.state.lock().unkillable.insert(pid);
        }

        /// Every change so far, in order.
        pub(crate) fn ops(&self) -> Vec<Op> {
            self.state.lock().ops.clone()
        }

        /// The writes so far, as (path, value), in order.
        pub(crate) fn writes(&self) -> Vec<(String, String)> {
            self.ops()
                .into_iter()
                .filter_map(|op| match op {
                    Op::Write(p, v) => Some((p.display().to_string(), v)),
                    _ => None,
                })
                .collect()
        }

        /// Forgets the changes recorded so far.
        pub(crate) fn clear_ops(&self) {
            self.state.lock().ops.clear();
        }

        fn make_group(&self, dir: &Path) -> io::Result<()> {
            let mut s = self.state.lock();
            let parent = dir.parent().map(Path::to_path_buf).unwrap_or_default();
            if !s.dirs.contains(&parent) {
                return Err(io::Error::from_raw_os_error(libc::ENOENT));
            }
            if s.dirs.contains(dir) || s.files.contains_key(dir) {
                return Err(io::Error::from_raw_os_error(libc::EEXIST));
            }
            let enabled = s
                .files
                .get(&parent.join("cgroup.subtree_control"))
                .cloned()
                .unwrap_or_default();
            s.dirs.insert(dir.to_path_buf());
            let mut files = vec![
                ("cgroup.controllers", enabled.clone()),
                ("cgroup.subtree_control", String::new()),
                ("cgroup.procs", String::new()),
                ("cgroup.type", "domain".to_string()),
                ("cgroup.kill", String::new()),
                ("cgroup.freeze", "0".to_string()),
                (
                    "cpu.stat",
                    "usage_usec 0\nuser_usec 0\nsystem_usec 0".into(),
                ),
            ];
            for c in enabled.split_whitespace() {
                match c {
                    "memory" => files.extend([
                        ("memory.max", "max".to_string()),
                        ("memory.swap.max", "max".to_string()),
                        ("memory.peak", "0".to_string()),
                        (
                            "memory.events",
                            "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0".into(),
                        ),
                    ]),
                    "pids" => files.extend([
                        ("pids.max", "max".to_string()),
                        ("pids.events", "max 0".to_string()),
                    ]),
                    "cpu" => files.push(("cpu.max", "max 100000".to_string())),
                    _ => {}
                }
            }
            for (f, v) in files {
                s.files.insert(dir.join(f), v);
            }
            Ok(())
        }
    }

    fn procs_of(s: &State, dir: &Path) -> Vec<libc::pid_t> {
        s.files
            .get(&dir.join("cgroup.procs"))
            .map(|t| parse_pids(t))
            .unwrap_or_default()
    }

    fn set_procs(s: &mut State, dir: &Path, pids: &[libc::pid_t]) {
        let text: String = pids.iter().map(|p| format!("{p}\n")).collect();
        s.files.insert(dir.join("cgroup.procs"), text);
    }

    fn move_proc(s: &mut State, to: &Path, pid: libc::pid_t) {
        let dirs: Vec<PathBuf> = s.dirs.iter().cloned().collect();
        for d in &dirs {
            let mut p = procs_of(s, d);
            if p.contains(&pid) {
                p.retain(|&x| x != pid);
                set_procs(s, d, &p);
            }
        }
        let mut p = procs_of(s, to);
        p.push(pid);
        set_procs(s, to, &p);
    }

    fn subtree(s: &State, dir: &Path) -> Vec<PathBuf> {
        s.dirs
            .iter()
            .filter(|d| d.starts_with(dir))
            .cloned()
            .collect()
    }

    /// Whether the group and every group below it are frozen (as the kernel
    /// reports once every task has stopped).
    fn frozen(s: &State, dir: &Path) -> bool {
        let mut p = Some(dir);
        let mut asked = false;
        while let Some(d) = p {
            if s.files.get(&d.join("cgroup.freeze")).map(|v| v.trim()) == Some("1") {
                asked = true;
                break;
            }
            p = d.parent();
        }
        asked && !subtree(s, dir).iter().any(|d| s.stuck.contains(d))
    }

    fn kill_pid(s: &mut State, pid: libc::pid_t) {
        if s.unkillable.contains(&pid) {
            return;
        }
        let dirs: Vec<PathBuf> = s.dirs.iter().cloned().collect();
        for d in &dirs {
            let mut p = procs_of(s, d);
            if p.contains(&pid) {
                p.retain(|&x| x != pid);
                set_procs(s, d, &p);
            }
        }
    }

    fn errno(e: i32) -> io::Error {
        io::Error::from_raw_os_error(e)
    }

    impl CgroupFs for FakeFs {
        fn read(&self, path: &Path) -> io::Result<String> {
            let path = norm(path);
            let s = self.state.lock();
            let dir = path.parent().unwrap_or(Path::new("/"));
            if path.file_name().is_some_and(|n| n == "cgroup.events") && s.dirs.contains(dir) {
                let populated = subtree(&s, dir).iter().any(|d| !procs_of(&s, d).is_empty());
                return Ok(format!(
                    "populated {}\nfrozen {}\n",
                    u8::from(populated),
                    u8::from(frozen(&s, dir))
                ));
            }
            s.files
                .get(&path)
                .cloned()
                .ok_or_else(|| errno(libc::ENOENT))
        }

        fn write(&self, path: &Path, value: &str) -> io::Result<()> {
            let path = norm(path);
            let mut s = self.state.lock();
            s.ops.push(Op::Write(path.clone(), value.to_string()));
            if let Some(&e) = s.failing.get(&(path.clone(), value.to_string())) {
                return Err(errno(e));
            }
            if !s.files.contains_key(&path) {
                return Err(errno(libc::ENOENT));
            }
            let dir = path.parent().unwrap_or(Path::new("/")).to_path_buf();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            match name {
                "cgroup.subtree_control" => {
                    let offered = s
                        .files
                        .get(&dir.join("cgroup.controllers"))
                        .cloned()
                        .unwrap_or_default();
                    let mut enabled: BTreeSet<String> = s.files[&path]
                        .split_whitespace()
                        .map(String::from)
                        .collect();
                    for token in value.split_whitespace() {
                        let (on, c) = match token.split_at(1) {
                            ("+", c) => (true, c),
                            ("-", c) => (false, c),
                            _ => return Err(errno(libc::EINVAL)),
                        };
                        if on && !offered.split_whitespace().any(|o| o == c) {
                            return Err(errno(libc::ENOENT));
                        }
                        if on {
                            enabled.insert(c.to_string());
                        } else {
                            enabled.remove(c);
                        }
                    }
                    if !s.roots.contains(&dir) && !procs_of(&s, &dir).is_empty() {
                        return Err(errno(libc::EBUSY));
                    }
                    let text = enabled.into_iter().collect::<Vec<_>>().join(" ");
                    s.files.insert(path, text);
                }
                "cgroup.procs" => {
                    let pid: libc::pid_t = value.trim().parse().map_err(|_| errno(libc::EINVAL))?;
                    let busy = s
                        .files
                        .get(&dir.join("cgroup.subtree_control"))
                        .is_some_and(|v| !v.trim().is_empty());
                    if busy && !s.roots.contains(&dir) {
                        return Err(errno(libc::EBUSY));
                    }
                    move_proc(&mut s, &dir, pid);
                }
                "cgroup.kill" => {
                    for d in subtree(&s, &dir) {
                        for pid in procs_of(&s, &d) {
                            kill_pid(&mut s, pid);
                        }
                    }
                }
                _ => {
                    s.files.insert(path, value.to_string());
                }
            }
            Ok(())
        }

        fn create_dir(&self, path: &Path) -> io::Result<()> {
            let path = norm(path);
            self.state.lock().ops.push(Op::Mkdir(path.clone()));
            self.make_group(&path)
        }

        fn remove_dir(&self, path: &Path) -> io::Result<()> {
            let path = norm(path);
            let mut s = self.state.lock();
            s.ops.push(Op::Rmdir(path.clone()));
            if !s.dirs.contains(&path) {
                return Err(errno(libc::ENOENT));
            }
            if subtree(&s, &path).len() > 1 || !procs_of(&s, &path).is_empty() {
                return Err(errno(libc::EBUSY));
            }
            s.dirs.remove(&path);
            s.files.retain(|f, _| f.parent() != Some(path.as_path()));
            Ok(())
        }

        fn list_dirs(&self, path: &Path) -> io::Result<Vec<String>> {
            let path = norm(path);
            let s = self.state.lock();
            if !s.dirs.contains(&path) {
                return Err(errno(libc::ENOENT));
            }
            Ok(s.dirs
                .iter()
                .filter(|d| d.parent() == Some(path.as_path()))
                .filter_map(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect())
        }

        fn exists(&self, path: &Path) -> bool {
            let path = norm(path);
            let s = self.state.lock();
            s.dirs.contains(&path)
                || s.files.contains_key(&path)
                || (path.file_name().is_some_and(|n| n == "cgroup.events")
                    && path.parent().is_some_and(|d| s.dirs.contains(d)))
        }

        fn kill(&self, pid: libc::pid_t) {
            let mut s = self.state.lock();
            s.ops.push(Op::Kill(pid));
            kill_pid(&mut s, pid);
        }
    }
}
