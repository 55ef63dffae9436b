//! Resource exhaustion: fork and memory bombs, a CPU spin, a 1 GiB output flood, one
//! huge file, many small files.

use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_core::{ErrorCode, ExecResult, LimitKind, Outcome};

use crate::harness::{Check, Lang, Stop, Target, H};

fn limit(kind: LimitKind) -> Outcome {
    Outcome::LimitExceeded { limit: kind }
}

/// A trivial execution succeeds: the engine recovered from what came before.
pub(crate) async fn still_works(h: &H) -> Check {
    let r = h
        .exec(h.program("echo ok", "print('ok')", "console.log('ok')"))
        .await?;
    ensure!(
        r.is_success() && r.stdout == "ok\n",
        "the next execution did not run normally: {r:?}"
    );
    Ok(())
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

pub(crate) async fn fork_bomb(h: Arc<H>) -> Check {
    if h.target.lang() == Lang::Js {
        skip!("a script in an isolate has no way to create a process: there is nothing to bomb");
    }
    let t = &h.token;
    // The bomb runs for two seconds against the pids limit; every copy is a fork of
    // the script's shell (or of Python, which then becomes `sleep <token>`), so a
    // survivor carries the token.
    let mut request = h.program(
        &format!("f() {{ f | f & }}; f; sleep 2; echo bombed # {t}"),
        &format!(
            "import os, time\nparent = os.getpid()\nend = time.time() + 2\nwhile time.time() < end:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)\nif os.getpid() != parent:\n    os.execvp('sleep', ['sleep', '{t}'])\nprint('bombed')"
        ),
        "",
    );
    request.limits.pids = Some(64);
    request.limits.timeout_ms = Some(15_000);
    let started = Instant::now();
    let r = h.exec(request).await?;
    let took = started.elapsed();
    ensure!(
        took < Duration::from_secs(14),
        "the bomb ran into its deadline ({took:?}): {r:?}"
    );
    // A cold container's group (which counted the refusals) goes with the container,
    // so only the shell's own complaint shows the limit there.
    let said_so = h.target == Target::ContainerCold && r.stderr.contains("Cannot fork");
    let bound = matches!(
        r.outcome,
        Outcome::LimitExceeded {
            limit: LimitKind::Pids
        }
    ) || r.warnings.iter().any(|w| w.contains("pids"))
        || said_so;
    ensure!(
        bound,
        "the pids limit was not reported (outcome or warning): {:?} warnings {:?} stderr {}",
        r.outcome,
        r.warnings,
        crate::harness::clip(&r.stderr, 300)
    );
    h.no_survivors("the fork bomb").await?;
    still_works(&h).await
}

pub(crate) async fn memory_bomb(h: Arc<H>) -> Check {
    let mut request = h.program(
        "exec python3 -c 'b = []\nwhile True: b.append(bytearray(8 << 20))'",
        "b = []\nwhile True: b.append(bytearray(8 << 20))",
        "const a = []; while (true) { a.push(new Array(100000).fill(1.5)); }",
    );
    request.limits.memory_bytes = Some(64 << 20);
    let r = h.exec(request).await?;
    ensure!(
        r.outcome == limit(LimitKind::Memory),
        "expected limit_exceeded (memory), got {:?}: {}",
        r.outcome,
        crate::harness::clip(&r.stderr, 300)
    );
    ensure!(
        r.outcome.error_code() == Some(ErrorCode::MemoryExceeded),
        "a memory limit must map to MEMORY_EXCEEDED: {:?}",
        r.outcome.error_code()
    );
    still_works(&h).await
}

pub(crate) async fn cpu_spin(h: Arc<H>) -> Check {
    let t = &h.token;
    let spin = |timeout_ms: u64| {
        let mut r = h.program(
            &format!("while :; do :; done # {t}"),
            "while True: pass",
            "while (true) {}",
        );
        r.limits.timeout_ms = Some(timeout_ms);
        r
    };
    let started = Instant::now();
    let r = h.exec(spin(1_000)).await?;
    let took = started.elapsed();
    ensure!(r.outcome == Outcome::TimedOut, "expected timed_out: {r:?}");
    ensure!(
        took < Duration::from_secs(6),
        "a 1 s deadline took {took:?} to end the spin"
    );
    h.no_survivors("the CPU spin").await?;
    if h.target.lang() != Lang::Js {
        // The CPU-time limit ends the spin before its 20 s deadline.
        let mut request = spin(20_000);
        request.limits.cpu_ms = Some(500);
        let r = h.exec(request).await?;
        ensure!(
            r.outcome == limit(LimitKind::Cpu),
            "expected limit_exceeded (cpu) from cpu_ms 500: {r:?}"
        );
        h.no_survivors("the CPU-limited spin").await?;
    }
    still_works(&h).await
}

pub(crate) async fn output_flood(h: Arc<H>) -> Check {
    const CAP: u64 = 1 << 20;
    let mut request = h.program(
        "yes | head -c 1073741824",
        "import sys\nb = 'y' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(b)",
        "const s = 'y'.repeat(1 << 20); for (let i = 0; i < 1024; i++) console.log(s);",
    );
    request.limits.max_output_bytes = Some(CAP);
    request.limits.timeout_ms = Some(120_000);
    let rss_before = rss_bytes();
    let started = Instant::now();
    let r = h.exec(request).await?;
    let took = started.elapsed();
    let grew = rss_bytes().saturating_sub(rss_before);
    check_capped(&r, CAP)?;
    ensure!(
        matches!(
            r.outcome,
            Outcome::Completed { exit_code: 0, .. }
                | Outcome::LimitExceeded {
                    limit: LimitKind::Output
                }
        ),
        "a flood past the cap ends completed or limit_exceeded (output): {:?}",
        r.outcome
    );
    ensure!(
        grew < 256 << 20,
        "this process grew by {} MiB during a 1 GiB flood: the output was buffered",
        grew >> 20
    );
    println!(
        "output_flood: 1 GiB in {took:?}, host RSS +{} KiB",
        grew >> 10
    );
    still_works(&h).await
}

fn check_capped(r: &ExecResult, cap: u64) -> Check {
    ensure!(
        r.stdout_truncated,
        "stdout past the cap must be flagged truncated: {:?}",
        r.outcome
    );
    // The cap, and at most a short truncation marker.
    ensure!(
        (r.stdout.len() as u64) <= cap + 256,
        "stdout holds {} bytes with a cap of {cap}",
        r.stdout.len()
    );
    Ok(())
}

pub(crate) async fn huge_file(h: Arc<H>) -> Check {
    const LIMIT: u64 = 8 << 20;
    let sandbox = h.sandbox().await?;
    let mut request = h.program(
        "exec head -c 67108864 /dev/zero > big",
        "with open('big', 'wb') as f:\n    f.write(b'\\0' * (64 << 20))",
        "import { writeFile } from 'sandbox:fs'; writeFile('big', 'x'.repeat(64 << 20));",
    );
    request.limits.file_size_bytes = Some(LIMIT);
    request.limits.memory_bytes = Some(512 << 20);
    let r = sandbox
        .exec(request)
        .await
        .map_err(|e| Stop::Fail(format!("exec: {e}")))?;
    let size = sandbox
        .list_files("")
        .await
        .map_err(|e| Stop::Fail(format!("list_files: {e}")))?
        .into_iter()
        .find(|f| f.path.ends_with("/big"))
        .map(|f| f.size);
    sandbox
        .destroy()
        .await
        .map_err(|e| Stop::Fail(format!("destroy: {e}")))?;
    if let Some(size) = size {
        ensure!(
            size <= LIMIT,
            "the file grew to {size} bytes past file_size_bytes {LIMIT} ({:?})",
            r.outcome
        );
    }
    // Killed by SIGXFSZ, or refused; Python ignores SIGXFSZ and gets EFBIG instead,
    // which is the program's own error to report.
    let efbig = h.target.lang() == Lang::Python
        && matches!(r.outcome, Outcome::Completed { exit_code: 1, .. })
        && r.stderr.contains("File too large");
    ensure!(
        r.outcome == limit(LimitKind::FileSize) || efbig,
        "expected limit_exceeded (file_size), got {:?}: {}",
        r.outcome,
        crate::harness::clip(&r.stderr, 300)
    );
    still_works(&h).await
}

pub(crate) async fn many_files(h: Arc<H>) -> Check {
    let sandbox = h.sandbox().await?;
    let root = std::path::PathBuf::from(&sandbox.info().host_dir);
    let mut request = h.program(
        "mkdir d && i=0 && while [ $i -lt 20000 ]; do : > d/f$i; i=$((i+1)); done; ls d | wc -l",
        "import os\nos.makedirs('d')\nfor i in range(20000):\n    open(f'd/f{i}', 'w').close()\nprint(len(os.listdir('d')))",
        "import { writeFile, listFiles } from 'sandbox:fs'; for (let i = 0; i < 20000; i++) writeFile('d/f' + i, ''); console.log(listFiles('d').length);",
    );
    request.limits.timeout_ms = Some(120_000);
    let r = sandbox
        .exec(request)
        .await
        .map_err(|e| Stop::Fail(format!("exec: {e}")))?;
    ensure!(
        r.is_success() && r.stdout.trim() == "20000",
        "20,000 files were not made: {r:?}"
    );
    let started = Instant::now();
    sandbox
        .destroy()
        .await
        .map_err(|e| Stop::Fail(format!("destroy: {e}")))?;
    crate::harness::emptied(&root, "destroy")?;
    println!(
        "many_files: destroy removed 20,000 files in {:?}",
        started.elapsed()
    );
    still_works(&h).await
}

/// Writes 64 MiB, 1 MiB at a time, into a sandbox whose disk holds 16 MiB: the
/// write fails with ENOSPC inside the program, the file stays within the quota, the
/// result says `limit_exceeded` (`disk`), a one-shot execution asking for the same
/// quota is answered the same way, and destroy leaves the workdir empty (its
/// instance, the filesystem included, is recycled for the next sandbox).
/// Skips a disk case where the engine cannot make a sandbox a filesystem of its own
/// (no loop device or tmpfs mount for this user); CI, which sets
/// `PADDOCK_REQUIRE_CONTAINERS`, requires it.
fn require_disk_quota(h: &H) -> Check {
    let engine = h.target.engine();
    let enforced = h
        .paddock()
        .capabilities()
        .iter()
        .any(|(name, caps)| *name == engine && caps.enforces("disk_bytes"));
    if enforced {
        return Ok(());
    }
    if std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_some() {
        return Err(Stop::Fail(format!(
            "the {engine} engine enforces no disk quota here (see `paddock doctor`)"
        )));
    }
    skip!("no disk-quota backend works here (loop devices or tmpfs mounts need root)")
}

pub(crate) async fn disk_quota(h: Arc<H>) -> Check {
    require_disk_quota(&h)?;
    const QUOTA: u64 = 16 << 20;
    let fill = || {
        let mut r = h.program(
            "head -c 67108864 /dev/zero > big",
            "import errno\ntry:\n    with open('big', 'wb') as f:\n        for _ in range(64):\n            f.write(b'\\0' * (1 << 20))\n            f.flush()\nexcept OSError as e:\n    print('errno', errno.errorcode[e.errno])\n    raise",
            "import { writeFile } from 'sandbox:fs'; const mb = 'x'.repeat(1 << 20); for (let i = 0; i < 64; i++) writeFile('big' + i, mb);",
        );
        r.limits.timeout_ms = Some(60_000);
        r
    };
    let mut spec = paddock_core::SandboxSpec::default();
    spec.limits.disk_bytes = Some(QUOTA);
    let sandbox = h.sandbox_with(spec).await?;
    let root = std::path::PathBuf::from(&sandbox.info().host_dir);
    let r = sandbox
        .exec(fill())
        .await
        .map_err(|e| Stop::Fail(format!("exec: {e}")))?;
    let files = sandbox
        .list_files("")
        .await
        .map_err(|e| Stop::Fail(format!("list_files: {e}")))?;
    let written: u64 = files.iter().map(|f| f.size).sum();
    ensure!(
        written <= QUOTA,
        "{written} bytes were written into a {QUOTA} byte disk: {r:?}"
    );
    ensure!(
        written >= QUOTA / 2,
        "only {written} bytes were written before the write failed: {r:?}"
    );
    ensure!(
        r.outcome == limit(LimitKind::Disk),
        "expected limit_exceeded (disk), got {:?} (stdout {:?}, stderr {})",
        r.outcome,
        r.stdout,
        crate::harness::clip(&r.stderr, 300)
    );
    if h.target.lang() == Lang::Python {
        ensure!(r.stdout.contains("errno ENOSPC"), "{:?}", r.stdout);
    }
    // A second run finds the disk full already: its own outcome, with a warning.
    let again = sandbox
        .exec(h.program("echo ok", "print('ok')", "console.log('ok')"))
        .await
        .map_err(|e| Stop::Fail(format!("exec: {e}")))?;
    ensure!(
        again.is_success() && again.warnings.iter().any(|w| w.contains("ENOSPC")),
        "a run on a full disk should succeed with a warning: {again:?}"
    );
    sandbox
        .destroy()
        .await
        .map_err(|e| Stop::Fail(format!("destroy: {e}")))?;
    crate::harness::emptied(&root, "destroy")?;

    // One-shot: a pool of sandboxes of that quota serves it.
    let mut one_shot = fill();
    one_shot.limits.disk_bytes = Some(QUOTA);
    let r = h.exec(one_shot).await?;
    ensure!(
        r.outcome == limit(LimitKind::Disk),
        "one-shot: expected limit_exceeded (disk), got {:?}: {}",
        r.outcome,
        crate::harness::clip(&r.stderr, 300)
    );
    still_works(&h).await
}

/// Creates 1,000 files in a sandbox capped at 200: creation fails with ENOSPC
/// inside the program, no more than the cap exist, and the result says
/// `limit_exceeded` (`disk_files`).
pub(crate) async fn file_count_cap(h: Arc<H>) -> Check {
    require_disk_quota(&h)?;
    const CAP: u64 = 200;
    let mut spec = paddock_core::SandboxSpec::default();
    spec.limits.disk_files = Some(CAP);
    let sandbox = h.sandbox_with(spec).await?;
    let root = std::path::PathBuf::from(&sandbox.info().host_dir);
    let r = sandbox
        .exec(h.program(
            "i=0; while [ $i -lt 1000 ]; do : > f$i || { echo made $i; exit 1; }; i=$((i+1)); done",
            "made = 0\ntry:\n    for i in range(1000):\n        open(f'f{i}', 'w').close()\n        made += 1\nfinally:\n    print('made', made)",
            "import { writeFile } from 'sandbox:fs'; let made = 0; try { for (let i = 0; i < 1000; i++) { writeFile('f' + i, ''); made++; } } finally { console.log('made', made); }",
        ))
        .await
        .map_err(|e| Stop::Fail(format!("exec: {e}")))?;
    let count = sandbox
        .list_files("")
        .await
        .map_err(|e| Stop::Fail(format!("list_files: {e}")))?
        .len() as u64;
    ensure!(
        (CAP / 2..=CAP).contains(&count),
        "{count} files exist under a cap of {CAP}: {r:?}"
    );
    ensure!(
        r.outcome == limit(LimitKind::DiskFiles),
        "expected limit_exceeded (disk_files), got {:?} (stdout {:?}, stderr {})",
        r.outcome,
        r.stdout,
        crate::harness::clip(&r.stderr, 300)
    );
    sandbox
        .destroy()
        .await
        .map_err(|e| Stop::Fail(format!("destroy: {e}")))?;
    crate::harness::emptied(&root, "destroy")?;
    still_works(&h).await
}

/// An execution in a sandbox asks for more than the sandbox was opened with
/// (memory, pids, output), or more memory than a sandbox opened without limits got
/// by default: refused, naming the field and the sandbox's value, before anything
/// runs; within them, it runs.
pub(crate) async fn more_than_the_sandbox(h: Arc<H>) -> Check {
    let sandbox = h
        .sandbox_with(paddock_core::SandboxSpec {
            limits: paddock_core::Limits {
                memory_bytes: Some(128 << 20),
                pids: Some(64),
                max_output_bytes: Some(64 << 10),
                ..paddock_core::Limits::default()
            },
            ..paddock_core::SandboxSpec::default()
        })
        .await?;
    let asks = [
        (
            "memory_bytes",
            paddock_core::Limits {
                memory_bytes: Some(4 << 30),
                ..paddock_core::Limits::default()
            },
        ),
        (
            "pids",
            paddock_core::Limits {
                pids: Some(4096),
                ..paddock_core::Limits::default()
            },
        ),
        (
            "max_output_bytes",
            paddock_core::Limits {
                max_output_bytes: Some(32 << 20),
                ..paddock_core::Limits::default()
            },
        ),
    ];
    for (field, limits) in asks {
        let mut request = h.program("echo ran", "print('ran')", "console.log('ran')");
        request.limits = limits;
        match sandbox.exec(request).await {
            Ok(r) => {
                let _ = sandbox.destroy().await;
                fail!("an execution asking for more {field} than its sandbox ran: {r:?}")
            }
            Err(e) => ensure!(
                e.code == ErrorCode::InvalidOptions
                    && e.message.contains(&format!("limits.{field}"))
                    && e.message.contains("this sandbox's own limit"),
                "{field}: {e}"
            ),
        }
    }
    let mut within = h.program("echo ran", "print('ran')", "console.log('ran')");
    within.limits.memory_bytes = Some(96 << 20);
    let r = sandbox
        .exec(within)
        .await
        .map_err(|e| Stop::Fail(format!("an execution within the sandbox's limits: {e}")))?;
    let _ = sandbox.destroy().await;
    ensure!(r.is_success() && r.stdout == "ran\n", "{r:?}");
    // A sandbox opened without limits runs with the engine's defaults (512 MiB of
    // memory): they are its ceiling too.
    let plain = h.sandbox().await?;
    let mut greedy = h.program("echo ran", "print('ran')", "console.log('ran')");
    greedy.limits.memory_bytes = Some(4 << 30);
    let answer = plain.exec(greedy).await;
    let _ = plain.destroy().await;
    match answer {
        Ok(r) => fail!("4 GiB in a sandbox of the default 512 MiB ran: {r:?}"),
        Err(e) => ensure!(
            e.code == ErrorCode::InvalidOptions && e.message.contains("limits.memory_bytes"),
            "{e}"
        ),
    }
    still_works(&h).await
}
