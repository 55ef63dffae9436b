use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use paddock_core::{
    CancelToken, DiscardSink, Engine, ErrorCode, ExecRequest, ExecResult, Language, LimitKind,
    Limits, NetworkPolicy, Outcome, OutputChunk, OutputSink, Program, Sandbox, SandboxSpec,
};
use paddock_engines::subprocess::SubprocessEngine;
use paddock_engines::SubprocessConfig;

fn engine() -> SubprocessEngine {
    SubprocessEngine::new(&SubprocessConfig::default()).expect("engine starts")
}

async fn sandbox(spec: SandboxSpec) -> Arc<dyn Sandbox> {
    engine().create(&spec).await.expect("sandbox opens")
}

async fn run(sb: &dyn Sandbox, req: ExecRequest) -> ExecResult {
    sb.exec(req, &DiscardSink, CancelToken::new())
        .await
        .expect("exec runs")
}

fn sh(script: &str) -> ExecRequest {
    ExecRequest::new(Program::command(["sh", "-c", script]))
}

#[derive(Default)]
struct Collect(Mutex<Vec<(Instant, OutputChunk)>>);

#[async_trait::async_trait]
impl OutputSink for Collect {
    async fn chunk(&self, chunk: OutputChunk) -> paddock_core::Result<()> {
        self.0.lock().unwrap().push((Instant::now(), chunk));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_commands_and_code_in_every_language() {
    let sb = sandbox(SandboxSpec::default()).await;
    let r = run(&*sb, sh("echo out; echo err >&2; exit 3")).await;
    assert_eq!(
        r.outcome,
        Outcome::Completed {
            exit_code: 3,
            signal: None
        }
    );
    assert_eq!(r.stdout, "out\n");
    assert_eq!(r.stderr, "err\n");
    for (lang, src) in [
        (Language::Python, "import sys; print(6*7); sys.exit(0)"),
        (Language::Javascript, "console.log(6*7)"),
        (Language::Shell, "echo $((6*7))"),
    ] {
        let r = run(&*sb, ExecRequest::new(Program::code(lang, src))).await;
        assert!(r.is_success(), "{lang}: {r:?}");
        assert_eq!(r.stdout.trim(), "42", "{lang}");
    }
    // A source longer than one argument may be goes through a file.
    let long = format!("x = 0\n{}print(x)\n", "x += 1\n".repeat(30_000));
    let r = run(
        &*sb,
        ExecRequest::new(Program::code(Language::Python, long)),
    )
    .await;
    assert_eq!(r.stdout.trim(), "30000", "{r:?}");
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_cwd_env_and_usage() {
    let sb = sandbox(SandboxSpec::default()).await;
    sb.write_file("sub/dir/keep", b"").await.unwrap();
    let mut req = sh("cat; pwd; echo \"$GREETING\"; echo \"home=$HOME\"");
    req.stdin = Some("from stdin\n".into());
    req.cwd = Some("sub/dir".into());
    req.env.insert("GREETING".into(), "hello".into());
    let r = run(&*sb, req).await;
    let root = sb.host_dir().to_string_lossy().into_owned();
    assert_eq!(
        r.stdout,
        format!("from stdin\n{root}/sub/dir\nhello\nhome={root}\n")
    );
    let mut bad = sh("true");
    bad.cwd = Some("../..".into());
    assert_eq!(
        sb.exec(bad, &DiscardSink, CancelToken::new())
            .await
            .unwrap_err()
            .code,
        ErrorCode::PathEscape
    );
    // CPU time and peak memory are measured.
    let r = run(
        &*sb,
        ExecRequest::new(Program::code(
            Language::Python,
            "b = bytearray(64 << 20)\nx = 0\nfor i in range(3_000_000): x += i\n",
        )),
    )
    .await;
    assert!(r.is_success(), "{r:?}");
    assert!(r.usage.cpu_ms > 0, "{:?}", r.usage);
    assert!(r.usage.peak_memory_bytes >= 64 << 20, "{:?}", r.usage);
    assert!(r.usage.wall_ms > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_program_is_spawn_failed() {
    let sb = sandbox(SandboxSpec::default()).await;
    let e = sb
        .exec(
            ExecRequest::new(Program::command(["no-such-binary-xyz"])),
            &DiscardSink,
            CancelToken::new(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::SpawnFailed);
    assert!(e.message.contains("no-such-binary-xyz"), "{}", e.message);
    // A directory is not executable either.
    sb.write_file("d/f", b"").await.unwrap();
    let e = sb
        .exec(
            ExecRequest::new(Program::command(["./d"])),
            &DiscardSink,
            CancelToken::new(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::SpawnFailed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_is_live() {
    let sb = sandbox(SandboxSpec::default()).await;
    let sink = Collect::default();
    let start = Instant::now();
    let r = sb
        .exec(
            sh("echo first; sleep 1; echo second"),
            &sink,
            CancelToken::new(),
        )
        .await
        .unwrap();
    let done = Instant::now();
    assert!(r.is_success());
    let chunks = sink.0.lock().unwrap();
    let first = chunks.first().expect("a chunk arrived");
    assert_eq!(first.1.data, b"first\n");
    assert!(
        done - first.0 >= Duration::from_millis(700),
        "first chunk came late: {:?} after start, exec took {:?}",
        first.0 - start,
        done - start
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_and_cancel_kill_the_whole_tree() {
    let sb = sandbox(SandboxSpec::default()).await;
    let root = sb.host_dir().to_path_buf();
    // A TERM-trapping child and a setsid'd daemon, each writing a marker later.
    let script = "trap '' TERM; (trap '' TERM; sleep 1.5; touch child_marker) & setsid sh -c 'sleep 1.5; touch daemon_marker' & sleep 30";
    let start = Instant::now();
    let r = run(&*sb, sh(script).with_timeout_ms(400)).await;
    assert_eq!(r.outcome, Outcome::TimedOut);
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );

    let cancel = CancelToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        c2.cancel();
    });
    let r = sb.exec(sh(script), &DiscardSink, cancel).await.unwrap();
    assert_eq!(r.outcome, Outcome::Cancelled);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(
        !root.join("child_marker").exists(),
        "a TERM-trapping child survived"
    );
    let has_cgroup = engine().capabilities().has_feature("cgroup");
    if has_cgroup {
        assert!(
            !root.join("daemon_marker").exists(),
            "a setsid daemon survived"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_children_do_not_outlive_the_execution() {
    let sb = sandbox(SandboxSpec::default()).await;
    let r = run(
        &*sb,
        sh("(sleep 1; touch late) & setsid sh -c 'sleep 1; touch late2' & echo started"),
    )
    .await;
    assert!(r.is_success(), "{r:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!sb.host_dir().join("late").exists());
    if engine().capabilities().has_feature("cgroup") {
        assert!(!sb.host_dir().join("late2").exists());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_cap_bounds_a_flood() {
    let sb = sandbox(SandboxSpec::default()).await;
    let mut req = sh("head -c 200000000 /dev/zero");
    req.limits.max_output_bytes = Some(4096);
    let r = run(&*sb, req).await;
    assert!(r.is_success(), "{:?}", r.outcome);
    assert!(r.stdout_truncated);
    assert!(r.stdout.len() < 4096 + 64, "{}", r.stdout.len());
    assert!(r.stdout.ends_with("[output truncated at 4096 bytes]\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_enforced_and_typed() {
    let e = engine();
    let sb = e.create(&SandboxSpec::default()).await.unwrap();
    let cpu = run(
        &*sb,
        ExecRequest {
            limits: Limits {
                cpu_ms: Some(1000),
                ..Limits::default()
            },
            ..ExecRequest::new(Program::code(Language::Python, "while True: pass"))
        },
    )
    .await;
    assert_eq!(
        cpu.outcome,
        Outcome::LimitExceeded {
            limit: LimitKind::Cpu
        },
        "{cpu:?}"
    );

    let fsize = run(
        &*sb,
        ExecRequest {
            limits: Limits {
                file_size_bytes: Some(1 << 20),
                ..Limits::default()
            },
            ..sh("exec head -c 5000000 /dev/zero > big")
        },
    )
    .await;
    assert_eq!(
        fsize.outcome,
        Outcome::LimitExceeded {
            limit: LimitKind::FileSize
        },
        "{fsize:?}"
    );

    if e.capabilities().has_feature("cgroup") {
        let mem = run(
            &*sb,
            ExecRequest {
                limits: Limits {
                    memory_bytes: Some(64 << 20),
                    ..Limits::default()
                },
                ..ExecRequest::new(Program::code(
                    Language::Python,
                    "b = []\nwhile True: b.append(bytearray(8 << 20))",
                ))
            },
        )
        .await;
        assert_eq!(
            mem.outcome,
            Outcome::LimitExceeded {
                limit: LimitKind::Memory
            },
            "{mem:?}"
        );
        assert_eq!(mem.outcome.error_code(), Some(ErrorCode::MemoryExceeded));

        let pids = run(
            &*sb,
            ExecRequest {
                limits: Limits {
                    pids: Some(8),
                    ..Limits::default()
                },
                ..sh("for i in $(seq 1 20); do sleep 2 & done; wait")
            },
        )
        .await;
        assert!(
            !pids.warnings.is_empty(),
            "pids limit did not bind: {pids:?}"
        );
        assert!(
            pids.stderr.contains("fork") || pids.stderr.contains("Resource"),
            "{}",
            pids.stderr
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_limit_below_what_the_sandbox_holds_is_the_requests_to_fix() {
    let e = engine();
    if !e.capabilities().has_feature("cgroup") {
        return;
    }
    let sb = e.create(&SandboxSpec::default()).await.unwrap();
    // A background process holds some 8 MB in the sandbox's group.
    let p = sb
        .start_process(paddock_core::ProcessSpec::new([
            "sh",
            "-c",
            "x=$(head -c 8000000 /dev/zero | tr '\\0' a); echo held; sleep 30",
        ]))
        .await
        .unwrap();
    let mut out = p.output();
    let chunk = tokio::time::timeout(Duration::from_secs(10), out.next())
        .await
        .expect("the process holds its memory")
        .expect("output");
    assert_eq!(chunk.data, b"held\n");
    let small = ExecRequest {
        limits: Limits {
            memory_bytes: Some(1 << 20),
            ..Limits::default()
        },
        ..sh("true")
    };
    // The kernel refuses a limit below the group's usage (EBUSY) unless it can swap
    // the rest out: either way the answer is never an engine failure.
    match sb.exec(small, &DiscardSink, CancelToken::new()).await {
        Ok(_) => {}
        Err(err) => {
            assert_eq!(err.code, ErrorCode::InvalidOptions, "{err}");
            assert!(err.message.contains("limits.memory_bytes"), "{err}");
        }
    }
    // And the sandbox runs on with its own limits.
    let r = run(&*sb, sh("echo fine")).await;
    assert_eq!(r.stdout, "fine\n", "{r:?}");
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_none_has_no_route_to_the_host() {
    let e = engine();
    if !e.capabilities().network.contains("none") {
        eprintln!("skipped: {:?}", e.host_support().netns);
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let probe = format!(
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('connected')\nexcept OSError as e:\n    print('refused', e.errno)\n"
    );
    let isolated = e.create(&SandboxSpec::default()).await.unwrap();
    let r = run(
        &*isolated,
        ExecRequest::new(Program::code(Language::Python, probe.clone())),
    )
    .await;
    assert!(r.stdout.starts_with("refused"), "{r:?}");
    let open = e
        .create(&SandboxSpec {
            network: NetworkPolicy::Unrestricted,
            ..SandboxSpec::default()
        })
        .await
        .unwrap();
    let r = run(
        &*open,
        ExecRequest::new(Program::code(Language::Python, probe.clone())),
    )
    .await;
    assert_eq!(r.stdout.trim(), "connected", "{r:?}");
    // An allowlist may not name the host's loopback as an address...
    let refused = e
        .create(&SandboxSpec {
            network: NetworkPolicy::Allowlist {
                hosts: vec!["localhost".into(), "127.0.0.1".into()],
                ports: vec![port],
            },
            ..SandboxSpec::default()
        })
        .await
        .map(drop)
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::InvalidOptions, "{refused}");
    assert!(refused.message.contains("loopback"), "{refused}");
    // ...and has a loopback of its own, even one that names localhost: the host's
    // listener is out of reach.
    let listed = e
        .create(&SandboxSpec {
            network: NetworkPolicy::Allowlist {
                hosts: vec!["localhost".into()],
                ports: vec![port],
            },
            ..SandboxSpec::default()
        })
        .await;
    match listed {
        Ok(sb) => {
            let r = run(
                &*sb,
                ExecRequest::new(Program::code(Language::Python, probe)),
            )
            .await;
            assert!(r.stdout.starts_with("refused"), "{r:?}");
        }
        Err(e2) => {
            assert!(!e.capabilities().network.contains("allowlist"), "{e2}");
            assert_eq!(e2.code, ErrorCode::CapabilityNotSupported);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_kills_a_running_execution_and_cleans_up() {
    let sb = sandbox(SandboxSpec::default()).await;
    let root = sb.host_dir().to_path_buf();
    let sb2 = sb.clone();
    let running = tokio::spawn(async move {
        sb2.exec(sh("sleep 30"), &DiscardSink, CancelToken::new())
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = Instant::now();
    sb.destroy().await.unwrap();
    let r = running.await.unwrap().unwrap();
    assert_eq!(r.outcome, Outcome::Cancelled);
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(!root.exists(), "workdir left behind");
}

#[tokio::test(flavor = "current_thread")]
async fn works_on_a_current_thread_runtime() {
    let sb = sandbox(SandboxSpec::default()).await;
    sb.write_file("f", b"x").await.unwrap();
    let r = run(&*sb, sh("cat f")).await;
    assert_eq!(r.stdout, "x");
    sb.destroy().await.unwrap();
}

fn alive(pid: u32) -> bool {
    // A zombie still has a /proc entry: look at its state.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let state = s.rsplit(')').next().unwrap_or("").split_whitespace().next();
            state != Some("Z") && state != Some("X")
        })
        .unwrap_or(false)
}

async fn gone_within(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    !alive(pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_processs_tree_dies_with_it() {
    let sb = sandbox(SandboxSpec::default()).await;
    // The shell backgrounds one grandchild in its group and one in a session of its
    // own (out of the group's reach: only the cgroup holds it), reports their pids,
    // and exits.
    let p = sb
        .start_process(paddock_core::ProcessSpec::new([
            "sh",
            "-c",
            "sleep 30 & echo $!; setsid sh -c 'echo $$; exec sleep 30' & sleep 0.3; exit 0",
        ]))
        .await
        .unwrap();
    let mut out = p.output();
    let mut text = Vec::new();
    while text.iter().filter(|b| **b == b'\n').count() < 2 {
        let chunk = tokio::time::timeout(Duration::from_secs(10), out.next())
            .await
            .expect("the pids arrive")
            .expect("output");
        text.extend_from_slice(&chunk.data);
    }
    let pids: Vec<u32> = String::from_utf8_lossy(&text)
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "{text:?}");
    let exit = tokio::time::timeout(Duration::from_secs(10), p.wait())
        .await
        .expect("the shell exits");
    assert_eq!(exit.exit_code, 0);
    for pid in pids {
        assert!(
            gone_within(pid, Duration::from_secs(5)).await,
            "a backgrounded `sleep 30` (pid {pid}) outlived its process"
        );
    }
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_are_capped_per_sandbox_and_recycle_ends_them() {
    let sb = sandbox(SandboxSpec::default()).await;
    let mut running = Vec::new();
    for _ in 0..64 {
        running.push(
            sb.start_process(paddock_core::ProcessSpec::new(["sleep", "30"]))
                .await
                .unwrap(),
        );
    }
    let refused = sb
        .start_process(paddock_core::ProcessSpec::new(["sleep", "30"]))
        .await
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::LimitsExceeded, "{refused}");
    // One ends: there is room again.
    running[0].kill().unwrap();
    running[0].wait().await;
    running.push(
        sb.start_process(paddock_core::ProcessSpec::new(["sleep", "30"]))
            .await
            .expect("room after one ended"),
    );
    // Recycling (another lease) ends every one and waits for them.
    sb.recycle().await.unwrap();
    for p in &running {
        let exit = p.try_wait().expect("recycle waited for every process");
        assert!(
            exit.signal == Some(9) || p.pid() == running[0].pid(),
            "{exit:?}"
        );
        // The pid may already belong to another test's process: only one running
        // from this sandbox's workdir would be a survivor.
        let pid = p.pid().unwrap();
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default();
        assert!(
            !(alive(pid) && cwd.starts_with(sb.host_dir())),
            "pid {:?} survived recycle",
            p.pid()
        );
    }
    // The sandbox still works after recycle.
    let p = sb
        .start_process(paddock_core::ProcessSpec::new(["true"]))
        .await
        .unwrap();
    assert_eq!(p.wait().await.exit_code, 0);
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_have_separate_loopbacks() {
    let e = engine();
    if !e.capabilities().network.contains("none") {
        eprintln!("skipped: {:?}", e.host_support().netns);
        return;
    }
    let a = e.create(&SandboxSpec::default()).await.unwrap();
    let b = e.create(&SandboxSpec::default()).await.unwrap();
    let listener = a
        .start_process(paddock_core::ProcessSpec::new([
            "python3",
            "-c",
            "import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',0))\ns.listen()\nprint(s.getsockname()[1],flush=True)\ntime.sleep(30)",
        ]))
        .await
        .unwrap();
    let mut out = listener.output();
    let mut text = Vec::new();
    while !text.ends_with(b"\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), out.next())
            .await
            .expect("the port arrives")
            .expect("output");
        text.extend_from_slice(&chunk.data);
    }
    let port: u16 = String::from_utf8_lossy(&text).trim().parse().unwrap();
    assert!(a
        .open_tcp_connection(paddock_core::TcpTarget::loopback(port))
        .await
        .is_ok());
    // The other sandbox's loopback does not have it.
    let e2 = b
        .open_tcp_connection(paddock_core::TcpTarget::loopback(port))
        .await
        .unwrap_err();
    assert_eq!(e2.code, ErrorCode::NotFound, "{e2}");
    a.destroy().await.unwrap();
    b.destroy().await.unwrap();
}

/// Everything a background process prints, until it ends.
async fn process_output(p: &paddock_core::ProcessHandle) -> String {
    let mut out = p.output();
    let mut text = Vec::new();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(10), out.next())
        .await
        .expect("the process's output arrives")
    {
        text.extend_from_slice(&chunk.data);
    }
    String::from_utf8_lossy(&text).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cwd_is_resolved_beneath_the_workdir() {
    let sb = sandbox(SandboxSpec::default()).await;
    let root = sb.host_dir().to_path_buf();
    sb.write_file("sub/dir/keep", b"").await.unwrap();
    // A symlink to the host's root, one planted by a program, and a symlinked parent.
    std::os::unix::fs::symlink("/", root.join("esc")).unwrap();
    let r = run(&*sb, sh("ln -s / made-esc && ln -s ../.. sub/up")).await;
    assert!(r.is_success(), "{r:?}");
    let in_dir = |cwd: &str| {
        let mut req = sh("pwd; echo \"$PWD\"");
        req.cwd = Some(cwd.to_string());
        req
    };
    let sub_dir = root.join("sub/dir").display().to_string();
    for cwd in ["sub/dir", "./sub/dir/", sub_dir.as_str()] {
        let r = run(&*sb, in_dir(cwd)).await;
        assert_eq!(r.stdout, format!("{sub_dir}\n{sub_dir}\n"), "{cwd}: {r:?}");
    }
    for cwd in [
        "esc",
        "esc/tmp",
        "made-esc",
        "sub/up",
        "sub/up/etc",
        "../..",
        "/tmp",
    ] {
        let e = sb
            .exec(in_dir(cwd), &DiscardSink, CancelToken::new())
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::PathEscape, "{cwd}: {e}");
    }
    let e = sb
        .exec(in_dir("sub/missing"), &DiscardSink, CancelToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidOptions, "{e}");
    assert!(e.message.contains("`sub/missing`"), "{e}");
    let e = sb
        .exec(in_dir("sub/dir/keep"), &DiscardSink, CancelToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidOptions, "{e}");

    // Background processes and terminals get the same check.
    let mut spec = paddock_core::ProcessSpec::new(["pwd"]);
    spec.cwd = Some("sub/dir".into());
    let p = sb.start_process(spec.clone()).await.unwrap();
    assert_eq!(process_output(&p).await, format!("{sub_dir}\n"));
    spec.cwd = Some("esc".into());
    let e = sb.start_process(spec).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::PathEscape, "{e}");
    let mut term = paddock_core::TerminalSpec::new("sh", Vec::<String>::new());
    term.cwd = Some("made-esc".into());
    let e = sb.open_terminal(term).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::PathEscape, "{e}");
    sb.destroy().await.unwrap();
}

/// A busy loop that runs for `wall_ms` of wall-clock time (spinning, counting).
fn busy_for(wall_ms: u64, limits: Limits) -> ExecRequest {
    ExecRequest {
        limits,
        ..ExecRequest::new(Program::code(
            Language::Python,
            format!(
                "import time\nend = time.monotonic() + {wall_ms} / 1000\nn = 0\nwhile time.monotonic() < end:\n    n += 1\nprint(n)"
            ),
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_millicores_bounds_the_cpu_a_busy_loop_gets() {
    let e = engine();
    if !e.capabilities().enforces("cpu_millicores") {
        // No CPU controller: the engine refuses the limit rather than ignore it.
        assert!(e
            .host_support()
            .cgroups
            .as_ref()
            .is_none_or(|c| c.cpu.is_err()));
        let sb = e.create(&SandboxSpec::default()).await.unwrap();
        let limits = Limits {
            cpu_millicores: Some(200),
            ..Limits::default()
        };
        let err = sb
            .exec(busy_for(10, limits), &DiscardSink, CancelToken::new())
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::CapabilityNotSupported);
        eprintln!("skipped: {:?}", e.host_support().cgroups);
        return;
    }
    let sb = e.create(&SandboxSpec::default()).await.unwrap();
    let free = run(&*sb, busy_for(1000, Limits::default())).await;
    let capped = run(
        &*sb,
        busy_for(
            1000,
            Limits {
                cpu_millicores: Some(200),
                ..Limits::default()
            },
        ),
    )
    .await;
    // And the cap goes away again for a request without it.
    let free_again = run(&*sb, busy_for(1000, Limits::default())).await;
    for r in [&free, &capped, &free_again] {
        assert_eq!(
            r.outcome,
            Outcome::Completed {
                exit_code: 0,
                signal: None
            },
            "{r:?}"
        );
    }
    let share = |r: &ExecResult| r.usage.cpu_ms as f64 / r.usage.wall_ms.max(1) as f64;
    let (f, c, f2) = (share(&free), share(&capped), share(&free_again));
    // 200 millicores: a fifth of a core. Unlimited on a shared 2-core host, the loop
    // still gets well over that; generous bounds, no absolute timing.
    eprintln!("cpu share: free {f}, capped {c}, free again {f2}");
    assert!(c < 0.35, "capped share {c} (free {f}, {f2})");
    assert!(f > c * 1.5 && f2 > c * 1.5, "free {f}, {f2} vs capped {c}");
    // The loop counted less for having less CPU.
    let count = |r: &ExecResult| r.stdout.trim().parse::<u64>().unwrap_or(0);
    assert!(count(&capped) < count(&free).max(count(&free_again)));
}

/// A sandbox whose workdir its programs see at `/home/user`, E2B's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_with_a_home_sees_its_workdir_there() {
    let sb = sandbox(SandboxSpec {
        home: Some("/home/user".into()),
        ..SandboxSpec::default()
    })
    .await;
    assert_eq!(sb.root_dir(), std::path::Path::new("/home/user"));
    let host = sb.host_dir().to_path_buf();
    assert_ne!(host, sb.root_dir(), "the host keeps its own path");
    sb.write_file("/home/user/a.txt", b"from the files API")
        .await
        .unwrap();
    let r = run(
        &*sb,
        sh("pwd; echo $HOME; cat /home/user/a.txt; echo; echo made > /home/user/b.txt; ls -A /home"),
    )
    .await;
    assert_eq!(r.exit_code(), Some(0), "{r:?}");
    assert_eq!(
        r.stdout, "/home/user\n/home/user\nfrom the files API\nuser\n",
        "the host's other home directories are not seen"
    );
    assert_eq!(sb.read_file("b.txt").await.unwrap(), b"made\n");
    assert_eq!(std::fs::read(host.join("b.txt")).unwrap(), b"made\n");
    let listed = sb.list_files("/home/user").await.unwrap();
    assert!(
        listed.iter().any(|e| e.path == "/home/user/b.txt"),
        "{listed:?}"
    );
    // A working directory below the home, named as the program sees it.
    run(&*sb, sh("mkdir -p /home/user/sub")).await;
    let mut req = sh("pwd; echo $PWD");
    req.cwd = Some("/home/user/sub".into());
    assert_eq!(
        run(&*sb, req).await.stdout,
        "/home/user/sub\n/home/user/sub\n"
    );
    // Code, and a background process, see it too.
    let py = run(
        &*sb,
        ExecRequest::new(Program::code(
            Language::Python,
            "print(open('/home/user/a.txt').read())",
        )),
    )
    .await;
    assert_eq!(py.stdout, "from the files API\n", "{py:?}");
    let p = sb
        .start_process(paddock_core::ProcessSpec::new(["sh", "-c", "pwd"]))
        .await
        .unwrap();
    let mut out = p.output();
    let mut text = Vec::new();
    while let Some(c) = out.next().await {
        text.extend_from_slice(&c.data);
    }
    assert_eq!(text, b"/home/user\n");
    // The host's own view is untouched.
    assert!(!std::path::Path::new("/home/user/a.txt").exists());
    sb.destroy().await.unwrap();
    assert!(!host.exists(), "the workdir is removed at destroy");
}

#[tokio::test]
async fn a_home_the_engine_cannot_take_is_refused() {
    for bad in ["home/user", "/usr/local", "/home"] {
        let e = engine()
            .create(&SandboxSpec {
                home: Some(bad.into()),
                ..SandboxSpec::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidOptions, "{bad}: {e}");
    }
}

#[tokio::test]
async fn a_home_that_would_hide_the_engines_own_files_is_refused() {
    if !std::path::Path::new("/home").is_dir() {
        return;
    }
    let root = tempfile::tempdir_in("/home").unwrap();
    let engine = SubprocessEngine::new(&SubprocessConfig {
        workdir_root: Some(root.path().to_path_buf()),
        ..SubprocessConfig::default()
    })
    .unwrap();
    let e = engine
        .create(&SandboxSpec {
            home: Some("/home/user".into()),
            ..SandboxSpec::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::CapabilityNotSupported, "{e}");
    assert!(e.message.contains("workdir_root"), "{e}");
    // Elsewhere it is fine.
    let sb = engine
        .create(&SandboxSpec {
            home: Some("/srv/sandbox".into()),
            ..SandboxSpec::default()
        })
        .await;
    if std::path::Path::new("/srv").is_dir() {
        sb.unwrap().destroy().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_validates_a_plain_request_and_exec_valid_trusts_its_proof() {
    use paddock_core::{ValidRequest, ValidationProbe};
    let sb = sandbox(SandboxSpec::default()).await;
    let r = sh("echo hi");
    let probe = ValidationProbe::watch(&r.id);
    assert_eq!(run(&*sb, r).await.stdout, "hi\n");
    assert_eq!(probe.count(), 1, "a direct caller's request is validated");

    let r = sh("echo hi");
    let probe = ValidationProbe::watch(&r.id);
    let valid = ValidRequest::new(r).unwrap();
    let out = sb
        .exec_valid(valid, &DiscardSink, CancelToken::new())
        .await
        .unwrap();
    assert_eq!(out.stdout, "hi\n");
    assert_eq!(probe.count(), 1, "the proof's validation, and no other");

    let mut wrong = sh("true");
    wrong.env.insert("A=B".into(), "x".into());
    let e = sb
        .exec(wrong, &DiscardSink, CancelToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidOptions);
    sb.destroy().await.unwrap();
}
