//! What a cold execution used and how it ended: the sandbox group's counters over
//! the execution, the bundle's CPU quota, and the outcome its ending maps to.

use std::path::{Path, PathBuf};

use paddock_core::{LimitKind, Limits, Outcome};

use super::EngineInner;
use crate::child::Ending;
use crate::host::sys;

pub(super) fn read_u64(path: &Path) -> u64 {
    sys::read_small(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// CPU time used by the group and its descendants, in nanoseconds.
pub(super) fn cpu_usage_ns(dir: &Path) -> u64 {
    read_u64(&dir.join("cpuacct.usage"))
}

/// The bundle's CPU quota (per 100 ms period): `cpu_millicores` when the request
/// or sandbox sets it, else the engine's `container.cpus`.
pub(super) fn cpu_quota_us(engine: &EngineInner, limits: &paddock_core::Limits) -> u64 {
    quota_for(engine.cpu_quota_us, limits.cpu_millicores)
}

/// A CFS quota per 100 ms period for `millicores` (at least the kernel's 1 ms),
/// else `default`.
fn quota_for(default: u64, millicores: Option<u64>) -> u64 {
    millicores.map_or(default, |m| {
        (m.saturating_mul(crate::host::cgroup::CPU_PERIOD_US) / 1000).max(1000)
    })
}

/// A sandbox group's counters over one cold execution. v1: `memory.max_usage_in_bytes`
/// (reset), `cpuacct.usage`, and the host's OOM-kill count (the runtime removes the
/// container's group, and its counter, before it can be read). v2: `memory.peak`
/// (reset through the descriptor that reads it, kernel 6.12 and later; the peak
/// since the group was made on older ones), `cpu.stat`, and the sandbox group's own
/// `memory.events`, which counts the OOM kills of the groups below it.
pub(super) struct SandboxUsage {
    v2: bool,
    memory: Option<PathBuf>,
    cpu: Option<PathBuf>,
    peak: Option<std::fs::File>,
    cpu_before: u64,
    ooms_before: u64,
}

impl SandboxUsage {
    pub(super) fn start(engine: &EngineInner, cgroup: &str) -> SandboxUsage {
        SandboxUsage::start_in(
            engine.v2,
            engine.cgroup_dir("memory", cgroup),
            engine.cgroup_dir("cpuacct", cgroup),
        )
    }

    /// `start` for the sandbox group whose memory (and, v1, cpuacct) directory is
    /// given.
    fn start_in(v2: bool, memory: Option<PathBuf>, cpu: Option<PathBuf>) -> SandboxUsage {
        if !v2 {
            if let Some(dir) = &memory {
                let _ = std::fs::write(dir.join("memory.max_usage_in_bytes"), "0");
            }
            return SandboxUsage {
                v2: false,
                cpu_before: cpu.as_deref().map_or(0, cpu_usage_ns),
                memory,
                cpu,
                peak: None,
                ooms_before: global_oom_kills(),
            };
        }
        let peak = memory.as_ref().and_then(|d| {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(d.join("memory.peak"))
                .or_else(|_| std::fs::File::open(d.join("memory.peak")))
                .ok()?;
            let _ = f.write_at(b"0", 0);
            Some(f)
        });
        let mut usage = SandboxUsage {
            v2: true,
            cpu: memory.clone(),
            memory,
            peak,
            cpu_before: 0,
            ooms_before: 0,
        };
        usage.cpu_before = usage.cpu_ns();
        usage.ooms_before = usage.ooms();
        usage
    }

    fn cpu_ns(&self) -> u64 {
        match (&self.cpu, self.v2) {
            (Some(d), true) => sys::read_small(d.join("cpu.stat"))
                .map_or(0, |t| crate::host::cgroup::v2_cpu_usage_ns(&t)),
            (Some(d), false) => cpu_usage_ns(d),
            (None, _) => 0,
        }
    }

    fn ooms(&self) -> u64 {
        match (&self.memory, self.v2) {
            (Some(d), true) => sys::read_small(d.join("memory.events"))
                .map_or(0, |t| crate::host::cgroup::oom_kill_count(&t)),
            _ => global_oom_kills(),
        }
    }

    /// Peak memory (bytes), whether the OOM killer ended something in the sandbox
    /// (v1: some process on the host, while the peak reached `memory_limit`), and
    /// the CPU time (ms) since `start`.
    pub(super) fn finish(&self, memory_limit: Option<u64>) -> (u64, bool, u64) {
        let peak = match (&self.peak, &self.memory, self.v2) {
            (Some(f), _, true) => {
                use std::os::unix::fs::FileExt;
                let mut buf = [0u8; 64];
                let n = f.read_at(&mut buf, 0).unwrap_or(0);
                String::from_utf8_lossy(&buf[..n])
                    .trim()
                    .parse()
                    .unwrap_or(0)
            }
            (_, Some(d), false) => read_u64(&d.join("memory.max_usage_in_bytes")),
            _ => 0,
        };
        let new_ooms = self.ooms() > self.ooms_before;
        let oom = if self.v2 {
            new_ooms
        } else {
            memory_limit.is_some_and(|limit| new_ooms && peak + (1 << 20) >= limit)
        };
        let cpu_ms = self.cpu_ns().saturating_sub(self.cpu_before) / 1_000_000;
        (peak, oom, cpu_ms)
    }
}

/// OOM kills on the whole host so far (`/proc/vmstat`).
pub(super) fn global_oom_kills() -> u64 {
    sys::read_small("/proc/vmstat").map_or(0, |s| crate::host::cgroup::oom_kill_count(&s))
}

/// Maps how the container ended to an outcome. The runtime exits with its init's
/// code, or 128 + the signal that killed it.
pub(super) fn classify(
    ending: Ending,
    code: Option<i32>,
    oom: bool,
    limits: &Limits,
    cpu_ms: u64,
) -> Outcome {
    match ending {
        Ending::Cancelled | Ending::Destroyed => return Outcome::Cancelled,
        Ending::Deadline => return Outcome::TimedOut,
        Ending::Exited => {}
    }
    if oom {
        return Outcome::LimitExceeded {
            limit: LimitKind::Memory,
        };
    }
    let code = code.unwrap_or(-1);
    let signal = (129..=128 + 64).contains(&code).then_some(code - 128);
    match signal {
        Some(libc::SIGXCPU) => Outcome::LimitExceeded {
            limit: LimitKind::Cpu,
        },
        Some(libc::SIGKILL)
            if limits.cpu_ms.is_some_and(|ms| {
                let limit = ms.div_ceil(1000) * 1000;
                cpu_ms + (limit / 20).max(50) >= limit
            }) =>
        {
            Outcome::LimitExceeded {
                limit: LimitKind::Cpu,
            }
        }
        Some(libc::SIGXFSZ) => Outcome::LimitExceeded {
            limit: LimitKind::FileSize,
        },
        signal => Outcome::Completed {
            exit_code: code,
            signal,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_and_signals_map_to_outcomes() {
        let l = Limits::default();
        assert_eq!(
            classify(Ending::Exited, Some(3), false, &l, 0),
            Outcome::Completed {
                exit_code: 3,
                signal: None
            }
        );
        assert_eq!(
            classify(Ending::Exited, Some(137), false, &l, 0),
            Outcome::Completed {
                exit_code: 137,
                signal: Some(9)
            }
        );
        assert_eq!(
            classify(Ending::Exited, Some(137), true, &l, 0),
            Outcome::LimitExceeded {
                limit: LimitKind::Memory
            }
        );
        assert_eq!(
            classify(Ending::Exited, Some(128 + libc::SIGXFSZ), false, &l, 0),
            Outcome::LimitExceeded {
                limit: LimitKind::FileSize
            }
        );
        let cpu = Limits {
            cpu_ms: Some(1000),
            ..Limits::default()
        };
        assert_eq!(
            classify(Ending::Exited, Some(137), false, &cpu, 990),
            Outcome::LimitExceeded {
                limit: LimitKind::Cpu
            }
        );
        assert_eq!(
            classify(Ending::Deadline, Some(137), true, &l, 0),
            Outcome::TimedOut
        );
        assert_eq!(
            classify(Ending::Destroyed, None, false, &l, 0),
            Outcome::Cancelled
        );
    }
}

#[cfg(test)]
mod quota_tests {
    use super::{quota_for, SandboxUsage};

    #[test]
    fn v2_accounting_reads_memory_peak_through_its_reset_descriptor_cpu_stat_and_memory_events() {
        let dir = tempfile::tempdir().unwrap();
        let put = |f: &str, v: &str| std::fs::write(dir.path().join(f), v).unwrap();
        put("memory.peak", "5000");
        put(
            "cpu.stat",
            "usage_usec 1000\nuser_usec 600\nsystem_usec 400\n",
        );
        put(
            "memory.events",
            "low 0\nhigh 0\nmax 0\noom 0\noom_kill 2\noom_group_kill 0\n",
        );
        let usage = SandboxUsage::start_in(true, Some(dir.path().into()), None);
        // The peak was reset (the kernel resets it for the writing descriptor).
        assert_eq!(usage.finish(Some(1 << 20)), (0, false, 0));
        // The execution: the group's peak, 3 s of CPU, an OOM kill below it.
        std::fs::write(dir.path().join("memory.peak"), "7777").unwrap();
        put(
            "cpu.stat",
            "usage_usec 3001000\nuser_usec 2000000\nsystem_usec 1001000\n",
        );
        put(
            "memory.events",
            "low 0\nhigh 0\nmax 4\noom 1\noom_kill 3\noom_group_kill 0\n",
        );
        // v2 counts the sandbox's own OOM kills, whatever the peak.
        assert_eq!(usage.finish(Some(1 << 30)), (7777, true, 3000));
    }

    #[test]
    fn cpu_millicores_becomes_the_share_of_the_period_and_unset_keeps_the_default() {
        assert_eq!(quota_for(100_000, None), 100_000);
        assert_eq!(quota_for(100_000, Some(200)), 20_000);
        assert_eq!(quota_for(100_000, Some(2500)), 250_000);
        assert_eq!(quota_for(100_000, Some(1)), 1000);
    }
}
