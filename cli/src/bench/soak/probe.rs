//! What the soak measures about this process and its pools: memory, descriptors,
//! descendant processes, the engines' directories, pool sizes.

use super::*;

/// What the soak compares between the baseline and the end: the same figures, each
/// taken once the load has stopped and the pools are at rest.
#[derive(Debug)]
pub(super) struct Snapshot {
    pub(super) stats: Stats,
    pub(super) fds: usize,
    pub(super) rss: u64,
    pub(super) heap: Option<(u64, u64)>,
    pub(super) threads: u64,
    pub(super) procs: Vec<(String, char)>,
    pub(super) dir_entries: usize,
}

impl Snapshot {
    /// Waits until the pools are at rest (see [`settle`]), then takes the figures.
    pub(super) async fn at_rest(
        paddock: &Paddock,
        min_idle: usize,
        limit: Duration,
    ) -> Result<Snapshot, Error> {
        let stats = settle(paddock, min_idle, limit).await?;
        let fds = steady_fds().await;
        Ok(Snapshot {
            stats,
            fds,
            rss: rss_bytes(),
            heap: heap(),
            threads: status_field("Threads:"),
            procs: descendants(),
            dir_entries: engine_dirs().1,
        })
    }
}

/// The allocator's live heap (bytes handed out and not given back) and the free
/// bytes it keeps in its arenas, from glibc's `mallinfo2`. RSS holds both; a leak
/// grows the first.
pub(super) fn heap() -> Option<(u64, u64)> {
    paddock_engines::stats::heap().map(|h| (h.in_use, h.free))
}

/// Open descriptors of this process (the listing's own not counted).
pub(super) fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count().saturating_sub(1))
}

/// What each open descriptor of this process refers to, by number.
pub(super) fn fd_targets() -> std::collections::BTreeMap<u32, String> {
    std::fs::read_dir("/proc/self/fd").map_or_else(
        |_| Default::default(),
        |d| {
            d.flatten()
                .filter_map(|e| {
                    let fd = e.file_name().to_str()?.parse().ok()?;
                    let target = std::fs::read_link(e.path()).ok()?;
                    Some((fd, target.to_string_lossy().into_owned()))
                })
                .collect()
        },
    )
}

/// The processes below this one (children, their children, …): command name and
/// state letter of each.
pub(super) fn descendants() -> Vec<(String, char)> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    let mut procs: HashMap<u32, (String, char)> = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = stat[open + 1..close].to_string();
        let mut rest = stat[close + 1..].split_whitespace();
        let state = rest.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let Some(ppid) = rest.next().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        children.entry(ppid).or_default().push(pid);
        procs.insert(pid, (comm, state));
    }
    let mut found = Vec::new();
    let mut queue = VecDeque::from([std::process::id()]);
    while let Some(pid) = queue.pop_front() {
        for &child in children.get(&pid).map_or(&[][..], Vec::as_slice) {
            if let Some(p) = procs.get(&child) {
                found.push(p.clone());
            }
            queue.push_back(child);
        }
    }
    found
}

/// Descendants as JSON: how many, zombies, and how many of each command.
pub(super) fn describe(procs: &[(String, char)]) -> serde_json::Value {
    let mut by_command: BTreeMap<&str, usize> = BTreeMap::new();
    for (comm, _) in procs {
        *by_command.entry(comm).or_default() += 1;
    }
    json!({
        "count": procs.len(),
        "zombies": procs.iter().filter(|(_, s)| *s == 'Z').count(),
        "by_command": by_command,
    })
}

/// Open descriptors once the count has not moved for half a second (instances that
/// were reaped are destroyed in the background), within five seconds.
pub(super) async fn steady_fds() -> usize {
    let mut last = open_fds();
    let mut same = 0;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = open_fds();
        if now == last {
            same += 1;
            if same >= 5 {
                break;
            }
        } else {
            same = 0;
            last = now;
        }
    }
    last
}

/// The engines' directories of this process in the temp dir, and the entries one
/// and two levels below them (sandbox workdirs, bundles, runtime state; a container
/// root filesystem is not walked).
pub(super) fn engine_dirs() -> (usize, usize) {
    let found = engine_dir_listing();
    (
        found.len(),
        found.iter().map(|(_, inside)| inside.len()).sum(),
    )
}

/// The engines' directories of this process in the temp dir, each with the entries
/// one and two levels below it (as `a` and `a/b`), sorted.
pub(super) fn engine_dir_listing() -> Vec<(String, Vec<String>)> {
    let marker = format!("-{}-", std::process::id());
    let list = |dir: &std::path::Path| {
        std::fs::read_dir(dir).map_or_else(|_| Vec::new(), |d| d.flatten().collect::<Vec<_>>())
    };
    let is_dir = |e: &std::fs::DirEntry| e.file_type().is_ok_and(|t| t.is_dir());
    let mut found = Vec::new();
    for root in list(&std::env::temp_dir()) {
        let name = root.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("paddock-") && name.contains(&marker) && is_dir(&root)) {
            continue;
        }
        let mut inside = Vec::new();
        for e in list(&root.path()) {
            let first = e.file_name().to_string_lossy().into_owned();
            if is_dir(&e) && e.file_name() != "rootfs" {
                for f in list(&e.path()) {
                    inside.push(format!("{first}/{}", f.file_name().to_string_lossy()));
                }
            }
            inside.push(first);
        }
        inside.sort();
        found.push((name, inside));
    }
    found.sort();
    found
}

/// Whether a pool is quiet and back at its configured idle size.
pub(super) fn at_rest(p: &PoolStats, min_idle: usize) -> bool {
    p.busy == 0
        && p.waiting == 0
        && p.creating == 0
        && !p.degraded
        && p.idle == p.size
        && p.size == min_idle.min(p.max_size)
}

/// Waits until nothing runs, every pool is at rest and finished output no longer
/// lingers (or `limit` passes).
pub(super) async fn settle(
    paddock: &Paddock,
    min_idle: usize,
    limit: Duration,
) -> Result<Stats, Error> {
    let deadline = Instant::now() + limit;
    // The streamer sweeps lingering output every quarter of the linger period.
    tokio::time::sleep(STREAM_LINGER + STREAM_LINGER / 2).await;
    loop {
        let stats = paddock.stats().await?;
        let quiet = stats.in_flight == 0
            && stats.sandboxes == 0
            && stats.pools.iter().all(|p| at_rest(p, min_idle));
        if quiet || Instant::now() > deadline {
            return Ok(stats);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each pool's counts, with the configured `min_idle` beside them.
pub(super) fn pools_json(stats: &Stats, min_idle: usize) -> serde_json::Value {
    let mut pools: Vec<&PoolStats> = stats.pools.iter().collect();
    pools.sort_by_key(|p| (p.engine.clone(), p.network.clone()));
    pools
        .iter()
        .map(|p| {
            json!({
                "engine": p.engine.as_str(),
                "network": p.network,
                "size": p.size,
                "idle": p.idle,
                "busy": p.busy,
                "creating": p.creating,
                "waiting": p.waiting,
                "degraded": p.degraded,
                "degraded_cause": p.degraded_cause,
                "min_idle": min_idle,
                "max_size": p.max_size,
                "created_total": p.created_total,
                "retired_total": p.retired_total,
                "create_failures_total": p.create_failures_total,
            })
        })
        .collect()
}

/// The fields of several JSON objects in one, in order.
pub(super) fn merge<const N: usize>(parts: [serde_json::Value; N]) -> serde_json::Value {
    let mut all = serde_json::Map::new();
    for part in parts {
        if let serde_json::Value::Object(fields) = part {
            all.extend(fields);
        }
    }
    serde_json::Value::Object(all)
}

/// Median of a series (0 when empty).
pub(super) fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// The change from `from` to `to`, in percent of `from`.
pub(super) fn pct(from: u64, to: u64) -> f64 {
    if from == 0 {
        return 0.0;
    }
    (to as f64 - from as f64) * 100.0 / from as f64
}
