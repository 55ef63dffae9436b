//! The limits matrix: every limit of the one table, set as the *default* (the
//! `[limits]` config, the request setting nothing), against every engine. An
//! engine that lists a limit in its capabilities must bind it; one that does not
//! must refuse a request that sets it, rather than run unbounded.

use std::sync::Arc;
use std::time::Instant;

use paddock_core::{ErrorCode, ExecResult, LimitKind, Limits, Outcome, SandboxSpec, LIMIT_TABLE};

use crate::harness::{Check, Lang, Stop, H};

/// A Python program, as the target runs Python: directly on the warm Python
/// target, through `python3 -c` in a shell.
fn python(h: &H, code: &str, js: &str) -> paddock_core::ExecRequest {
    let mut r = h.program("exec python3 -c \"$PADDOCK_MATRIX_PY\"", code, js);
    if h.target.lang() == Lang::Shell {
        r.env
            .insert("PADDOCK_MATRIX_PY".to_string(), code.to_string());
    }
    // The defaults under test apply only where the request sets nothing.
    r.limits = Limits::default();
    r
}

/// The default `name` is set to for its row, and the program that exceeds it.
fn row(h: &H, name: &str) -> Option<(u64, paddock_core::ExecRequest)> {
    Some(match name {
        "timeout_ms" => (
            1_000,
            python(h, "import time\ntime.sleep(20)", "while (true) {}"),
        ),
        "memory_bytes" => (
            64 << 20,
            python(
                h,
                "b = []\nwhile True: b.append(bytearray(8 << 20))",
                "const a = []; while (true) { a.push(new Array(100000).fill(1.5)); }",
            ),
        ),
        "cpu_ms" => (300, python(h, "while True: pass", "while (true) {}")),
        "cpu_millicores" => (
            100,
            python(
                h,
                "import time\nend = time.time() + 2\nwhile time.time() < end: pass",
                "const end = Date.now() + 2000; while (Date.now() < end) {}",
            ),
        ),
        "pids" => (
            16,
            python(
                h,
                "import os, time\nn = 0\ntry:\n    for i in range(64):\n        if os.fork() == 0:\n            time.sleep(3)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    print('refused after', n)",
                "console.log('no processes');",
            ),
        ),
        "max_output_bytes" => (
            1024,
            python(
                h,
                "print('x' * 100000)",
                "console.log('x'.repeat(100000));",
            ),
        ),
        "file_size_bytes" => (
            1 << 20,
            python(
                h,
                "with open('big', 'wb') as f:\n    f.write(b'\\0' * (8 << 20))",
                "import { writeFile } from 'sandbox:fs'; writeFile('big', 'x'.repeat(8 << 20));",
            ),
        ),
        "open_files" => (
            32,
            python(
                h,
                "fs = []\ntry:\n    for i in range(200): fs.append(open('/dev/null'))\nexcept OSError:\n    pass\nprint('opened', len(fs))",
                "console.log('no descriptors');",
            ),
        ),
        "disk_bytes" => (
            16 << 20,
            python(
                h,
                "with open('big', 'wb') as f:\n    for _ in range(64):\n        f.write(b'\\0' * (1 << 20))\n        f.flush()",
                "import { writeFile } from 'sandbox:fs'; const mb = 'x'.repeat(1 << 20); for (let i = 0; i < 64; i++) writeFile('big' + i, mb);",
            ),
        ),
        "disk_files" => (
            100,
            python(
                h,
                "for i in range(1000): open(f'f{i}', 'w').close()",
                "import { writeFile } from 'sandbox:fs'; for (let i = 0; i < 1000; i++) writeFile('f' + i, '');",
            ),
        ),
        _ => return None,
    })
}

fn limit(kind: LimitKind) -> Outcome {
    Outcome::LimitExceeded { limit: kind }
}

/// Whether `r` (with the sandbox's files `files`: path, size) shows the limit
/// `name` at `value` bound; `Err` says how it did not.
fn bound(
    h: &H,
    name: &str,
    value: u64,
    r: &ExecResult,
    files: &[(String, u64)],
) -> Result<(), String> {
    let js = h.target.lang() == Lang::Js;
    let ok = match name {
        "timeout_ms" => r.outcome == Outcome::TimedOut,
        "memory_bytes" => r.outcome == limit(LimitKind::Memory),
        "cpu_ms" => r.outcome == limit(LimitKind::Cpu),
        // 2 s of spinning at a tenth of a core: well under half of it in CPU.
        // (Some CPU must be counted: a zero would prove nothing.)
        "cpu_millicores" => {
            r.is_success()
                && r.usage.wall_ms >= 1_500
                && r.usage.cpu_ms > 0
                && r.usage.cpu_ms * 2 < r.usage.wall_ms
        }
        // By construction in an isolate: a script has no way to make a process.
        "pids" if js => r.is_success(),
        // Refused before 64 forks, within the limit (the parent is one of them).
        "pids" => {
            let forked = r
                .stdout
                .trim()
                .strip_prefix("refused after ")
                .and_then(|n| n.parse::<u64>().ok());
            forked.is_some_and(|n| n < value)
                || (forked.is_none()
                    && (r.outcome == limit(LimitKind::Pids)
                        || r.warnings.iter().any(|w| w.contains("pids"))))
        }
        "max_output_bytes" => r.stdout_truncated && (r.stdout.len() as u64) <= value + 256,
        "file_size_bytes" => {
            files
                .iter()
                .all(|(p, size)| !p.ends_with("/big") || *size <= value)
                && !r.is_success()
        }
        // By construction in an isolate: a script holds no descriptor of its own.
        "open_files" if js => r.is_success(),
        "open_files" => r
            .stdout
            .trim()
            .strip_prefix("opened ")
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n < value),
        "disk_bytes" => {
            r.outcome == limit(LimitKind::Disk)
                && files.iter().map(|(_, s)| s).sum::<u64>() <= value
        }
        "disk_files" => r.outcome == limit(LimitKind::DiskFiles) && files.len() as u64 <= value,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name} = {value} did not bind: {:?}, stdout {:?}, stderr {:?}, warnings {:?}, usage {:?}, files {files:?}",
            r.outcome,
            crate::harness::clip(&r.stdout, 200),
            crate::harness::clip(&r.stderr, 300),
            r.warnings,
            r.usage
        ))
    }
}

pub(crate) async fn limits_matrix(h: Arc<H>) -> Check {
    let engine = h.target.engine();
    let caps = h
        .paddock()
        .capabilities()
        .iter()
        .find(|(name, _)| *name == engine)
        .map(|(_, c)| c.clone())
        .ok_or_else(|| Stop::Fail(format!("no capabilities for {engine}")))?;
    let mut report = Vec::new();
    for spec in LIMIT_TABLE {
        let name = spec.name;
        let Some((value, request)) = row(&h, name) else {
            return Err(Stop::Fail(format!("the matrix has no row for `{name}`")));
        };
        if !caps.enforces(name) {
            // Not enforced here: asking for it is refused, never ignored.
            let mut asked = request.clone();
            *asked
                .limits
                .fields_mut()
                .into_iter()
                .zip(LIMIT_TABLE)
                .find(|(_, s)| s.name == name)
                .expect("the table names it")
                .0 = Some(value);
            match h.answer(asked).await {
                Err(e) if e.code == ErrorCode::CapabilityNotSupported => {
                    report.push(format!("{name}: not enforced, refused"));
                    continue;
                }
                other => {
                    return Err(Stop::Fail(format!(
                        "{engine} does not list `{name}` but did not refuse a request setting it: {other:?}"
                    )))
                }
            }
        }
        let mut config = h.config();
        let field = config
            .limits
            .defaults
            .fields_mut()
            .into_iter()
            .zip(LIMIT_TABLE)
            .find(|(_, s)| s.name == name)
            .expect("the table names it")
            .0;
        *field = Some(value);
        h.restart(config).await?;
        let sandbox = h.sandbox_with(SandboxSpec::default()).await?;
        let started = Instant::now();
        let r = sandbox
            .exec(request)
            .await
            .map_err(|e| Stop::Fail(format!("{name}: exec: {e}")))?;
        let files: Vec<(String, u64)> = sandbox
            .list_files("")
            .await
            .map_err(|e| Stop::Fail(format!("{name}: list_files: {e}")))?
            .into_iter()
            .map(|f| (f.path, f.size))
            .collect();
        sandbox
            .destroy()
            .await
            .map_err(|e| Stop::Fail(format!("{name}: destroy: {e}")))?;
        bound(&h, name, value, &r, &files).map_err(Stop::Fail)?;
        report.push(format!("{name}: bound in {:?}", started.elapsed()));
    }
    h.restart(h.config()).await?;
    println!("limits matrix [{engine}]:\n  {}", report.join("\n  "));
    Ok(())
}
