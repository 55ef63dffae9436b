//! Reading the kernel's counters (OOM kills, forks the pids limit refused), and
//! the error and warning a sandbox's limits give.

use std::io;

/// The error of a failed [`Cgroup::set_limits`] (`context` says which). The kernel
/// refuses a memory limit below what the group already holds (the sandbox's live
/// processes, memory it cannot reclaim) with `EBUSY`: that limit is the request's to
/// fix, `INVALID_OPTIONS` naming `limits.memory_bytes`, not an engine failure.
///
/// [`Cgroup::set_limits`]: super::Cgroup::set_limits
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oom_and_pids_counters_read_both_versions_files() {
        let v2_events = "low 0\nhigh 2\nmax 7\noom 4\noom_kill 3\noom_group_kill 1\n";
        assert_eq!(oom_kill_count(v2_events), 3);
        let v1_control = "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n";
        assert_eq!(oom_kill_count(v1_control), 5);
        assert_eq!(pids_max_count("max 9\n"), 9);
        assert_eq!(oom_kill_count(""), 0);
    }
}
