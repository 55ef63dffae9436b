//! The `paddock` binary, driven as a user would.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn paddock(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("paddock runs")
}

#[test]
fn exit_status_is_the_programs_own() {
    let out = paddock(&["run", "--", "sh", "-c", "echo hi; echo oops >&2; exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "oops\n");
}

#[test]
fn killed_by_signal_is_128_plus_n() {
    let out = paddock(&["run", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(out.status.code(), Some(128 + 15));
}

#[test]
fn json_prints_one_object_for_a_refusal_too() {
    // The built-in policy blocks `eval` in JavaScript: refused before it runs.
    let out = paddock(&[
        "run",
        "--json",
        "--engine",
        "isolate",
        "--lang",
        "javascript",
        "--code",
        "eval('1')",
    ]);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["error"]["code"], "CODE_BLOCKED", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("eval"),
        "{v}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("CODE_BLOCKED"),
        "the message still goes to stderr"
    );

    // A request that fails validation (a memory limit below the minimum) is a usage
    // error (2), in JSON too.
    let out = paddock(&["run", "--json", "--memory", "0", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["error"]["code"], "INVALID_OPTIONS", "{v}");

    // Without --json, stdout stays empty.
    let out = paddock(&[
        "run",
        "--engine",
        "isolate",
        "--lang",
        "javascript",
        "--code",
        "eval('1')",
    ]);
    assert_eq!(out.status.code(), Some(125));
    assert!(out.stdout.is_empty());
}

#[test]
fn timeout_is_124_and_json_reports_it() {
    let start = Instant::now();
    let out = paddock(&["run", "--timeout", "300ms", "--json", "--", "sleep", "10"]);
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(124));
    let line = String::from_utf8(out.stdout).unwrap();
    assert_eq!(line.lines().count(), 1, "{line}");
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["outcome"], "timed_out");
    assert_eq!(v["timed_out"], true);
    assert!(v["exit_code"].is_null());
    assert!(v["signal"].is_null());
    assert_eq!(v["stdout_truncated"], false);
    assert!(v["usage"]["wall_ms"].as_u64().unwrap() >= 250);
}

#[test]
fn bench_container_reports_runsc_beside_the_host_kernel() {
    // The shortest series: ten of each.
    let out = paddock(&[
        "bench",
        "container",
        "--json",
        "--runtime",
        "runsc",
        "--iterations",
        "10",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(1) && stderr.contains("cannot start with runsc") {
        assert!(
            std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none(),
            "runsc must run here: {stderr}"
        );
        eprintln!("skipped: {stderr}");
        return;
    }
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        (&v["scenario"], &v["runtime"]),
        (&"container".into(), &"runsc".into()),
        "{v}"
    );
    for key in [
        "cold_p50_us",
        "runsc_run_p50_us",
        "warm_p50_us",
        "runsc_exec_p50_us",
    ] {
        assert!(v[key].as_f64().is_some_and(|t| t > 0.0), "{key}: {v}");
    }
    // gVisor's system calls cost more than the host kernel's, by far.
    let (gvisor, host) = (
        v["syscall_us"].as_f64().unwrap(),
        v["host_kernel_syscall_us"].as_f64().unwrap(),
    );
    assert!(gvisor > 3.0 * host, "{v}");
}

#[test]
fn a_short_bench_egress_reports_its_three_scenarios_and_leaves_no_namespace() {
    let child = Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args(["bench", "egress", "--json", "--samples", "10", "--mib", "8"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("paddock runs");
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Without root, `ip` or `nft`, each scenario it cannot run says why.
    if let Some(v) = lines.iter().find(|v| v["skipped"].is_string()) {
        assert!(
            std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none(),
            "the egress bench must run here: {v}"
        );
        eprintln!("skipped: {v}");
        return;
    }
    let scenarios: Vec<&str> = lines
        .iter()
        .map(|v| v["scenario"].as_str().unwrap())
        .collect();
    assert_eq!(
        scenarios,
        [
            "egress_denied_connect",
            "egress_connect",
            "egress_throughput"
        ],
        "{stdout}"
    );
    assert_eq!(lines[0]["refused"], 10, "{}", lines[0]);
    let positive = |v: &serde_json::Value, key: &str| {
        assert!(v[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {v}");
    };
    positive(&lines[0], "p50_us");
    for key in ["direct_p50_us", "proxy_p50_us"] {
        positive(&lines[1], key);
    }
    assert_eq!(lines[1]["samples"], 10, "{}", lines[1]);
    for key in ["direct_mib_s", "proxy_mib_s", "ratio"] {
        positive(&lines[2], key);
    }
    assert_eq!(lines[2]["runs"], 6, "{}", lines[2]);
    // Its network namespace and veth went with it.
    for left in [
        format!("/run/netns/pdkbench-{pid}"),
        format!("/sys/class/net/pdkb{}", pid % 100_000),
    ] {
        assert!(!std::path::Path::new(&left).exists(), "{left}");
    }
}

#[test]
fn a_short_soak_answers_every_execution_once_and_leaves_nothing() {
    // Five seconds of the mixed load; the RSS bound is loose because so short a run
    // measures the allocator's warm-up, not a leak.
    let out = paddock(&[
        "bench",
        "soak",
        "--json",
        "--duration",
        "5s",
        "--warmup",
        "2s",
        "--max-rss-growth-pct",
        "100",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.iter().all(|v| v["scenario"] == "soak"), "{stdout}");
    let v = lines.last().unwrap();
    assert_eq!(v["kind"], "summary", "{v}");
    for (name, ok) in v["pass"].as_object().unwrap() {
        if ok.is_boolean() {
            assert_eq!(ok, true, "{name}: {v}");
        }
    }
    assert!(v["executions"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["lost"], 0, "{v}");
    assert_eq!(v["duplicated"], 0, "{v}");
    assert_eq!(v["audit_entries"], v["accepted"], "{v}");
    assert_eq!(v["unexpected"]["count"], 0, "{v}");
    assert!(
        v["timed_out"].as_u64().unwrap() > 0 && v["cancelled"].as_u64().unwrap() > 0,
        "{v}"
    );
    let engines = v["engines"].as_array().unwrap();
    assert!(
        engines.contains(&"subprocess".into()) && engines.contains(&"isolate".into()),
        "{v}"
    );
}

#[test]
fn a_short_churn_destroys_every_sandbox_it_opened() {
    let out = paddock(&[
        "bench",
        "churn",
        "--json",
        "--engines",
        "subprocess",
        "--duration",
        "1s",
        "--clients",
        "2",
        "--serial-duration",
        "500ms",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let runs: Vec<&str> = lines.iter().map(|v| v["run"].as_str().unwrap()).collect();
    assert_eq!(
        runs,
        ["concurrent", "serial", "serial_quiet", "serial_unpooled"],
        "{stdout}"
    );
    for (v, clients) in lines.iter().zip([2, 1, 1, 1]) {
        assert_eq!(v["scenario"], "churn", "{v}");
        assert_eq!(v["engine"], "subprocess", "{v}");
        assert_eq!(v["clients"], clients, "{v}");
        // The quiet run waits for the pool between cycles: it has no rate.
        if v["run"] != "serial_quiet" {
            assert!(v["rate_per_s"].as_f64().unwrap() > 0.0, "{v}");
        }
        for step in [
            "open",
            "first_command",
            "destroy",
            "open_and_first",
            "cycle",
        ] {
            let p50 = v[step]["p50_ms"].as_f64().unwrap();
            let p99 = v[step]["p99_ms"].as_f64().unwrap();
            assert!(p50 > 0.0 && p50 <= p99, "{step}: {v}");
        }
        // Every sandbox opened was destroyed, and none is left open.
        assert!(v["opened"].as_u64().unwrap() > 0, "{v}");
        assert_eq!(v["opened"], v["destroyed"], "{v}");
        assert_eq!(v["left_open"], 0, "{v}");
        for step in ["open", "first_command", "destroy"] {
            assert_eq!(v["failures"][step], 0, "{v}");
        }
        assert!(
            v["cpu"]["ms_per_sandbox"]["process"].as_f64().unwrap() > 0.0,
            "{v}"
        );
    }
}

#[test]
fn json_carries_output_flags_and_usage() {
    let out = paddock(&[
        "run",
        "--json",
        "--max-output",
        "10",
        "--",
        "sh",
        "-c",
        "echo 0123456789abcdef; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["outcome"], "completed");
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["stdout_truncated"], true);
    assert!(v["stdout"]
        .as_str()
        .unwrap()
        .starts_with("0123456789\n[output truncated at 10 bytes]"));
    assert!(v["usage"]["peak_memory_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn code_from_flag_file_and_stdin() {
    let out = paddock(&["run", "--lang", "python", "--code", "print(6*7)"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42\n");
    assert_eq!(out.status.code(), Some(0));

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prog.js");
    std::fs::write(&file, "console.log([1,2,3].map(x => x * 2).join(','))").unwrap();
    let out = paddock(&[
        "run",
        "--lang",
        "javascript",
        "--file",
        file.to_str().unwrap(),
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "2,4,6\n");

    let mut child = Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args(["run", "--lang", "shell", "--code", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"echo from-stdin")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from-stdin\n");
}

#[test]
fn output_streams_as_it_comes() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args(["run", "--", "sh", "-c", "echo first; sleep 2; echo second"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = [0u8; 6];
    stdout.read_exact(&mut buf).unwrap();
    let first_at = start.elapsed();
    assert_eq!(&buf, b"first\n");
    let status = child.wait().unwrap();
    assert!(status.success());
    assert!(
        start.elapsed() - first_at >= Duration::from_millis(1500),
        "the first line arrived only at the end ({first_at:?})"
    );
}

#[test]
fn bad_flags_exit_2_with_a_message() {
    for args in [
        &["run", "--timeout", "soon", "--", "true"][..],
        &["run", "--memory", "12X", "--", "true"],
        &["run", "--network", "wifi", "--", "true"],
        &["run", "--bogus"],
        &["run"],
        &["run", "--env", "NOEQUALS", "--", "true"],
        &["run", "--lang", "python"],
    ] {
        let out = paddock(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("error"), "{args:?}: {err}");
    }
}

#[test]
fn secrets_stay_out_and_env_flags_go_in() {
    let out = Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args([
            "run",
            "--env",
            "GIVEN=yes",
            "--",
            "sh",
            "-c",
            "echo \"${SECRET_X:-none} ${API_KEY:-none} $GIVEN\"; test -n \"$PATH\"",
        ])
        .env("SECRET_X", "s3cret")
        .env("API_KEY", "k")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "none none yes\n");
    assert!(out.status.success());
}

#[test]
fn missing_program_is_127() {
    let out = paddock(&["run", "--", "definitely-not-a-program"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&out.stderr).contains("SPAWN_FAILED"));
}

#[test]
fn doctor_reports_the_host() {
    let out = paddock(&["doctor", "--json"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["subprocess"]["capabilities"]["programs"].is_array());
    // The cgroup layout the host mounts, as /proc/self/mountinfo has it.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let fstype = |t: &str| {
        mountinfo.lines().any(|l| {
            l.split_once(" - ")
                .is_some_and(|(_, r)| r.split_whitespace().next() == Some(t))
        })
    };
    let v1 = mountinfo.lines().any(|l| {
        l.split_once(" - ").is_some_and(|(_, r)| {
            let mut f = r.split_whitespace();
            f.next() == Some("cgroup")
                && f.nth(1)
                    .is_some_and(|o| o.split(',').any(|o| ["memory", "pids", "cpu"].contains(&o)))
        })
    });
    let expected = match (v1, fstype("cgroup2")) {
        (true, true) => "hybrid",
        (true, false) => "v1",
        (false, true) => "v2",
        (false, false) => "none",
    };
    let sub = &v["subprocess"];
    assert_eq!(sub["cgroup_layout"], expected, "{v}");
    if sub["cgroup"] == "ok" {
        let cg = &sub["cgroups"];
        assert!(!cg["groups"].as_array().unwrap().is_empty(), "{v}");
        assert!(cg["kill"].is_string() && cg["limits"].is_string(), "{v}");
        // cpu_millicores is declared exactly where it is enforced.
        let declared = sub["capabilities"]["limits"]
            .as_array()
            .is_some_and(|l| l.iter().any(|x| x == "cpu_millicores"));
        assert_eq!(
            declared,
            cg["cpu_millicores"].as_str().unwrap().starts_with("ok"),
            "{v}"
        );
    } else {
        assert!(sub["cgroups"].is_null(), "{v}");
    }
    assert_eq!(v["isolate"]["status"], "ok", "{v}");
    assert_eq!(
        v["isolate"]["capabilities"]["max_level"],
        "context-isolated"
    );
    // The container engine: ok with a runtime, or unavailable with a reason and a fix.
    let container = &v["container"];
    let status = container["status"].as_str().unwrap();
    for rt in ["crun", "runc", "runsc"] {
        assert!(container["runtimes"][rt]["status"].is_string(), "{v}");
    }
    // runsc, when it runs here, with its platform (the default, ptrace).
    let runsc = &container["runtimes"]["runsc"];
    if runsc["status"] == "ok" {
        assert_eq!(runsc["runtime"]["kind"], "runsc", "{v}");
        assert_eq!(runsc["runtime"]["platform"], "ptrace", "{v}");
        assert_eq!(runsc["runtime"]["user_namespace"], false, "{v}");
    }
    if status == "ok" {
        assert_eq!(container["capabilities"]["max_level"], "strict", "{v}");
        assert!(["crun", "runc"].contains(&container["runtime"]["kind"].as_str().unwrap()));
        // Containers use v2 only on a pure v2 host.
        let want = if expected == "v2" { "v2" } else { "v1" };
        assert_eq!(container["runtime"]["cgroups"], want, "{v}");
        assert_eq!(container["runtime"]["user_namespace"], true, "{v}");
        assert!(container["runtime"]["platform"].is_null(), "{v}");
    } else {
        assert!(
            std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none(),
            "the container engine must be available here: {v}"
        );
        assert!(status.starts_with("unavailable: "), "{v}");
        assert!(container["fix"].is_string(), "{v}");
    }
}

#[test]
fn a_command_runs_in_a_container() {
    let out = paddock(&[
        "run",
        "--engine",
        "container",
        "--",
        "sh",
        "-c",
        "echo in-container; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; exit 3",
    ]);
    if String::from_utf8_lossy(&out.stderr).contains("container engine cannot start") {
        // No OCI runtime on this host: the engine is refused with why.
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        assert!(
            std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none(),
            "{out:?}"
        );
        return;
    }
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "in-container\nlo\n");
}

#[test]
fn containers_run_with_a_private_temp_dir() {
    use std::os::unix::fs::PermissionsExt;
    // What `mktemp -d` and many service managers give: a directory only its owner
    // may pass through, which the containers' mapped root cannot.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args([
            "run",
            "--engine",
            "container",
            "--",
            "sh",
            "-c",
            "echo in-container",
        ])
        .env("TMPDIR", tmp.path())
        .stdin(Stdio::null())
        .output()
        .expect("paddock runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("`runc` is not installed") && stderr.contains("`crun` is not installed") {
        assert!(
            std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none(),
            "{out:?}"
        );
        return;
    }
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "in-container\n");
    // Nothing of the engine's was left in the private directory, or anywhere
    // the containers could not reach.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}

#[test]
fn javascript_runs_in_an_isolate_with_its_value_printed() {
    let out = paddock(&[
        "run",
        "--engine",
        "isolate",
        "--lang",
        "javascript",
        "--code",
        "console.log('from the isolate'); 6 * 7",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "from the isolate\n42\n"
    );
    let out = paddock(&[
        "run",
        "--engine",
        "isolate",
        "--json",
        "--timeout",
        "200ms",
        "--lang",
        "javascript",
        "--code",
        "while (true) {}",
    ]);
    assert_eq!(out.status.code(), Some(124), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["engine"], "isolate");
    assert_eq!(v["timed_out"], true);
    // Commands are not JavaScript: refused with a typed error.
    let out = paddock(&["run", "--engine", "isolate", "--", "true"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("CAPABILITY_NOT_SUPPORTED"),
        "{out:?}"
    );
}

#[test]
fn interrupt_kills_the_program_and_exits_130() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args(["run", "--", "sh", "-c", "echo started; sleep 30"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = [0u8; 8];
    stdout.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"started\n");
    let start = Instant::now();
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn config_check_names_the_bad_field_and_defaults_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[pool]\nmax_size = 0\n").unwrap();
    let out = paddock(&["config", "check", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("INVALID_CONFIG") && err.contains("pool.max_size"),
        "{err}"
    );

    let defaults = paddock(&["config", "defaults"]);
    assert!(defaults.status.success());
    let good = dir.path().join("good.toml");
    std::fs::write(&good, &defaults.stdout).unwrap();
    let out = paddock(&["config", "check", good.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Cgroup directories under /sys/fs/cgroup (a few levels deep) whose name starts
/// with `prefix`.
fn cgroups_named(prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut walk = vec![(std::path::PathBuf::from("/sys/fs/cgroup"), 0)];
    while let Some((dir, depth)) = walk.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                continue;
            }
            if e.file_name().to_string_lossy().starts_with(prefix) {
                found.push(e.path().display().to_string());
            } else if depth < 4 {
                walk.push((e.path(), depth + 1));
            }
        }
    }
    found
}

#[test]
fn what_a_crashed_paddock_left_in_containers_is_swept_by_the_next() {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("paddock.toml");
    std::fs::write(
        &config,
        format!(
            "[container]\nworkdir_root = \"{}\"\n",
            root.path().display()
        ),
    )
    .unwrap();
    let mut victim = Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args(["run", "--config", config.to_str().unwrap()])
        .args([
            "--engine",
            "container",
            "--timeout",
            "60s",
            "--",
            "sleep",
            "60",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let prefix = format!("paddock-ct-{}-", victim.id());
    // Wait until its container runs.
    let deadline = Instant::now() + Duration::from_secs(20);
    let running = loop {
        let sleeping = std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read_to_string(e.path().join("cgroup")).is_ok_and(|c| c.contains(&prefix))
                && std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "sleep")
        });
        if sleeping {
            break true;
        }
        if Instant::now() > deadline || victim.try_wait().unwrap().is_some() {
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if !running {
        let _ = victim.kill();
        let out = victim.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("engine is not configured") {
            assert!(
                std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none(),
                "{stderr}"
            );
            return;
        }
        panic!("the container never ran: {stderr}");
    }
    // The crash: no destroy, no cleanup.
    victim.kill().unwrap();
    victim.wait().unwrap();
    assert!(
        !cgroups_named(&prefix).is_empty(),
        "the crash left its cgroups"
    );
    // The next Paddock with a container engine sweeps them.
    let out = Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args(["run", "--config", config.to_str().unwrap()])
        .args(["--engine", "container", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(cgroups_named(&prefix), Vec::<String>::new());
    let left: Vec<_> = std::fs::read_dir(root.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(
        left.is_empty(),
        "directories of the crashed engine remain: {left:?}"
    );
    let survivors = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("cgroup")).is_ok_and(|c| c.contains(&prefix))
        })
        .count();
    assert_eq!(
        survivors, 0,
        "processes of the crashed engine's containers survive"
    );
}

/// `PATH` without any directory that holds a `paddock-agent`.
fn path_without_an_agent() -> String {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| !std::path::Path::new(d).join("paddock-agent").exists())
        .collect::<Vec<_>>()
        .join(":")
}

/// The `paddock` binary copied alone into a directory of its own: no
/// `paddock-agent` beside it or one directory up.
fn lone_paddock() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("alone").join("paddock");
    std::fs::create_dir(bin.parent().unwrap()).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_paddock"), &bin).unwrap();
    (dir, bin)
}

#[test]
fn the_binary_alone_carries_its_agent_and_runs_warm_containers() {
    let (_dir, bin) = lone_paddock();
    let lone = |args: &[&str]| {
        Command::new(&bin)
            .args(args)
            .env("PATH", path_without_an_agent())
            .stdin(Stdio::null())
            .output()
            .expect("paddock runs")
    };
    let out = lone(&["doctor", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let container = &v["container"];
    if container["status"] != "ok" {
        assert!(
            std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none(),
            "the container engine must be available here: {v}"
        );
        return;
    }
    let agent = &container["runtime"]["warm_agent"];
    assert_eq!(agent["status"], "ok", "{v}");
    assert_eq!(agent["source"], "embedded", "{v}");
    let text = lone(&["doctor"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("warm containers        : ok (the static agent built into this binary"),
        "{text}"
    );
    // An execution runs in the sandbox's warm container: its pid 1 is the agent.
    let out = lone(&[
        "run",
        "--engine",
        "container",
        "--",
        "cat",
        "/proc/1/cmdline",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "/tmp/.paddock-agent\0",
        "{out:?}"
    );
}

#[test]
fn the_carried_agent_runs_in_a_root_without_a_c_library() {
    use std::os::unix::fs::PermissionsExt;
    // A root with one static program and nothing else: no C library, no loader, no
    // /etc (the engine adds its mount points). The program is also the root's
    // `/bin/sh`, as which it only exits 0: the engine's probe container runs
    // `sh -c 'exit 0'`, and a cold execution (run under the root's shell) would print
    // nothing.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    let source = dir.path().join("pid1.c");
    std::fs::write(
        &source,
        r#"#include <fcntl.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    const char *name = strrchr(argv[0], '/');
    if (strcmp(name ? name + 1 : argv[0], "sh") == 0) return 0;
    char buf[256];
    int fd = open("/proc/1/cmdline", O_RDONLY);
    if (fd < 0) return 2;
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) return 3;
    write(1, "pid 1: ", 7);
    write(1, buf, n);
    return 0;
}
"#,
    )
    .unwrap();
    let cc = Command::new("cc")
        .args(["-static", "-Os", "-o"])
        .arg(root.join("pid1"))
        .arg(&source)
        .output()
        .expect("cc runs (it links Rust programs too)");
    assert!(cc.status.success(), "{cc:?}");
    std::fs::copy(root.join("pid1"), root.join("bin/sh")).unwrap();
    // The containers' root is an unprivileged host user: it must pass through.
    for d in [dir.path(), root.as_path(), root.join("bin").as_path()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let config = dir.path().join("paddock.toml");
    std::fs::write(
        &config,
        format!("[container]\nrootfs = {:?}\n", root.to_str().unwrap()),
    )
    .unwrap();
    let (_bin_dir, bin) = lone_paddock();
    let out = Command::new(&bin)
        .args(["run", "--config", config.to_str().unwrap()])
        .args(["--engine", "container", "--", "/pid1"])
        .env("PATH", path_without_an_agent())
        .stdin(Stdio::null())
        .output()
        .expect("paddock runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("`runc` is not installed") && stderr.contains("`crun` is not installed") {
        assert!(
            std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none(),
            "{out:?}"
        );
        return;
    }
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // It ran through the agent, pid 1 of the warm container in that root.
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "pid 1: /tmp/.paddock-agent\0",
        "{out:?}"
    );
    let mut left: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    // Nothing but the program and the engine's mount points: no C library came in.
    let expected = [
        "bin",
        "dev",
        "pid1",
        "proc",
        "run",
        "sys",
        "tmp",
        "workspace",
    ];
    assert!(
        left.iter().all(|n| expected.contains(&n.as_str())),
        "{left:?}"
    );
}
