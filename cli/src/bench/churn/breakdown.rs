//! `--breakdown N`: where a container sandbox's life goes, on the container engine
//! itself (no scheduler, no pool, one sandbox at a time). Each variant leaves out
//! one more part of a sandbox, and the variants take turns, `N` rounds, in an
//! order that rotates every round, so that drift on a shared machine hits them alike:
//!
//! - `full`: the default: a user namespace, the warm container with its agent, and
//!   the Python and JavaScript runners started in it ahead of need;
//! - `python_runner`: the Python runner only;
//! - `no_runners`: no runners;
//! - `no_runners_no_userns`: no runners and no user namespace;
//! - `no_warm`: no warm container either (`container.warm = false`): the workdir
//!   on its own filesystem and the sandbox's cgroup; its first command starts a
//!   container of its own.
//!
//! Each variant's round is create (`Engine::create`'s work), the first command
//! (`true`) and destroy, timed one by one, with the CPU the round used (this
//! process, the processes it reaped, the containers' cgroups: see `cpu.rs`).
//! Where create ends depends on the variant (without runners it does not wait for
//! the warm container to come up; the first command does), so the parts are
//! priced on create and first command together: each part is the difference
//! between two variants, taken round by round, then its median. Beside them: a
//! workdir on its own filesystem (the disk quota) made and removed without an
//! engine, against a plain directory, and the runtime's own `run` of `/bin/true`
//! on the engine's bundle.
//!
//! And what reusing a sandbox costs instead, on long-lived sandboxes of the
//! `no_runners` variant, in the same rounds: `recycle` is the engine's recycle of a
//! used sandbox as the pool does it between executions (the warm container
//! replaced by a fresh one, the workdir emptied), then the first command in it;
//! `warm_turn` is the first command alone, in a sandbox never recycled: what a
//! reset that keeps the warm container would leave of a cycle.

use std::time::{Duration, Instant};

use paddock_core::{
    CancelToken, DiscardSink, ExecRequest, Language, Program, Sandbox, SandboxSpec,
};
use paddock_engines::container::{ContainerEngine, ContainerSandbox};
use paddock_engines::volume::{Disks, Quota};
use paddock_engines::workdir::Workdir;
use paddock_engines::ContainerConfig;
use serde_json::json;

use super::cpu::Cpu;
use crate::run::UsageError;

const VARIANTS: [&str; 5] = [
    "full",
    "python_runner",
    "no_runners",
    "no_runners_no_userns",
    "no_warm",
];

/// `base` without what `variant` leaves out.
fn config(base: &ContainerConfig, variant: &str) -> ContainerConfig {
    let mut c = base.clone();
    match variant {
        "python_runner" => c.runners.languages = vec![Language::Python],
        "no_runners" => c.runners.enabled = false,
        "no_runners_no_userns" => {
            c.runners.enabled = false;
            c.user_namespace = false;
        }
        "no_warm" => {
            c.runners.enabled = false;
            c.user_namespace = false;
            c.warm = false;
        }
        _ => {}
    }
    c
}

/// One variant's rounds: create, first command and destroy times, and the CPU
/// (process, reaped children, containers) of each round, in ms.
#[derive(Debug, Default)]
struct Rounds {
    create: Vec<Duration>,
    first: Vec<Duration>,
    destroy: Vec<Duration>,
    cpu: Vec<[f64; 3]>,
}

/// A used sandbox recycled (when `recycle`; timed as `create`), then its first
/// command, with the CPU of both.
async fn reuse(sandbox: &ContainerSandbox, recycle: bool, into: &mut Rounds) -> Result<(), String> {
    let cpu = Cpu::now();
    let t = Instant::now();
    if recycle {
        sandbox
            .recycle()
            .await
            .map_err(|e| format!("recycle: {e}"))?;
    }
    into.create.push(t.elapsed());
    let t = Instant::now();
    let r = true_in(sandbox).await;
    into.first.push(t.elapsed());
    into.cpu.push(Cpu::now().own_ms_since(&cpu));
    r
}

/// `true` in `sandbox`, checked.
async fn true_in(sandbox: &ContainerSandbox) -> Result<(), String> {
    match sandbox
        .exec(
            ExecRequest::new(Program::command(["true"])),
            &DiscardSink,
            CancelToken::new(),
        )
        .await
    {
        Ok(r) if r.is_success() => Ok(()),
        Ok(r) => Err(format!("the first command gave {:?}", r.outcome)),
        Err(e) => Err(format!("the first command failed: {e}")),
    }
}

async fn round(engine: &ContainerEngine, into: &mut Rounds) -> Result<(), String> {
    let cpu = Cpu::now();
    let t = Instant::now();
    let sandbox = engine
        .open(&SandboxSpec::default())
        .await
        .map_err(|e| format!("create: {e}"))?;
    into.create.push(t.elapsed());
    let t = Instant::now();
    let first = true_in(&sandbox).await;
    into.first.push(t.elapsed());
    let t = Instant::now();
    let destroyed = sandbox.destroy().await;
    into.destroy.push(t.elapsed());
    into.cpu.push(Cpu::now().own_ms_since(&cpu));
    first?;
    destroyed.map_err(|e| format!("destroy: {e}"))
}

/// Round by round, `a + b`.
fn sum(a: &[Duration], b: &[Duration]) -> Vec<Duration> {
    a.iter().zip(b).map(|(a, b)| *a + *b).collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(super::super::round3(v[v.len() / 2]))
}

/// The median, round by round, of `a` minus `b`, in ms.
fn paired(a: &[Duration], b: &[Duration]) -> Option<f64> {
    median(a.iter().zip(b).map(|(a, b)| ms(*a) - ms(*b)).collect())
}

/// The disk quota's part: a workdir on its own filesystem made and removed, and a
/// plain directory, `n` times each, interleaved (make and remove timed apart).
fn disk(n: usize) -> serde_json::Value {
    let parent = std::env::temp_dir().join(format!("paddock-bench-churn-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&parent) {
        return json!({"skipped": format!("cannot create {}: {e}", parent.display())});
    }
    let disks = Disks::new(&parent);
    let Some(backend) = disks.backend() else {
        let _ = std::fs::remove_dir_all(&parent);
        return json!({"skipped": disks.notes().join("; ")});
    };
    // The engine's default quota.
    let limits = paddock_core::Limits::defaults();
    let quota = Quota {
        bytes: limits.disk_bytes.unwrap_or(1 << 30),
        files: limits.disk_files.unwrap_or(65_536),
    };
    let mut series: [Vec<Duration>; 4] = Default::default();
    let mut error = None;
    // The first of each makes the template; it is left out.
    for i in 0..=n {
        for (k, with) in [(0, Some((&disks, quota))), (2, None)] {
            let t = Instant::now();
            let made = Workdir::create_on(&parent, &format!("w{k}-{i}"), with);
            let make = t.elapsed();
            let w = match made {
                Ok(w) => w,
                Err(e) => {
                    error = Some(e.to_string());
                    continue;
                }
            };
            let t = Instant::now();
            let _ = w.remove();
            if i > 0 {
                series[k].push(make);
                series[k + 1].push(t.elapsed());
            }
        }
    }
    drop(disks);
    let _ = std::fs::remove_dir_all(&parent);
    let [make, remove, plain_make, plain_remove] = series.map(super::spread);
    json!({
        "backend": backend,
        "quota_bytes": quota.bytes,
        "make": make,
        "remove": remove,
        "plain_dir_make": plain_make,
        "plain_dir_remove": plain_remove,
        "error": error,
    })
}

pub(super) async fn breakdown(
    base: &ContainerConfig,
    n: usize,
    as_json: bool,
) -> Result<bool, UsageError> {
    let mut engines = Vec::new();
    for v in VARIANTS {
        match ContainerEngine::new(&config(base, v)) {
            Ok(e) => engines.push(e),
            Err(e) => {
                super::super::report(
                    &json!({"scenario": "churn_breakdown", "engine": "container",
                        "skipped": format!("the {v} engine does not start: {e}")}),
                    as_json,
                );
                return Ok(true);
            }
        }
    }
    let info = engines[0].runtime_info().clone();
    // The reuse series' sandboxes: no runners, each used once.
    let no_runners = &engines[2];
    let mut kept = Vec::new();
    for _ in 0..2 {
        let s = no_runners
            .open(&SandboxSpec::default())
            .await
            .map_err(|e| UsageError(format!("opening a container sandbox failed: {e}")))?;
        true_in(&s).await.map_err(UsageError)?;
        kept.push(s);
    }
    let mut reused: [Rounds; 2] = Default::default();
    let mut rounds: Vec<Rounds> = VARIANTS.iter().map(|_| Rounds::default()).collect();
    let mut runs = Vec::new();
    let mut error = None;
    // One round of each first, left out: page cache, templates, the runtimes' first starts.
    'rounds: for i in 0..=n {
        for k in 0..VARIANTS.len() {
            let k = (k + i) % VARIANTS.len();
            let mut scratch = Rounds::default();
            let into = if i == 0 { &mut scratch } else { &mut rounds[k] };
            if let Err(e) = round(&engines[k], into).await {
                error = Some(format!("{}: {e}", VARIANTS[k]));
                break 'rounds;
            }
        }
        for k in 0..2 {
            let k = (k + i) % 2;
            let mut scratch = Rounds::default();
            let into = if i == 0 { &mut scratch } else { &mut reused[k] };
            if let Err(e) = reuse(&kept[k], k == 0, into).await {
                error = Some(format!("{}: {e}", ["recycle", "warm_turn"][k]));
                break 'rounds;
            }
        }
        // The runtime's own `run` of `/bin/true` on the full engine's bundle.
        let e = engines[0].clone();
        let took = tokio::task::spawn_blocking(move || e.run_raw(&["/bin/true".to_string()]))
            .await
            .map_err(|e| UsageError(format!("the baseline task failed: {e}")))?;
        if let (Ok((Some(0), took)), true) = (took, i > 0) {
            runs.push(took);
        }
    }
    for s in kept {
        let _ = s.destroy().await;
    }
    drop(engines);
    let disk_line = tokio::task::spawn_blocking(move || disk(n.max(10)))
        .await
        .map_err(|e| UsageError(format!("the disk task failed: {e}")))?;
    let mut variants = serde_json::Map::new();
    for (name, r) in VARIANTS.iter().zip(&rounds) {
        let cpu = |i: usize| median(r.cpu.iter().map(|c| c[i]).collect());
        variants.insert(
            name.to_string(),
            json!({
                "create": super::spread(r.create.clone()),
                "create_and_first": super::spread(sum(&r.create, &r.first)),
                "first_command": super::spread(r.first.clone()),
                "destroy": super::spread(r.destroy.clone()),
                "cpu_ms_per_sandbox_p50": {
                    "process": cpu(0),
                    "children": cpu(1),
                    "containers": cpu(2),
                },
            }),
        );
    }
    let at = |name: &str| &rounds[VARIANTS.iter().position(|v| *v == name).unwrap_or(0)];
    let part = |a: &str, b: &str, f: fn(&Rounds) -> &Vec<Duration>| paired(f(at(a)), f(at(b)));
    let ready: Vec<Vec<Duration>> = rounds.iter().map(|r| sum(&r.create, &r.first)).collect();
    let ready_of = |name: &str| &ready[VARIANTS.iter().position(|v| *v == name).unwrap_or(0)];
    let first_part = |a: &str, b: &str| paired(ready_of(a), ready_of(b));
    fn destroy(r: &Rounds) -> &Vec<Duration> {
        &r.destroy
    }
    // The CPU of a round (every kind), by variant.
    let cpu_of = |name: &str| -> Vec<f64> { at(name).cpu.iter().map(|c| c.iter().sum()).collect() };
    let cpu_part = |a: &str, b: &str| {
        median(
            cpu_of(a)
                .iter()
                .zip(cpu_of(b))
                .map(|(a, b)| a - b)
                .collect(),
        )
    };
    let line = json!({
        "scenario": "churn_breakdown",
        "engine": "container",
        "runtime": info.kind.as_str(),
        "runtime_version": info.version,
        "rounds": rounds[0].create.len(),
        "variants": variants,
        // Round by round, medians, in ms.
        "parts_p50_ms": {
            "create_and_first": {
                "javascript_runner": first_part("full", "python_runner"),
                "python_runner": first_part("python_runner", "no_runners"),
                "user_namespace": first_part("no_runners", "no_runners_no_userns"),
                // A warm container's start and a turn in it, against a container of
                // the first command's own.
                "warm_container_over_cold": first_part("no_runners_no_userns", "no_warm"),
                "no_warm": median(ready_of("no_warm").iter().map(|d| ms(*d)).collect()),
                "no_warm_create": median(at("no_warm").create.iter().map(|d| ms(*d)).collect()),
            },
            "destroy": {
                "runners": part("full", "no_runners", destroy),
                "user_namespace": part("no_runners", "no_runners_no_userns", destroy),
                "warm_container": part("no_runners_no_userns", "no_warm", destroy),
                "workdir_disk_cgroup": median(at("no_warm").destroy.iter().map(|d| ms(*d)).collect()),
            },
        },
        "cpu_parts_p50_ms": {
            "javascript_runner": cpu_part("full", "python_runner"),
            "python_runner": cpu_part("python_runner", "no_runners"),
            "user_namespace": cpu_part("no_runners", "no_runners_no_userns"),
            "warm_container_over_cold": cpu_part("no_runners_no_userns", "no_warm"),
            "no_warm": median(cpu_of("no_warm")),
        },
        "reuse": {
            "recycle": {
                "recycle": super::spread(reused[0].create.clone()),
                "first_command": super::spread(reused[0].first.clone()),
                "cpu_ms_p50": median(reused[0].cpu.iter().map(|c| c.iter().sum()).collect()),
            },
            "warm_turn": {
                "first_command": super::spread(reused[1].first.clone()),
                "cpu_ms_p50": median(reused[1].cpu.iter().map(|c| c.iter().sum()).collect()),
            },
        },
        "runtime_run_true": super::spread(runs),
        "disk": disk_line,
        "error": error,
    });
    let ok = error.is_none();
    super::super::report(&line, as_json);
    Ok(ok)
}
