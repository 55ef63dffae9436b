//! Where the CPU went during a run: this process (every thread: the scheduler, the
//! engines' host side, the clients), the processes it reaped (the OCI runtime's
//! `run` and `delete`, and what they reaped in turn: a container's processes are
//! reaped by its init, which the runtime reaps), the container engine's cgroups
//! (every container of this process, counted by the kernel), and the machine.

use std::time::Duration;

use paddock_engines::stats::{cpu_time, Whose};
use serde_json::json;

/// CPU time used so far.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cpu {
    process: Duration,
    children: Duration,
    containers: Option<Duration>,
    /// `/proc/stat`: busy and all clock ticks of every CPU.
    machine_busy: u64,
    machine_all: u64,
}

/// The busy and total ticks of the machine's CPUs.
fn machine() -> (u64, u64) {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return (0, 0);
    };
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return (0, 0);
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let all: u64 = v.iter().take(8).sum();
    // idle and iowait are the 4th and 5th.
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (all - idle, all)
}

/// The CPU time of the container engine's cgroups of this process: the engines'
/// groups (`paddock-ct-<pid>-…`) below this process's own, in the v1 `cpuacct`
/// hierarchy (the kernel charges a group's usage to its ancestors, so groups of
/// destroyed containers still count), or in the v2 hierarchy. `None` when there is
/// none (no container engine, or a layout this does not know).
fn containers() -> Option<Duration> {
    let prefix = format!("paddock-ct-{}-", std::process::id());
    let hierarchies = paddock_engines::cgroup::hierarchies();
    let v1 = hierarchies
        .iter()
        .find(|h| h.controllers.iter().any(|c| c == "cpuacct"));
    let (dir, file) = match v1 {
        Some(h) => (
            h.dir(&paddock_engines::cgroup::own_path("memory")?),
            "cpuacct.usage",
        ),
        None => {
            let mount = paddock_engines::cgroup::v2_mount()?;
            let h = hierarchies.iter().find(|h| h.mount_point == mount)?;
            (h.dir(&paddock_engines::cgroup::own_path("")?), "cpu.stat")
        }
    };
    let mut total = Duration::ZERO;
    let mut found = false;
    // The engines' groups are beside this process's group on v2 hosts, below it on v1.
    for parent in [
        dir.clone(),
        dir.parent().map(|p| p.to_path_buf()).unwrap_or(dir),
    ] {
        let Ok(entries) = std::fs::read_dir(&parent) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_name().to_string_lossy().starts_with(&prefix) {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(e.path().join(file)) else {
                continue;
            };
            found = true;
            total += if file == "cpu.stat" {
                text.lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .and_then(|v| v.trim().parse().ok())
                    .map_or(Duration::ZERO, Duration::from_micros)
            } else {
                text.trim()
                    .parse()
                    .map_or(Duration::ZERO, Duration::from_nanos)
            };
        }
        if found {
            break;
        }
    }
    found.then_some(total)
}

impl Cpu {
    pub(super) fn now() -> Cpu {
        let (machine_busy, machine_all) = machine();
        Cpu {
            process: cpu_time(Whose::Process),
            children: cpu_time(Whose::Children),
            containers: containers(),
            machine_busy,
            machine_all,
        }
    }

    /// The CPU used since `before`, in ms: as cores over `wall`, and per `n`
    /// sandboxes.
    pub(super) fn since(&self, before: &Cpu, wall: Duration, n: usize) -> serde_json::Value {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let process = ms(self.process.saturating_sub(before.process));
        let children = ms(self.children.saturating_sub(before.children));
        // A group made after `before` counts from zero.
        let containers = self
            .containers
            .map(|c| ms(c.saturating_sub(before.containers.unwrap_or_default())));
        let all = self.machine_all.saturating_sub(before.machine_all) as f64;
        let busy = self.machine_busy.saturating_sub(before.machine_busy) as f64;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        // Ticks of all CPUs over the wall time: the machine's busy share, as cores.
        let machine_cores = if all > 0.0 { busy / all * cores } else { 0.0 };
        let wall_ms = ms(wall).max(1e-9);
        let n = n.max(1) as f64;
        let r = super::super::round;
        let r3 = super::super::round3;
        let ours = (process + children + containers.unwrap_or(0.0)) / wall_ms;
        json!({
            "cores": {
                "machine": r3(machine_cores),
                "process": r3(process / wall_ms),
                "children": r3(children / wall_ms),
                "containers": containers.map(|c| r3(c / wall_ms)),
                // The rest of the machine's: other work on the host, kernel
                // threads, and children not reaped yet.
                "unaccounted": r3((machine_cores - ours).max(0.0)),
            },
            "ms_per_sandbox": {
                "machine": r(machine_cores * wall_ms / n),
                "process": r(process / n),
                "children": r(children / n),
                "containers": containers.map(|c| r(c / n)),
            },
        })
    }

    /// CPU of this process, its reaped children and the containers since
    /// `before`, in ms (machine-wide time is left out: it counts other work too).
    pub(super) fn own_ms_since(&self, before: &Cpu) -> [f64; 3] {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        [
            ms(self.process.saturating_sub(before.process)),
            ms(self.children.saturating_sub(before.children)),
            self.containers
                .map(|c| ms(c.saturating_sub(before.containers.unwrap_or_default())))
                .unwrap_or(0.0),
        ]
    }
}
