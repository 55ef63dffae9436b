//! cgroup v2's `cgroup.kill` and `cgroup.freeze` on the host's cgroup2 mount (the
//! unified hierarchy of a hybrid host, or the one hierarchy of a pure v2 host), for
//! real: processes that fork, call `setsid` and fork in a loop are frozen, make no
//! progress, are thawed and killed, and the group is removed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use paddock_engines::cgroup::{self, CgroupRoot, Layout};

static NEXT: AtomicU64 = AtomicU64::new(0);

/// The cgroup2 mount, or why these tests cannot run here.
fn v2_mount() -> Result<PathBuf, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    cgroup::v2_mount().ok_or_else(|| "no cgroup2 hierarchy is mounted".into())
}

/// A group name of this process and pid namespace (`paddock-<pid>-t<n>-ns<inode>`),
/// the form the engines' stale sweep judges by its owner: runs in other pid
/// namespaces never collide with it, and a run that dies leaves it to the next
/// engine's sweep in its namespace.
fn group_name() -> String {
    let ns = std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .and_then(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("pid:[")?
                .strip_suffix(']')?
                .parse::<u64>()
                .ok()
        })
        .unwrap_or(0);
    format!(
        "paddock-{}-t{}-ns{ns}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn events(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("cgroup.events")).unwrap()
}

fn event(dir: &Path, key: &str) -> Option<u64> {
    events(dir).lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

fn procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Whether `pid` is gone: no such process, or a zombie (dead, not yet reaped).
fn dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

fn wait_until(within: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    ok()
}

/// The counter a busy process writes, or 0 before it has written one.
fn count(file: &Path) -> u64 {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Starts, in the group whose `cgroup.procs` is `procs_file`, a shell that forks a
/// `setsid` counter (a new session that writes an increasing count to `counter`),
/// a fork loop, and a sleeper, then waits. It joins the group first, so everything
/// it starts is inside.
fn start_tree(procs_file: &Path, counter: &Path) -> Child {
    let script = format!(
        r#"echo $$ > '{procs}' || exit 9
setsid sh -c 'n=0; while :; do n=$((n+1)); echo $n > "{counter}"; done' &
(while :; do /bin/true; done) &
sleep 1000 &
wait"#,
        procs = procs_file.display(),
        counter = counter.display(),
    );
    Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .spawn()
        .unwrap()
}

/// The session id of `pid` (field 6 of its stat).
fn session(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.split(' ').nth(3)?.parse().ok()
}

#[test]
fn cgroup_freeze_stops_a_tree_and_cgroup_kill_ends_it_setsid_and_fork_loop_included() {
    let mount = match v2_mount() {
        Ok(m) => m,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let dir = mount.join(group_name());
    std::fs::create_dir(&dir).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let counter = tmp.path().join("count");
    let mut child = start_tree(&dir.join("cgroup.procs"), &counter);
    let shell = child.id() as i32;

    // The tree runs in the group: the shell, the setsid counter, the loop, the sleeper.
    assert!(
        wait_until(Duration::from_secs(10), || count(&counter) > 0
            && procs(&dir).len() >= 4),
        "the tree did not start in the group: {:?}",
        procs(&dir)
    );
    assert_eq!(event(&dir, "populated"), Some(1));
    let members = procs(&dir);
    assert!(members.contains(&shell));
    let escaped: Vec<i32> = members
        .iter()
        .copied()
        .filter(|&p| session(p).is_some_and(|s| s != session(shell).unwrap_or(0)))
        .collect();
    assert!(
        !escaped.is_empty(),
        "the counter should lead a session of its own"
    );

    // Frozen: the kernel reports it, and the counter stops.
    cgroup::set_frozen_v2(&dir, true).unwrap();
    assert_eq!(event(&dir, "frozen"), Some(1), "{}", events(&dir));
    let at_freeze = count(&counter);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(count(&counter), at_freeze, "a frozen process made progress");
    // The fork loop made no new process either.
    let frozen_members = procs(&dir);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(procs(&dir), frozen_members);

    // Thawed: it runs again.
    cgroup::set_frozen_v2(&dir, false).unwrap();
    assert!(wait_until(Duration::from_secs(5), || count(&counter) > at_freeze));
    assert_eq!(event(&dir, "frozen"), Some(0));

    // Killed, frozen first as a pause would leave it: a frozen task dies of it too.
    cgroup::set_frozen_v2(&dir, true).unwrap();
    let before_kill = procs(&dir);
    cgroup::kill_v2(&dir).unwrap();
    assert_eq!(event(&dir, "populated"), Some(0), "{}", events(&dir));
    assert!(procs(&dir).is_empty());
    for pid in before_kill {
        assert!(
            wait_until(Duration::from_secs(2), || dead(pid)),
            "process {pid} survived cgroup.kill"
        );
    }
    let status = child.wait().unwrap();
    assert!(!status.success());
    // Nothing writes the counter any more.
    let last = count(&counter);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(count(&counter), last);
    // An empty group: kill is a no-op, and the group can be removed.
    cgroup::kill_v2(&dir).unwrap();
    std::fs::remove_dir(&dir).unwrap();
    assert!(!dir.exists());
}

#[test]
fn a_sandbox_group_is_killed_through_cgroup_kill_where_the_v2_mount_offers_it() {
    if let Err(why) = v2_mount() {
        eprintln!("skipped: {why}");
        return;
    }
    let root = match CgroupRoot::create() {
        Ok(r) => r,
        Err(why) => {
            eprintln!("skipped: no cgroups for the engines here: {why}");
            return;
        }
    };
    let report = root.report();
    assert!(matches!(root.layout(), Layout::Hybrid | Layout::V2));
    assert_eq!(report.kill, "v2 cgroup.kill", "{report:?}");
    let g = root.create_group("sb").unwrap();
    let v2_dir = g
        .v2_dir()
        .expect("a group in the v2 hierarchy")
        .to_path_buf();
    assert!(v2_dir.starts_with(cgroup::v2_mount().unwrap()));
    let leaf = v2_dir.join("leaf");
    // Processes join every hierarchy of the group; the test moves a shell that
    // waits for a line, then starts its tree inside.
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg("read x; setsid sleep 1000 & (while :; do /bin/true; done) & sleep 1000 & wait")
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let shell = child.id() as i32;
    g.add_process(shell).unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(wait_until(Duration::from_secs(10), || procs(&leaf).len() >= 4));
    assert!(g.is_populated());
    let members = procs(&leaf);

    // A group below the sandbox's (a background process's) is not touched by the
    // sandbox's kill.
    let p = root.create_group("sb/p1").unwrap();
    let mut other = Command::new("/bin/sleep").arg("1000").spawn().unwrap();
    p.add_process(other.id() as i32).unwrap();

    g.kill_all().unwrap();
    assert!(!g.is_populated());
    assert_eq!(event(&leaf, "populated"), Some(0));
    for pid in members {
        assert!(
            wait_until(Duration::from_secs(2), || dead(pid)),
            "process {pid} survived the kill"
        );
    }
    assert!(!child.wait().unwrap().success());
    assert!(p.is_populated(), "the process group below was killed too");
    assert!(!dead(other.id() as i32));

    // Removing a group kills what runs in it and removes it.
    p.remove().unwrap();
    assert!(!other.wait().unwrap().success());
    g.remove().unwrap();
    assert!(!v2_dir.exists());
    drop(root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subprocess_execution_runs_in_its_sandboxs_v2_leaf_and_its_setsid_child_dies() {
    use paddock_core::{CancelToken, DiscardSink, Engine, ExecRequest, Program, SandboxSpec};
    use paddock_engines::subprocess::SubprocessEngine;
    use paddock_engines::SubprocessConfig;
    if let Err(why) = v2_mount() {
        eprintln!("skipped: {why}");
        return;
    }
    let engine = SubprocessEngine::new(&SubprocessConfig::default()).unwrap();
    let Some(report) = engine.host_support().cgroups.clone() else {
        eprintln!("skipped: {:?}", engine.host_support().cgroup);
        return;
    };
    if report.kill != "v2 cgroup.kill" {
        eprintln!("skipped: the kill is {}", report.kill);
        return;
    }
    let sb = engine.create(&SandboxSpec::default()).await.unwrap();
    // The program's v2 group, and a setsid child that writes its pid and lingers.
    let r = sb
        .exec(
            ExecRequest::new(Program::command([
                "sh",
                "-c",
                "grep '^0::' /proc/self/cgroup; setsid sh -c 'echo $$ > escapee; exec sleep 1000' & sleep 0.2",
            ])),
            &DiscardSink,
            CancelToken::new(),
        )
        .await
        .unwrap();
    let line = r.stdout.trim();
    assert!(line.starts_with("0::/"), "{r:?}");
    assert!(line.ends_with(&format!("/{}/leaf", sb.id())), "{line}");
    // Its v2 group lies under the engine's, in the v2 mount.
    let engine_group = report.groups.last().unwrap();
    assert!(engine_group.starts_with(cgroup::v2_mount().unwrap()));
    let escapee: i32 = std::fs::read_to_string(sb.host_dir().join("escapee"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(2), || dead(escapee)),
        "the setsid child outlived its execution"
    );
    let leaf = engine_group.join(sb.id()).join("leaf");
    assert_eq!(event(&leaf, "populated"), Some(0));
    sb.destroy().await.unwrap();
    assert!(!leaf.exists() && !engine_group.join(sb.id()).exists());
}
