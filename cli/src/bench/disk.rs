//! The `disk` scenario: what a sandbox's own filesystem (the disk quota) costs. A
//! workdir made and removed as a plain directory against one that is its own
//! filesystem, and 64 MiB written into each, interleaved so drift on a shared
//! machine hits both alike.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use paddock_engines::volume::{Disks, Quota};
use paddock_engines::workdir::Workdir;
use serde_json::json;

use super::{report, round, round3, summarize};

fn make_and_remove(parent: &Path, name: &str, disk: Option<(&Disks, Quota)>) -> Duration {
    let start = Instant::now();
    let w = Workdir::create_on(parent, name, disk).expect("creating a workdir");
    w.remove().expect("removing the workdir");
    start.elapsed()
}

/// Writes `mib` MiB into `dir/f`, 1 MiB at a time, then syncs: the data's time to
/// the filesystem, not just to the page cache.
fn write(dir: &Path, mib: usize) -> Duration {
    let chunk = vec![7u8; 1 << 20];
    let start = Instant::now();
    let mut f = std::fs::File::create(dir.join("f")).expect("creating a file");
    for _ in 0..mib {
        f.write_all(&chunk).expect("writing");
    }
    f.sync_all().expect("syncing");
    let took = start.elapsed();
    drop(f);
    std::fs::remove_file(dir.join("f")).expect("removing the file");
    took
}

pub(super) fn disk(n: usize, as_json: bool) -> Result<i32, crate::run::UsageError> {
    let parent = std::env::temp_dir().join(format!("paddock-bench-disk-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&parent) {
        eprintln!("paddock bench: cannot create {}: {e}", parent.display());
        return Ok(1);
    }
    let disks = Disks::new(&parent);
    let Some(backend) = disks.backend() else {
        eprintln!(
            "paddock bench: no disk-quota backend works here: {}",
            disks.notes().join("; ")
        );
        let _ = std::fs::remove_dir_all(&parent);
        return Ok(1);
    };
    let quota = Quota {
        bytes: 1 << 30,
        files: 65_536,
    };
    // The template for this quota is made on first use: once, outside the samples.
    make_and_remove(&parent, "warmup", Some((&disks, quota)));
    let (mut plain, mut own) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        plain.push(make_and_remove(&parent, &format!("p{i}"), None));
        own.push(make_and_remove(
            &parent,
            &format!("q{i}"),
            Some((&disks, quota)),
        ));
    }
    let (plain, own) = (summarize(plain), summarize(own));
    report(
        &json!({
            "scenario": "disk_create",
            "backend": backend,
            "iterations": n,
            "quota_bytes": quota.bytes,
            "p50_us": round(own.p50),
            "p99_us": round(own.p99),
            "baseline_p50_us": round(plain.p50),
            "baseline_p99_us": round(plain.p99),
            "ratio_p50": round3(own.p50 / plain.p50),
        }),
        as_json,
    );

    let rounds = (n / 20).clamp(3, 15);
    let mib = 64;
    let p = Workdir::create_on(&parent, "wp", None).expect("a plain workdir");
    let q = Workdir::create_on(&parent, "wq", Some((&disks, quota))).expect("a workdir of its own");
    let (mut plain_w, mut own_w) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        plain_w.push(write(p.root(), mib));
        own_w.push(write(q.root(), mib));
    }
    let _ = (p.remove(), q.remove());
    let (plain_w, own_w) = (summarize(plain_w), summarize(own_w));
    let mib_s = |us: f64| mib as f64 / (us / 1e6);
    report(
        &json!({
            "scenario": "disk_write",
            "backend": backend,
            "rounds": rounds,
            "mib": mib,
            "p50_mib_s": round(mib_s(own_w.p50)),
            "baseline_p50_mib_s": round(mib_s(plain_w.p50)),
            "ratio_p50": round3(own_w.p50 / plain_w.p50),
        }),
        as_json,
    );
    drop(disks);
    let _ = std::fs::remove_dir_all(&parent);
    Ok(0)
}
