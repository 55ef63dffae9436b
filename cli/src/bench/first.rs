//! `paddock bench first`: time to a sandbox's first result, and what a one-shot
//! `paddock run` costs as a whole process, each against its baseline in the same run.
//!
//! - `first_open`: through the facade with the configuration's defaults (what
//!   `paddock serve` does), `N` sandboxes of `N` tenants opened at once (one at a
//!   time, then 8 and 64 by default), then each one's first Python `print(1)`, then
//!   each one's first JavaScript `console.log(1)`, all `N` at once. Reported: open,
//!   first Python, open + first Python, and first JavaScript, p50/p99/max in ms
//!   (and open + first Python over the rounds after the first, which meet a pool
//!   that has seen such a burst). The first round comes once the pool holds its
//!   `min_idle` ready (`--min-idle` sets it), as after a quiet time; what that
//!   costs is reported too (the growth of the host's PSS from before the
//!   Paddock's start); per
//!   engine (subprocess, and the container engine where it starts). The subprocess
//!   engine runs again without its Python fork server (`warm.fork_server = false`),
//!   for bursts up to 8, as the baseline.
//! - `first_cli`: `paddock run -- /bin/true` and `paddock run --lang python --code
//!   'print(1)'` as whole processes (this binary), against `/bin/true`, `python3 -c
//!   'print(1)'` and the container runtime's own `run` of `/bin/true`, interleaved.
//! - `first_repeat`: a repeated Python `print(1)` in one warm container, against the
//!   runtime's own `exec` of `python3 -c 'print(1)'` into that container and against
//!   the subprocess engine's warm mode, interleaved; p50/p99/max in ms.
//! - `first_density` (with `--density N`): `N` sandboxes of `N` tenants opened and
//!   kept open (8 opens at a time), per engine: open p50/p99, the host memory each
//!   costs right after the opens and once idle (`subprocess.warm.unused_ms` later):
//!   `MemAvailable` before and after, each read once it holds still, and the
//!   growth of the host's processes' proportional set size), and a Python
//!   `print(1)` in every one of them, which must all answer.

use std::time::{Duration, Instant};

use paddock::PaddockConfig;
use paddock_core::{EngineName, ExecRequest, Language, Program, SandboxSpec};
use paddock_pool::Paddock;
use serde_json::json;

use crate::run::UsageError;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// p50, p99 and max of `v` in ms, rounded.
fn spread(mut v: Vec<Duration>) -> serde_json::Value {
    if v.is_empty() {
        return serde_json::Value::Null;
    }
    v.sort();
    let at = |q: f64| ms(v[((v.len() as f64 - 1.0) * q).round() as usize]);
    json!({
        "p50_ms": super::round3(at(0.5)),
        "p99_ms": super::round3(at(0.99)),
        "max_ms": super::round3(ms(*v.last().unwrap())),
        "n": v.len(),
    })
}

fn code(language: Language, source: &str) -> ExecRequest {
    ExecRequest::new(Program::code(language, source))
}

/// Opens one sandbox per tenant of `tenants`, all at once: each one's result and
/// how long it took.
async fn open_all(
    paddock: &Paddock,
    engine: &EngineName,
    tenants: Vec<String>,
) -> Vec<(
    Result<paddock_pool::SandboxHandle, paddock_core::Error>,
    Duration,
)> {
    let opens = tenants.into_iter().map(|tenant| {
        let spec = SandboxSpec {
            tenant: Some(tenant),
            ..SandboxSpec::default()
        };
        async move {
            let t = Instant::now();
            let sandbox = paddock.open_sandbox(spec, Some(engine.clone())).await;
            (sandbox, t.elapsed())
        }
    });
    futures_util::future::join_all(opens).await
}

/// One round: `n` sandboxes of `n` tenants opened at once, then each one's first
/// Python, then each one's first JavaScript, at once. Pushes each sandbox's times.
async fn round(
    paddock: &Paddock,
    engine: &EngineName,
    n: usize,
    round: usize,
    into: &mut [Vec<Duration>; 4],
) -> Result<(), String> {
    let tenants: Vec<String> = (0..n).map(|i| format!("first-{round}-{i}")).collect();
    let opened = open_all(paddock, engine, tenants).await;
    let mut sandboxes = Vec::with_capacity(n);
    let mut failure = None;
    for (sandbox, took) in opened {
        match sandbox {
            Ok(s) => {
                into[0].push(took);
                sandboxes.push((s, took));
            }
            Err(e) => failure = Some(format!("opening a sandbox failed: {e}")),
        }
    }
    let first = |language: Language, source: &'static str, want: &'static str| {
        let sandboxes = &sandboxes;
        async move {
            let runs = sandboxes.iter().map(|(s, _)| async move {
                let t = Instant::now();
                let r = s.exec(code(language, source)).await;
                (r, t.elapsed())
            });
            futures_util::future::join_all(runs)
                .await
                .into_iter()
                .map(move |(r, took)| match r {
                    Ok(r) if r.exit_code() == Some(0) && r.stdout == want => Ok(took),
                    Ok(r) => Err(format!("{language} gave {:?} / {:?}", r.outcome, r.stdout)),
                    Err(e) => Err(format!("{language} failed: {e}")),
                })
        }
    };
    if failure.is_none() {
        let python: Vec<_> = first(Language::Python, "print(1)", "1\n").await.collect();
        for ((_, open), took) in sandboxes.iter().zip(python) {
            match took {
                Ok(t) => {
                    into[1].push(t);
                    into[2].push(*open + t);
                }
                Err(e) => failure = Some(e),
            }
        }
    }
    if failure.is_none() {
        for took in first(Language::Javascript, "console.log(1)", "1\n").await {
            match took {
                Ok(t) => into[3].push(t),
                Err(e) => failure = Some(e),
            }
        }
    }
    for (s, _) in sandboxes {
        let _ = s.destroy().await;
    }
    failure.map_or(Ok(()), Err)
}

/// Waits (at most 60 s) until every engine's default pool holds `target` ready
/// instances (at most its size) and creates none: the idle count of `engine`'s,
/// how long that took, and whether they all got there.
async fn pool_ready(
    paddock: &Paddock,
    engine: &EngineName,
    target: usize,
) -> (usize, Duration, bool) {
    let t = Instant::now();
    let mut idle = 0;
    while t.elapsed() < Duration::from_secs(60) {
        if let Ok(stats) = paddock.stats().await {
            let defaults: Vec<_> = stats
                .pools
                .iter()
                .filter(|p| p.network == "none" && p.disk_bytes.is_none())
                .collect();
            if let Some(p) = defaults.iter().find(|p| &p.engine == engine) {
                idle = p.idle;
                let ready = defaults
                    .iter()
                    .all(|p| p.idle >= target.min(p.max_size) && p.creating == 0);
                if ready {
                    return (idle, t.elapsed(), true);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (idle, t.elapsed(), false)
}

async fn first_open(
    engine: EngineName,
    bursts: &[usize],
    samples: usize,
    fork_server: bool,
    min_idle: Option<usize>,
    as_json: bool,
) -> Result<bool, UsageError> {
    let most = bursts.iter().copied().max().unwrap_or(1);
    let mut config = PaddockConfig::default();
    config.subprocess.warm.fork_server = fork_server;
    if let Some(n) = min_idle {
        config.pool.min_idle = n;
    }
    // Room for the largest burst (the limiter's per-tenant caps are per tenant, and
    // every sandbox here is a tenant's own).
    config.pool.max_size = config.pool.max_size.max(most + 1);
    let ready_target = config.pool.min_idle.min(config.pool.max_size);
    let pss_before = pss_by_pid();
    let mut builder = paddock::builder().config(config);
    if engine != EngineName::CONTAINER {
        builder = builder.without_container();
    }
    let paddock = builder
        .start()
        .map_err(|e| UsageError(format!("paddock did not start: {e}")))?;
    if !paddock.engines().contains(&engine) {
        report(
            &json!({"scenario": "first_open", "engine": engine.as_str(), "skipped": "the engine does not run here"}),
            as_json,
        );
        let _ = paddock.shutdown(Duration::from_secs(5)).await;
        return Ok(true);
    }
    // The first burst meets the pools as a server that has been up a while and
    // quiet finds them: ready (`pool.min_idle`). What that costs: the growth of the
    // host's processes' PSS (the whole Paddock, every engine it started, from
    // before its start), 2 s after the pools are ready (once the runners their
    // bursts of creations left for later have started). `MemAvailable` moves by more than
    // that between runs here, so it is not used.
    let (ready, waited, mut all_ready) = pool_ready(&paddock, &engine, ready_target).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ready_line = json!({
        "idle": ready,
        "waited_ms": super::round(ms(waited)),
        "pss_mib": super::round(pss_growth(&pss_before) as f64 / (1 << 20) as f64),
    });
    let mut ok = true;
    for &n in bursts {
        // Samples per series: at least `samples`, and at least one round.
        let rounds = samples.div_ceil(n).max(1);
        let mut series: [Vec<Duration>; 4] = Default::default();
        let mut error = None;
        for r in 0..rounds {
            if r == 0 {
                // Each series' first burst meets the pool ready, as after a quiet
                // time: a quiet second, 250 ms into which the runners that the
                // pool's bursts of creations left for later start.
                all_ready &= pool_ready(&paddock, &engine, ready_target).await.2;
                tokio::time::sleep(Duration::from_secs(1)).await;
            } else {
                // The pool refills between rounds, as it would between bursts.
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            if let Err(e) = round(&paddock, &engine, n, r, &mut series).await {
                error = Some(e);
                break;
            }
        }
        let [open, python, open_python, js] = series;
        // The first round meets the pool as a burst of this size finds it the first
        // time (`min_idle` ready, for the first series); later rounds, as it finds it
        // once it has seen one (it keeps as many ready, up to `pool.burst_idle_max`).
        let later = spread(open_python[n.min(open_python.len())..].to_vec());
        let mut line = json!({
            "scenario": "first_open",
            "engine": engine.as_str(),
            "at_once": n,
            "fork_server": fork_server && engine == EngineName::SUBPROCESS,
            "min_idle": ready_target,
            "ready_before_first_burst": ready_line,
            "open": spread(open),
            "first_python": spread(python),
            "rounds": rounds,
            "open_and_first_python": spread(open_python),
            "open_and_first_python_later_rounds": later,
            "first_javascript": spread(js),
        });
        if !all_ready && error.is_none() {
            error = Some(format!(
                "the pools did not hold {ready_target} ready within 60 s before a first burst"
            ));
        }
        if let Some(e) = error {
            ok = false;
            line["error"] = json!(e);
        }
        report(&line, as_json);
    }
    let _ = paddock.shutdown(Duration::from_secs(10)).await;
    Ok(ok)
}

/// Runs `argv` to its end, output discarded; its wall time, or why it failed.
fn whole(argv: &[&str]) -> Result<Duration, String> {
    let t = Instant::now();
    let status = std::process::Command::new(argv[0])
        .args(&argv[1..])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("{}: {e}", argv[0]))?;
    let took = t.elapsed();
    if !status.success() {
        return Err(format!("{argv:?} exited with {status}"));
    }
    Ok(took)
}

fn first_cli(samples: usize, as_json: bool) -> Result<bool, UsageError> {
    let me = std::env::current_exe()
        .map_err(|e| UsageError(format!("cannot find this program: {e}")))?;
    let me = me.to_string_lossy().into_owned();
    let runs: [(&str, Vec<&str>); 4] = [
        ("paddock_run_true", vec![&me, "run", "--", "/bin/true"]),
        ("true", vec!["/bin/true"]),
        (
            "paddock_run_python",
            vec![&me, "run", "--lang", "python", "--code", "print(1)"],
        ),
        ("python3", vec!["python3", "-c", "print(1)"]),
    ];
    // The runtime's own `run` of `/bin/true`, where the container engine starts.
    let runtime =
        paddock_engines::container::ContainerEngine::new(&paddock_engines::ContainerConfig {
            warm: false,
            ..paddock_engines::ContainerConfig::default()
        })
        .ok();
    let mut series: Vec<Vec<Duration>> = vec![Vec::new(); runs.len() + 1];
    for i in 0..samples + 2 {
        for (k, (name, argv)) in runs.iter().enumerate() {
            let took = whole(argv).map_err(|e| UsageError(format!("{name}: {e}")))?;
            // The first two rounds warm the page cache.
            if i >= 2 {
                series[k].push(took);
            }
        }
        if let Some(engine) = &runtime {
            if let Ok((Some(0), took)) = engine.run_raw(&["/bin/true".to_string()]) {
                if i >= 2 {
                    series[runs.len()].push(took);
                }
            }
        }
    }
    let median = |v: &[Duration]| {
        let mut v = v.to_vec();
        v.sort();
        v.get(v.len() / 2).copied().map(ms)
    };
    let ratio = |a: usize, b: usize| match (median(&series[a]), median(&series[b])) {
        (Some(a), Some(b)) if b > 0.0 => json!(super::round(a / b)),
        _ => serde_json::Value::Null,
    };
    let mut line = json!({
        "scenario": "first_cli",
        "samples": samples,
        "ratio_run_true_vs_true": ratio(0, 1),
        "ratio_run_python_vs_python3": ratio(2, 3),
    });
    for (k, (name, _)) in runs.iter().enumerate() {
        line[*name] = spread(series[k].clone());
    }
    if let Some(engine) = &runtime {
        line[format!("{}_run_true", engine.runtime_info().kind.as_str())] =
            spread(series[runs.len()].clone());
    }
    report(&line, as_json);
    Ok(true)
}

fn report(v: &serde_json::Value, as_json: bool) {
    super::report(v, as_json)
}

/// `MemAvailable` once it holds still: two reads 500 ms apart within 4 MiB of each
/// other (memory freed by what ran before is still coming back), at most 15 s.
async fn settled_mem_available() -> u64 {
    let mut last = mem_available();
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = mem_available();
        if now.abs_diff(last) < 4 << 20 {
            return now;
        }
        last = now;
    }
    last
}

/// How many processes the host runs.
fn processes() -> usize {
    std::fs::read_dir("/proc").map_or(0, |d| {
        d.flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .bytes()
                    .all(|b| b.is_ascii_digit())
            })
            .count()
    })
}

/// The proportional set size of every process of the host, by pid, in bytes: each
/// page shared by `k` processes counts `1/k` in each (`/proc/<pid>/smaps_rollup`).
fn pss_by_pid() -> std::collections::HashMap<u32, u64> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Default::default();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
            let kib = text
                .lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())?;
            Some((pid, kib * 1024))
        })
        .collect()
}

/// What the host's processes grew by since `before`: the PSS of every process
/// that is new, and the growth of those that were there (the bench's own among
/// them); processes that ended count nothing.
fn pss_growth(before: &std::collections::HashMap<u32, u64>) -> u64 {
    pss_by_pid()
        .into_iter()
        .map(|(pid, now)| now.saturating_sub(before.get(&pid).copied().unwrap_or(0)))
        .sum()
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

async fn first_density(engine: EngineName, n: usize, as_json: bool) -> Result<bool, UsageError> {
    let mut config = PaddockConfig::default();
    // As the scenario has it: a pool of 1,024 for 1,000 sandboxes.
    config.pool.max_size = n + 24;
    let mut builder = paddock::builder().config(config);
    if engine != EngineName::CONTAINER {
        builder = builder.without_container();
    }
    let paddock = builder
        .start()
        .map_err(|e| UsageError(format!("paddock did not start: {e}")))?;
    if !paddock.engines().contains(&engine) {
        let _ = paddock.shutdown(Duration::from_secs(5)).await;
        return Ok(true);
    }
    let before = settled_mem_available().await;
    let pss_before = pss_by_pid();
    let mut open = Vec::with_capacity(n);
    let mut sandboxes = Vec::with_capacity(n);
    let mut error = None;
    for chunk in (0..n).collect::<Vec<_>>().chunks(8) {
        let tenants = chunk.iter().map(|i| format!("dense-{i}")).collect();
        for (s, took) in open_all(&paddock, &engine, tenants).await {
            match s {
                Ok(s) => {
                    open.push(took);
                    sandboxes.push(s);
                }
                Err(e) => error = Some(format!("opening sandbox {} failed: {e}", open.len())),
            }
        }
        if error.is_some() {
            break;
        }
    }
    let count = sandboxes.len().max(1) as f64;
    let opened = settled_mem_available().await;
    let opened_per = before.saturating_sub(opened) as f64 / count;
    // Idle: past the time a lease has to use the runners started ahead of need
    // (`subprocess.warm.unused_ms`), after which they are retired.
    let unused = Duration::from_millis(PaddockConfig::default().subprocess.warm.unused_ms);
    tokio::time::sleep(unused + Duration::from_secs(2)).await;
    let after = settled_mem_available().await;
    let pss_grown = pss_growth(&pss_before);
    let per = before.saturating_sub(after) as f64 / count;
    let pss_per = pss_grown as f64 / count;
    let mut answered = 0;
    let mut asked = 0;
    let mut exec = Vec::new();
    // Every one of them answers a Python `print(1)`, one after another.
    for s in sandboxes.iter() {
        asked += 1;
        let t = Instant::now();
        match s.exec(code(Language::Python, "print(1)")).await {
            Ok(r) if r.stdout == "1\n" => {
                answered += 1;
                exec.push(t.elapsed());
            }
            Ok(r) => error = Some(format!("a sandbox answered {:?}", r.stdout)),
            Err(e) => error = Some(format!("a sandbox's Python failed: {e}")),
        }
    }
    let mut line = json!({
        "scenario": "first_density",
        "engine": engine.as_str(),
        "sandboxes": sandboxes.len(),
        "open": spread(open),
        "host_mib_per_sandbox_opened": super::round(opened_per / (1 << 20) as f64),
        "host_mib_per_sandbox": super::round(per / (1 << 20) as f64),
        "pss_mib_per_sandbox": super::round(pss_per / (1 << 20) as f64),
        "mem_available_mib": [before >> 20, opened >> 20, after >> 20],
        "processes": processes(),
        "python_asked": asked,
        "python_answered": answered,
        "python_exec": spread(exec),
    });
    let ok = error.is_none() && answered == asked;
    if let Some(e) = error {
        line["error"] = json!(e);
    }
    report(&line, as_json);
    for s in sandboxes {
        let _ = s.destroy().await;
    }
    let _ = paddock.shutdown(Duration::from_secs(30)).await;
    Ok(ok)
}

/// One Python `print(1)` through `sandbox`, checked.
async fn python_once(sandbox: &dyn paddock_core::Sandbox) -> Result<Duration, String> {
    let t = Instant::now();
    let r = sandbox
        .exec(
            code(Language::Python, "print(1)"),
            &paddock_core::DiscardSink,
            paddock_core::CancelToken::new(),
        )
        .await
        .map_err(|e| format!("python failed: {e}"))?;
    let took = t.elapsed();
    if r.exit_code() != Some(0) || r.stdout != "1\n" {
        return Err(format!("python gave {:?} / {:?}", r.outcome, r.stdout));
    }
    Ok(took)
}

/// `first_repeat`: a repeated Python `print(1)` in one warm container (the engine's
/// execution, through its agent), against `<runtime> exec` of `python3 -c
/// 'print(1)'` into that same running container, and against the subprocess
/// engine's warm mode; interleaved in blocks of 20 after one block each to warm up.
async fn first_repeat(samples: usize, as_json: bool) -> Result<bool, UsageError> {
    use paddock_core::{Engine, Sandbox};
    use paddock_engines::container::ContainerEngine;
    use paddock_engines::subprocess::SubprocessEngine;
    use paddock_engines::{ContainerConfig, SubprocessConfig};
    let skip = |why: String| {
        report(
            &json!({"scenario": "first_repeat", "skipped": why}),
            as_json,
        );
        Ok(true)
    };
    let container = match ContainerEngine::new(&ContainerConfig::default()) {
        Ok(e) => e,
        Err(e) => return skip(format!("the container engine does not start: {e}")),
    };
    let mut sub_config = SubprocessConfig::default();
    sub_config.warm.enabled = true;
    let subprocess = SubprocessEngine::new(&sub_config)
        .map_err(|e| UsageError(format!("the subprocess engine did not start: {e}")))?;
    let warm_container = container
        .open(&SandboxSpec::default())
        .await
        .map_err(|e| UsageError(format!("opening a container sandbox failed: {e}")))?;
    let Some(id) = warm_container.warm_container_id() else {
        let _ = warm_container.destroy().await;
        return skip("the container engine has no warm container here (no agent)".into());
    };
    let warm_sub = match subprocess.create(&SandboxSpec::default()).await {
        Ok(s) => s,
        Err(e) => {
            let _ = warm_container.destroy().await;
            return Err(UsageError(format!(
                "opening a subprocess sandbox failed: {e}"
            )));
        }
    };
    const BLOCK: usize = 20;
    let blocks = samples.max(BLOCK).div_ceil(BLOCK) + 1;
    let mut series: [Vec<Duration>; 3] = Default::default();
    let mut error = None;
    'blocks: for b in 0..blocks {
        for _ in 0..BLOCK {
            match python_once(&warm_container).await {
                Ok(t) if b > 0 => series[0].push(t),
                Ok(_) => {}
                Err(e) => {
                    error = Some(format!("container: {e}"));
                    break 'blocks;
                }
            }
        }
        for _ in 0..BLOCK {
            let (e, id) = (container.clone(), id.clone());
            let got = tokio::task::spawn_blocking(move || {
                e.exec_raw(&id, &["python3", "-c", "print(1)"])
            })
            .await;
            match got {
                Ok(Ok((Some(0), t))) if b > 0 => series[1].push(t),
                Ok(Ok((Some(0), _))) => {}
                other => {
                    error = Some(format!("the runtime's exec gave {other:?}"));
                    break 'blocks;
                }
            }
        }
        for _ in 0..BLOCK {
            match python_once(&*warm_sub).await {
                Ok(t) if b > 0 => series[2].push(t),
                Ok(_) => {}
                Err(e) => {
                    error = Some(format!("subprocess: {e}"));
                    break 'blocks;
                }
            }
        }
    }
    let _ = warm_container.destroy().await;
    let _ = warm_sub.destroy().await;
    let median = |v: &[Duration]| {
        let mut v = v.to_vec();
        v.sort();
        v.get(v.len() / 2).map(|d| ms(*d))
    };
    let ratio = |a: &[Duration], b: &[Duration]| {
        median(a)
            .zip(median(b))
            .map(|(a, b)| super::round3(a / b.max(0.000_001)))
    };
    let runtime = container.runtime_info().kind.as_str();
    let [ours, exec, sub] = series;
    let mut line = json!({
        "scenario": "first_repeat",
        "program": "python print(1)",
        "runtime": runtime,
        "container_warm": spread(ours.clone()),
        format!("{runtime}_exec"): spread(exec.clone()),
        "subprocess_warm": spread(sub.clone()),
        "container_over_exec_p50": ratio(&ours, &exec),
        "container_over_subprocess_p50": ratio(&ours, &sub),
    });
    let ok = error.is_none();
    if let Some(e) = error {
        line["error"] = json!(e);
    }
    report(&line, as_json);
    Ok(ok)
}

/// Runs the scenario: `first_cli`, `first_repeat`, then `first_open` (and
/// `first_density`) per engine.
pub(super) async fn first(
    bursts: Vec<usize>,
    samples: usize,
    density: usize,
    min_idle: Option<usize>,
    as_json: bool,
) -> Result<i32, UsageError> {
    let mut ok = tokio::task::spawn_blocking(move || first_cli(samples, as_json))
        .await
        .map_err(|e| UsageError(format!("the benchmark task failed: {e}")))??;
    ok &= first_repeat(samples, as_json).await?;
    for engine in [EngineName::SUBPROCESS, EngineName::CONTAINER] {
        ok &= first_open(engine.clone(), &bursts, samples, true, min_idle, as_json).await?;
        if engine == EngineName::SUBPROCESS {
            // The baseline: Python runners started as interpreters, bursts up to 8.
            let small: Vec<usize> = bursts.iter().copied().filter(|n| *n <= 8).collect();
            ok &= first_open(engine.clone(), &small, samples, false, min_idle, as_json).await?;
        }
        if density > 0 {
            ok &= first_density(engine, density, as_json).await?;
        }
    }
    Ok(if ok { 0 } else { 1 })
}
