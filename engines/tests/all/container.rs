//! The container engine on the real OCI runtime of this host.
//!
//! Every test needs crun or runc (`.ci/run` installs both, and runsc for the gVisor
//! test); without one the tests say so and pass, since there is nothing to run them
//! on, unless `PADDOCK_REQUIRE_CONTAINERS` is set (as `.ci/run` does).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_core::{
    CancelToken, DiscardSink, Engine, ErrorCode, ExecRequest, ExecResult, Language, LimitKind,
    Limits, Outcome, Program, Sandbox, SandboxSpec,
};
use paddock_engines::container::{ContainerEngine, RuntimeKind};
use paddock_engines::{ContainerConfig, OciRuntime};

fn engine_with(runtime: OciRuntime) -> Option<ContainerEngine> {
    engine_of(&ContainerConfig {
        runtime,
        ..ContainerConfig::default()
    })
}

/// The engine of `config` with its warm containers' agent, or `None` (the test
/// skips) where the host cannot give them.
fn engine_with_agent(config: &ContainerConfig) -> Option<ContainerEngine> {
    let engine = engine_of(config)?;
    if let Err(why) = engine.agent() {
        assert!(
            std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none(),
            "the agent must be found here: {why}"
        );
        eprintln!("skipped: {why}");
        return None;
    }
    Some(engine)
}

fn engine_of(config: &ContainerConfig) -> Option<ContainerEngine> {
    match ContainerEngine::new(config) {
        Ok(e) => Some(e),
        Err(e) if std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_some() => {
            panic!("the container engine must start here: {e}")
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

async fn sandbox(engine: &ContainerEngine) -> Arc<dyn Sandbox> {
    engine
        .create(&SandboxSpec::default())
        .await
        .expect("sandbox opens")
}

async fn run(sb: &dyn Sandbox, req: ExecRequest) -> ExecResult {
    sb.exec(req, &DiscardSink, CancelToken::new())
        .await
        .expect("exec runs")
}

fn sh(script: &str) -> ExecRequest {
    ExecRequest::new(Program::command(["sh", "-c", script])).with_timeout_ms(20_000)
}

/// Python allocating 8 MiB at a time without end, under a 64 MiB limit.
fn memory_bomb() -> ExecRequest {
    let mut bomb = ExecRequest::new(Program::code(
        Language::Python,
        "b = []\nwhile True: b.append(bytearray(8 << 20))",
    ));
    bomb.limits = Limits {
        memory_bytes: Some(64 << 20),
        timeout_ms: Some(30_000),
        ..Limits::default()
    };
    bomb
}

fn exit(code: i32) -> Outcome {
    Outcome::Completed {
        exit_code: code,
        signal: None,
    }
}

/// Directories, cgroups and mounts an engine may leave behind, by name.
fn leftovers(engine_root_prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut walk = vec![PathBuf::from("/sys/fs/cgroup")];
    while let Some(dir) = walk.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(engine_root_prefix) {
                    found.push(e.path().display().to_string());
                } else if dir.components().count() < 8 {
                    walk.push(e.path());
                }
            }
        }
    }
    if let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") {
        found.extend(
            mounts
                .lines()
                .filter(|l| l.contains(engine_root_prefix))
                .map(String::from),
        );
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_commands_and_code_in_a_container() {
    let Some(engine) = engine_with(OciRuntime::Auto) else {
        return;
    };
    let info = engine.runtime_info();
    assert!(!info.version.is_empty(), "{info:?}");
    let sb = sandbox(&engine).await;
    let r = run(&*sb, sh("echo out; echo err >&2; exit 7")).await;
    assert_eq!(r.outcome, exit(7), "{r:?}");
    assert_eq!(r.stdout, "out\n");
    assert_eq!(r.stderr, "err\n");
    assert_eq!(r.engine, paddock_core::EngineName::CONTAINER);

    // stdin, env and cwd reach the program; the workdir is /workspace.
    sb.write_file("sub/in.txt", b"from a file").await.unwrap();
    let mut req = sh("read line; echo \"$line $GREETING $(pwd) $(cat in.txt)\"");
    req.stdin = Some("from-stdin\n".into());
    req.env.insert("GREETING".into(), "hello".into());
    req.cwd = Some("sub".into());
    let r = run(&*sb, req).await;
    assert_eq!(
        r.stdout, "from-stdin hello /workspace/sub from a file\n",
        "{r:?}"
    );
    // What the program writes in /workspace is the sandbox's file.
    let r = run(&*sb, sh("echo made-inside > /workspace/made.txt")).await;
    assert_eq!(r.outcome, exit(0), "{r:?}");
    assert_eq!(sb.read_file("made.txt").await.unwrap(), b"made-inside\n");

    let r = run(
        &*sb,
        ExecRequest::new(Program::code(Language::Python, "print(6 * 7)")),
    )
    .await;
    assert_eq!(r.stdout, "42\n", "{r:?}");
    // The host's environment does not leak in.
    std::env::set_var("PADDOCK_TEST_SECRET_TOKEN", "leak");
    let r = run(&*sb, sh("env")).await;
    assert!(!r.stdout.contains("leak"), "{}", r.stdout);
    assert!(r.stdout.contains("HOME=/workspace"), "{}", r.stdout);
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_container_is_isolated_and_read_only() {
    let Some(engine) = engine_with(OciRuntime::Auto) else {
        return;
    };
    let sb = sandbox(&engine).await;
    // Only loopback: /proc/net/dev lists two header lines and `lo`.
    let r = run(
        &*sb,
        sh("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"),
    )
    .await;
    assert_eq!(r.stdout, "lo\n", "{r:?}");
    // Its own pid namespace: pid 1 is the container's init (the agent of the warm
    // container, or the init shell), and no host process is visible.
    let r = run(
        &*sb,
        sh("tr '\\0' ' ' < /proc/1/cmdline; echo; ls /proc | grep -c '^[0-9]'"),
    )
    .await;
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(
        lines[0].contains("paddock-agent") || lines[0].contains("paddock-init"),
        "{r:?}"
    );
    // (The agent, the warm Python and Node runners it started ahead of need, and
    // the shell's own pipeline: a few, never the host's hundreds.)
    let visible: u32 = lines[1].parse().unwrap();
    assert!(visible <= 8, "{r:?}");
    // The root and the bound /usr are read-only; /tmp is writable.
    let r = run(
        &*sb,
        sh("touch /usr/x 2>/dev/null || echo ro-usr; touch /x 2>/dev/null || echo ro-root; touch /tmp/x && echo rw-tmp"),
    )
    .await;
    assert_eq!(r.stdout, "ro-usr\nro-root\nrw-tmp\n", "{r:?}");
    // /dev holds the devices and at most 1 MiB of anything else.
    let r = run(
        &*sb,
        sh("dd if=/dev/zero of=/dev/fill bs=1024 count=2048 2>/dev/null; wc -c < /dev/fill; rm -f /dev/fill"),
    )
    .await;
    let stored: u64 = r.stdout.trim().parse().unwrap_or(u64::MAX);
    assert!(stored <= 1 << 20, "{r:?}");
    // The seccomp profile and the dropped capabilities refuse namespace changes.
    let r = run(
        &*sb,
        sh("unshare -n true 2>&1; echo rc=$?; unshare -U true 2>&1; echo rc=$?"),
    )
    .await;
    assert!(r.stdout.contains("rc=1"), "{r:?}");
    assert!(!r.stdout.contains("rc=0"), "{r:?}");
    // No new privileges, and a minimal capability set.
    let r = run(&*sb, sh("grep -E '^(NoNewPrivs|CapEff)' /proc/self/status")).await;
    assert!(r.stdout.contains("NoNewPrivs:\t1"), "{r:?}");
    assert!(!r.stdout.contains("CapEff:\t000001ffffffffff"), "{r:?}");
    // Host files are masked or absent.
    let r = run(&*sb, sh("head -c 16 /proc/kcore 2>/dev/null | wc -c")).await;
    assert_eq!(r.stdout, "0\n", "{r:?}");
    // The host's /etc is there, read-only, but not its secrets.
    let r = run(
        &*sb,
        sh("test -s /etc/passwd && echo passwd; cat /etc/shadow 2>/dev/null | wc -c; ls /etc/ssh 2>/dev/null | wc -l"),
    )
    .await;
    assert_eq!(r.stdout, "passwd\n0\n0\n", "{r:?}");
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_hold_and_the_host_is_unaffected() {
    let Some(engine) = engine_with(OciRuntime::Auto) else {
        return;
    };
    let sb = sandbox(&engine).await;
    // A memory bomb is OOM-killed and reported as the memory limit.
    let r = run(&*sb, memory_bomb()).await;
    assert_eq!(
        r.outcome,
        Outcome::LimitExceeded {
            limit: LimitKind::Memory
        },
        "{r:?}"
    );
    // A fork bomb is bounded by pids; the container ends and the host is fine.
    let mut forks = ExecRequest::new(Program::code(
        Language::Python,
        "import os, time\nn = 0\nfor i in range(500):\n    try:\n        pid = os.fork()\n    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    n += 1\nprint(n)",
    ))
    .with_timeout_ms(20_000);
    forks.limits.pids = Some(16);
    let r = run(&*sb, forks).await;
    let forked: u32 = r.stdout.trim().parse().expect("a count");
    assert!((1..16).contains(&forked), "at most 16 tasks: {r:?}");
    // Those sleepers died with the container: a new one holds only its init shell,
    // the program's shell, `ls` and `grep`.
    let r = run(&*sb, sh("ls /proc | grep -c '^[0-9]'")).await;
    assert!(r.stdout.trim().parse::<u32>().unwrap() <= 4, "{r:?}");
    // The deadline takes the whole container.
    let started = Instant::now();
    let r = run(
        &*sb,
        ExecRequest::new(Program::command(["sleep", "30"])).with_timeout_ms(500),
    )
    .await;
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // CPU time is accounted.
    let r = run(
        &*sb,
        ExecRequest::new(Program::code(
            Language::Python,
            "x = 0\nfor i in range(3_000_000): x += i",
        )),
    )
    .await;
    assert_eq!(r.outcome, exit(0), "{r:?}");
    assert!(r.usage.cpu_ms > 0, "{:?}", r.usage);
    assert!(r.usage.peak_memory_bytes > 0, "{:?}", r.usage);
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_destroy_end_a_running_container() {
    let Some(engine) = engine_with(OciRuntime::Auto) else {
        return;
    };
    let sb = sandbox(&engine).await;
    let cancel = CancelToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        c2.cancel();
    });
    let started = Instant::now();
    let r = sb
        .exec(
            ExecRequest::new(Program::command(["sleep", "30"])).with_timeout_ms(60_000),
            &DiscardSink,
            cancel,
        )
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Cancelled, "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(10));

    let sb2 = sb.clone();
    let running = tokio::spawn(async move {
        sb2.exec(
            ExecRequest::new(Program::command(["sleep", "30"])).with_timeout_ms(60_000),
            &DiscardSink,
            CancelToken::new(),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    sb.destroy().await.unwrap();
    let r = running.await.unwrap();
    match r {
        Ok(r) => assert_eq!(r.outcome, Outcome::Cancelled, "{r:?}"),
        Err(e) => assert_eq!(e.code, ErrorCode::EngineDisposed, "{e}"),
    }
    let e = sb
        .exec(sh("true"), &DiscardSink, CancelToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::EngineDisposed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_left_behind_after_destroy_and_engine_drop() {
    let root = tempfile::tempdir().unwrap();
    let config = ContainerConfig {
        workdir_root: Some(root.path().to_path_buf()),
        ..ContainerConfig::default()
    };
    let engine = match ContainerEngine::new(&config) {
        Ok(e) => e,
        Err(e) if std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_some() => {
            panic!("the container engine must start here: {e}")
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    // The engine's directory, named like its cgroups.
    let dirs: Vec<PathBuf> = std::fs::read_dir(root.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let name = dirs[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("paddock-ct-"), "{name}");

    let sb = sandbox(&engine).await;
    let r = run(&*sb, sh("sleep 5 & echo started")).await;
    assert_eq!(r.stdout, "started\n", "{r:?}");
    let r = run(&*sb, sh("echo second")).await;
    assert_eq!(r.stdout, "second\n");
    assert!(
        !leftovers(&name).is_empty(),
        "the engine's cgroups exist while it runs"
    );
    let workdir = sb.host_dir().to_path_buf();
    sb.destroy().await.unwrap();
    assert!(!workdir.exists());
    drop(sb);
    drop(engine);
    assert_eq!(
        leftovers(&name),
        Vec::<String>::new(),
        "cgroups or mounts remain"
    );
    let rest: Vec<PathBuf> = std::fs::read_dir(root.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(rest.is_empty(), "directories remain: {rest:?}");
    // No process of the containers survived.
    let sleepers = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("cgroup")).ok())
        .filter(|c| c.contains(&name))
        .count();
    assert_eq!(sleepers, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runc_works_too_and_a_missing_runtime_is_explained() {
    if let Some(engine) = engine_with(OciRuntime::Runc) {
        assert_eq!(engine.runtime_info().kind, RuntimeKind::Runc);
        let sb = sandbox(&engine).await;
        let r = run(&*sb, sh("echo via-runc")).await;
        assert_eq!(r.stdout, "via-runc\n", "{r:?}");
        sb.destroy().await.unwrap();
    }
    let config = ContainerConfig {
        runtime: OciRuntime::Crun,
        runtime_path: Some(Path::new("/nonexistent/crun").to_path_buf()),
        ..ContainerConfig::default()
    };
    let e = ContainerEngine::new(&config).unwrap_err();
    assert_eq!(e.code, ErrorCode::EngineFailed);
    assert!(e.message.contains("/nonexistent/crun"), "{e}");
}

/// A network namespace with a veth pair to the host, made and removed by the test.
struct TestNet {
    name: String,
}

impl TestNet {
    fn create(tag: &str, host_ip: &str, ns_ip: &str) -> Option<TestNet> {
        let name = format!("paddock-t{}-{tag}", std::process::id());
        let host_if = format!("pdh{}{tag}", std::process::id() % 10_000);
        let ns_if = format!("pdn{}{tag}", std::process::id() % 10_000);
        let ip = |args: &[&str]| {
            std::process::Command::new("ip")
                .args(args)
                .status()
                .is_ok_and(|s| s.success())
        };
        if !ip(&["netns", "add", &name]) {
            eprintln!("skipped: `ip netns add` is not available");
            return None;
        }
        let net = TestNet { name: name.clone() };
        let ok = ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if, "netns", &name,
        ]) && ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_if])
            && ip(&["link", "set", &host_if, "up"])
            && ip(&[
                "-n",
                &name,
                "addr",
                "add",
                &format!("{ns_ip}/30"),
                "dev",
                &ns_if,
            ])
            && ip(&["-n", &name, "link", "set", &ns_if, "up"])
            && ip(&["-n", &name, "link", "set", "lo", "up"]);
        assert!(ok, "setting up the test's veth pair failed");
        Some(net)
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        // Deleting the namespace deletes the veth pair with it.
        let _ = std::process::Command::new("ip")
            .args(["netns", "delete", &self.name])
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_network_reaches_a_listener_outside_the_container() {
    let Some(engine) = engine_with(OciRuntime::Auto) else {
        return;
    };
    // A listener on a veth address inside a namespace this test creates: reachable
    // from the host, so a failure from inside the container is the container's.
    let Some(net) = TestNet::create("a", "10.203.7.1", "10.203.7.2") else {
        return;
    };
    let mut listener = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &net.name,
            "python3",
            "-c",
            "import socket\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind(('10.203.7.2', 18431))\ns.listen(8)\nprint('ready', flush=True)\nwhile True:\n    c, _ = s.accept()\n    c.sendall(b'reached')\n    c.close()",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the listener starts");
    {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(listener.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
    }
    let probe = "import socket\ntry:\n    c = socket.create_connection(('10.203.7.2', 18431), timeout=2)\n    print(c.recv(16).decode())\nexcept OSError as e:\n    print('refused', type(e).__name__)";
    let from_host = std::process::Command::new("python3")
        .args(["-c", probe])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&from_host.stdout).trim(),
        "reached",
        "the host reaches the test's listener"
    );
    let sb = sandbox(&engine).await;
    let r = run(
        &*sb,
        ExecRequest::new(Program::code(Language::Python, probe)).with_timeout_ms(20_000),
    )
    .await;
    assert!(r.stdout.starts_with("refused"), "{r:?}");
    sb.destroy().await.unwrap();
    let _ = listener.kill();
    let _ = listener.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executions_share_the_warm_container_until_it_is_replaced() {
    let Some(engine) = engine_with_agent(&ContainerConfig::default()) else {
        return;
    };
    let sb = sandbox(&engine).await;
    let marker = "test -e /tmp/marker && echo same || echo fresh";
    let r = run(
        &*sb,
        sh("touch /tmp/marker; cat /proc/1/cmdline | tr '\\0' ' '"),
    )
    .await;
    assert!(r.stdout.contains("paddock-agent"), "{r:?}");
    // The next execution runs in the same container: a frame round trip.
    assert_eq!(run(&*sb, sh(marker)).await.stdout, "same\n");
    // What an execution leaves running dies with it.
    let r = run(&*sb, sh("sleep 60 & echo started")).await;
    assert_eq!(r.stdout, "started\n");
    let r = run(
        &*sb,
        sh("cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^sleep$'"),
    )
    .await;
    assert_eq!(r.stdout, "0\n", "{r:?}");
    // A request with a CPU-time limit gets a container of its own (rlimits count a
    // process's whole life).
    let mut own = sh(marker);
    own.limits.cpu_ms = Some(5_000);
    assert_eq!(run(&*sb, own).await.stdout, "fresh\n");
    assert_eq!(run(&*sb, sh(marker)).await.stdout, "same\n");
    // A turn that times out takes its container with it.
    let r = run(&*sb, sh("sleep 30").with_timeout_ms(300)).await;
    assert_eq!(r.outcome, Outcome::TimedOut);
    assert_eq!(run(&*sb, sh(marker)).await.stdout, "fresh\n");
    // Recycling (between pooled leases) resets a used container too (in place,
    // or by replacing it).
    run(&*sb, sh("touch /tmp/marker")).await;
    sb.recycle().await.unwrap();
    assert_eq!(run(&*sb, sh(marker)).await.stdout, "fresh\n");
    // stdin, env and cwd reach a warm execution.
    sb.write_file("d/x", b"1").await.unwrap();
    let mut req = sh("read l; echo \"$l $V $(pwd)\"");
    req.stdin = Some("in\n".into());
    req.env.insert("V".into(), "v".into());
    req.cwd = Some("d".into());
    assert_eq!(run(&*sb, req).await.stdout, "in v /workspace/d\n");
    // A program that does not exist is a spawn failure, and the container stays.
    let e = sb
        .exec(
            ExecRequest::new(Program::command(["no-such-program"])),
            &DiscardSink,
            CancelToken::new(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::SpawnFailed, "{e}");
    sb.destroy().await.unwrap();
}

/// A snippet's interpreter in a warm container: its pid (from inside), and what it
/// printed after it.
fn py(tenant: &str, source: &str) -> ExecRequest {
    let mut r = ExecRequest::new(Program::code(
        Language::Python,
        format!("import os\nprint(os.getpid())\n{source}"),
    ))
    .with_timeout_ms(20_000);
    r.tenant = Some(tenant.into());
    r
}

fn pid_and_rest(r: &ExecResult) -> (String, String) {
    let (pid, rest) = r.stdout.split_once('\n').unwrap_or((&r.stdout, ""));
    (pid.to_string(), rest.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snippets_run_on_a_warm_runner_inside_the_warm_container() {
    let Some(engine) = engine_with_agent(&ContainerConfig::default()) else {
        return;
    };
    let sb = sandbox(&engine).await;
    // The first snippet starts the runner; the next runs on the same interpreter,
    // with its state (one tenant's), and a notebook-style value.
    let first = run(&*sb, py("a", "import sys\nsys.paddock_mark = 41")).await;
    assert_eq!(first.outcome, exit(0), "{first:?}");
    let (runner, _) = pid_and_rest(&first);
    let r = run(&*sb, py("a", "import sys\nsys.paddock_mark + 1")).await;
    assert_eq!(pid_and_rest(&r).0, runner, "the same interpreter: {r:?}");
    assert_eq!(r.value, Some(serde_json::json!(42)), "{r:?}");
    // It sees what a program sees: the same environment and working directory.
    let env_of_snippet =
        "import json\nprint(json.dumps(dict(os.environ), sort_keys=True))\nprint(os.getcwd())";
    let on_runner = run(&*sb, py("a", env_of_snippet)).await;
    assert_eq!(pid_and_rest(&on_runner).0, runner);
    let mut program = ExecRequest::new(Program::command([
        "python3",
        "-c",
        &format!("import os\nprint(0)\n{env_of_snippet}"),
    ]));
    program.tenant = Some("a".into());
    let as_program = run(&*sb, program).await;
    assert_eq!(
        pid_and_rest(&on_runner).1,
        pid_and_rest(&as_program).1,
        "a runner's environment is a program's"
    );
    // What a snippet leaves running dies with its turn (a child, and one in a
    // session of its own), and so does its runner.
    let r = run(
        &*sb,
        py(
            "a",
            "import subprocess\nkids = [subprocess.Popen(['sleep', '300']), subprocess.Popen(['sleep', '300'], start_new_session=True)]\nprint(' '.join(str(k.pid) for k in kids))",
        ),
    )
    .await;
    let (pid, kids) = pid_and_rest(&r);
    assert_eq!(pid, runner, "{r:?}");
    let check = format!(
        "def state(p):\n    try:\n        return open('/proc/%d/stat' % p).read().rsplit(')', 1)[1].split()[0]\n    except FileNotFoundError:\n        return 'gone'\nprint(' '.join(state(int(p)) for p in '{}'.split()))",
        kids.trim()
    );
    let r = run(&*sb, py("a", &check)).await;
    let (pid, states) = pid_and_rest(&r);
    assert_ne!(
        pid, runner,
        "a runner whose snippet left processes is replaced: {r:?}"
    );
    assert_eq!(
        states, "gone gone\n",
        "the leftovers are dead and reaped: {r:?}"
    );
    let runner = pid;
    // A program's turn through the agent leaves the runner alone.
    assert_eq!(run(&*sb, sh("echo hi")).await.stdout, "hi\n");
    let r = run(&*sb, py("a", "")).await;
    assert_eq!(pid_and_rest(&r).0, runner);
    // Another tenant never gets this interpreter; nor does anyone after a turn that
    // failed.
    let b = run(
        &*sb,
        py("b", "import sys\nprint(hasattr(sys, 'paddock_mark'))"),
    )
    .await;
    let (b_runner, mark) = pid_and_rest(&b);
    assert_ne!(b_runner, runner, "{b:?}");
    assert_eq!(mark, "False\n");
    let failed = run(&*sb, py("b", "raise ValueError('no')")).await;
    assert_eq!(failed.outcome, exit(1), "{failed:?}");
    assert!(failed.stderr.contains("ValueError: no"), "{failed:?}");
    let after = run(&*sb, py("b", "")).await;
    assert_ne!(pid_and_rest(&after).0, b_runner, "{after:?}");
    // A cancelled snippet ends as cancelled, and the next one runs.
    let cancel = CancelToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.cancel();
    });
    let r = sb
        .exec(py("b", "while True: pass"), &DiscardSink, cancel)
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Cancelled, "{r:?}");
    assert_eq!(run(&*sb, py("b", "print('ok')")).await.outcome, exit(0));
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_warm_mode_every_execution_gets_a_container() {
    let config = ContainerConfig {
        warm: false,
        ..ContainerConfig::default()
    };
    let Ok(engine) = ContainerEngine::new(&config) else {
        eprintln!("skipped: no OCI runtime");
        return;
    };
    assert!(engine.agent().is_err());
    let sb = sandbox(&engine).await;
    let r = run(&*sb, sh("touch /tmp/m; cat /proc/1/cmdline | tr '\\0' ' '")).await;
    assert!(r.stdout.contains("paddock-init"), "{r:?}");
    let r = run(&*sb, sh("test -e /tmp/m && echo same || echo fresh")).await;
    assert_eq!(r.stdout, "fresh\n");
    // A memory bomb in a container of its own: the runtime has removed the
    // container's cgroup by the time it ends, and the kill is still told apart.
    let r = run(&*sb, memory_bomb()).await;
    assert_eq!(
        r.outcome,
        Outcome::LimitExceeded {
            limit: LimitKind::Memory
        },
        "{r:?}"
    );
    // A signal is reported as such, through the init shell.
    let r = run(&*sb, sh("kill -KILL $$")).await;
    assert_eq!(
        r.outcome,
        Outcome::Completed {
            exit_code: 137,
            signal: Some(9)
        },
        "{r:?}"
    );
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sandbox_is_frozen_until_unpaused() {
    let Some(engine) = engine_with(OciRuntime::Auto) else {
        return;
    };
    assert!(engine.capabilities().has_feature("pause"));
    let sb = sandbox(&engine).await;
    // A program that counts into a file every 20 ms.
    let sb2 = sb.clone();
    let counting = tokio::spawn(async move {
        sb2.exec(
            sh("i=0; while true; do i=$((i+1)); echo $i > /workspace/count; sleep 0.02; done")
                .with_timeout_ms(60_000),
            &DiscardSink,
            CancelToken::new(),
        )
        .await
    });
    let count = |sb: Arc<dyn Sandbox>| async move {
        let bytes = sb.read_file("count").await.unwrap_or_default();
        String::from_utf8_lossy(&bytes)
            .trim()
            .parse::<u64>()
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while count(sb.clone()).await < 3 {
        assert!(Instant::now() < deadline, "the counter never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sb.pause().await.unwrap();
    sb.pause().await.unwrap(); // a no-op
    assert_eq!(sb.status(), paddock_core::SandboxStatus::Paused);
    let frozen_at = count(sb.clone()).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        count(sb.clone()).await,
        frozen_at,
        "nothing runs while paused"
    );
    let e = sb
        .exec(sh("true"), &DiscardSink, CancelToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::SandboxPaused, "{e}");
    // The frozen agent could not start a process: refused, not left pending.
    let e = sb
        .start_process(paddock_core::ProcessSpec::new(["true"]))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::SandboxPaused, "{e}");
    sb.unpause().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(sb.clone()).await <= frozen_at {
        assert!(Instant::now() < deadline, "the counter never resumed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_ne!(sb.status(), paddock_core::SandboxStatus::Paused);
    // Destroy ends the counter, paused or not.
    sb.pause().await.unwrap();
    sb.destroy().await.unwrap();
    let r = counting.await.unwrap();
    match r {
        Ok(r) => assert_eq!(r.outcome, Outcome::Cancelled, "{r:?}"),
        Err(e) => assert_eq!(e.code, ErrorCode::EngineDisposed, "{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_reaps_orphans_between_executions() {
    let Some(engine) = engine_with(OciRuntime::Auto) else {
        return;
    };
    let sb = sandbox(&engine).await;
    // Orphans every 20 ms: each `( sleep 0.01 & )` leaves a child to pid 1.
    let orphans = sb
        .start_process(paddock_core::ProcessSpec::new([
            "sh",
            "-c",
            "while :; do ( sleep 0.01 & ); sleep 0.02; done",
        ]))
        .await
        .unwrap();
    // Idle (no execution) for a second: ~50 orphans die meanwhile.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let r = sb
        .exec(
            sh("grep -l '^State:.Z' /proc/[0-9]*/status 2>/dev/null | wc -l"),
            &DiscardSink,
            CancelToken::new(),
        )
        .await
        .unwrap();
    let zombies: u32 = r.stdout.trim().parse().unwrap_or(u32::MAX);
    assert!(
        zombies < 10,
        "the agent must reap orphans as they die; {zombies} zombies after a second ({r:?})"
    );
    orphans.kill().unwrap();
    orphans.wait().await;
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_keeps_serving_when_a_background_process_is_killed_beside_others() {
    let Some(engine) = engine_with(OciRuntime::Auto) else {
        return;
    };
    let sb = sandbox(&engine).await;
    // Each round starts a process, then kills the one before it, which the agent
    // lists first: a kill wakes the agent with SIGCHLD and the pidfd at once, which
    // once made it take the later, running process for the one that exited, wait
    // on it, and stop answering.
    let mut older = sb
        .start_process(paddock_core::ProcessSpec::new(["sleep", "600"]))
        .await
        .unwrap();
    for round in 0..25 {
        let newer = sb
            .start_process(paddock_core::ProcessSpec::new(["sleep", "600"]))
            .await
            .unwrap_or_else(|e| panic!("round {round}: the agent stopped answering: {e}"));
        older.kill().unwrap();
        let exit = tokio::time::timeout(Duration::from_secs(10), older.wait())
            .await
            .unwrap_or_else(|_| panic!("round {round}: the kill was never reported"));
        assert_eq!(exit.signal, Some(libc::SIGKILL), "round {round}: {exit:?}");
        assert_eq!(
            newer.try_wait(),
            None,
            "round {round}: the newer process still runs"
        );
        older = newer;
    }
    older.kill().unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(10), older.wait())
        .await
        .expect("its kill is reported");
    assert_eq!(exit.signal, Some(libc::SIGKILL), "{exit:?}");
    sb.destroy().await.unwrap();
}

/// Host variables for [`containers_see_only_listed_host_variables`], set once before
/// its engines are created (engines read the host's environment when they start).
const LEAKED_HOST_VARS: &[(&str, &str)] = &[
    (
        "PADDOCK_ENV_TEST_DATABASE_URL",
        "postgres://u:pass@h/db-host-only",
    ),
    ("PADDOCK_ENV_TEST_LEAK_PROBE", "leak-probe-host-only"),
];
const LISTED_HOST_VAR: (&str, &str) = ("PADDOCK_ENV_TEST_LISTED", "listed-value");

fn plant_host_vars() {
    static PLANT: std::sync::Once = std::sync::Once::new();
    PLANT.call_once(|| {
        for (name, value) in LEAKED_HOST_VARS.iter().chain([&LISTED_HOST_VAR]) {
            std::env::set_var(name, value);
        }
    });
}

/// The program's environment as `NAME=value` lines, in one map.
fn env_of(stdout: &str) -> std::collections::BTreeMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn assert_allow_listed(what: &str, stdout: &str) {
    for (name, value) in LEAKED_HOST_VARS {
        assert!(
            !stdout.contains(name) && !stdout.contains(value),
            "{what}: the unlisted host variable {name} reached the container:\n{stdout}"
        );
    }
    let vars = env_of(stdout);
    assert_eq!(
        vars.get(LISTED_HOST_VAR.0).map(String::as_str),
        Some(LISTED_HOST_VAR.1),
        "{what}: the listed host variable is missing:\n{stdout}"
    );
    assert_eq!(
        vars.get("FROM_REQUEST").map(String::as_str),
        Some("request-value"),
        "{what}: the request's env is missing:\n{stdout}"
    );
    assert_eq!(
        vars.get("HOME").map(String::as_str),
        Some("/workspace"),
        "{what}"
    );
    assert!(
        vars.get("PATH").is_some_and(|p| p.contains("/usr/bin")),
        "{what}"
    );
    // Nothing of the host's own comes in unless listed: not even its locale or user.
    for name in vars.keys() {
        assert!(
            [
                LISTED_HOST_VAR.0,
                "FROM_REQUEST",
                "PATH",
                "HOME",
                "PWD",
                "TMPDIR",
                "TERM",
                "SHLVL",
                "_",
            ]
            .contains(&name.as_str()),
            "{what}: unexpected variable {name} in the container:\n{stdout}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_see_only_listed_host_variables() {
    plant_host_vars();
    for warm in [false, true] {
        let config = ContainerConfig {
            warm,
            env_passthrough: vec![LISTED_HOST_VAR.0.to_string()],
            ..ContainerConfig::default()
        };
        let engine = match ContainerEngine::new(&config) {
            Ok(e) => e,
            Err(e) if std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_some() => {
                panic!("the container engine must start here: {e}")
            }
            Err(e) => {
                eprintln!("skipped: {e}");
                return;
            }
        };
        let sb = sandbox(&engine).await;
        let mut req = ExecRequest::new(Program::command(["env"])).with_timeout_ms(20_000);
        req.env
            .insert("FROM_REQUEST".to_string(), "request-value".to_string());
        let r = run(&*sb, req.clone()).await;
        assert_eq!(r.outcome, exit(0), "{r:?}");
        let what = if warm { "warm" } else { "cold" };
        // The warm engine runs it in the warm container (its pid 1 is the agent).
        let init = run(&*sb, sh("cat /proc/1/cmdline | tr '\\0' ' '")).await;
        let agent = init.stdout.contains("paddock-agent");
        assert_eq!(agent, warm && engine.agent().is_ok(), "{init:?}");
        assert_allow_listed(what, &r.stdout);
        // A background process in the warm container gets the same environment.
        if warm && engine.agent().is_ok() {
            let mut spec = paddock_core::ProcessSpec::new(["env"]);
            spec.env = req.env.clone();
            let p = sb.start_process(spec).await.unwrap();
            let mut out = p.output();
            let mut text = Vec::new();
            while let Some(chunk) = tokio::time::timeout(Duration::from_secs(10), out.next())
                .await
                .expect("the process's output arrives")
            {
                text.extend_from_slice(&chunk.data);
            }
            assert_eq!(p.wait().await.exit_code, 0);
            assert_allow_listed("background process", &String::from_utf8_lossy(&text));
        }
        sb.destroy().await.unwrap();
    }
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
    for warm in [false, true] {
        let config = ContainerConfig {
            warm,
            ..ContainerConfig::default()
        };
        let engine = match ContainerEngine::new(&config) {
            Ok(e) => e,
            Err(e) if std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_some() => {
                panic!("the container engine must start here: {e}")
            }
            Err(e) => {
                eprintln!("skipped: {e}");
                return;
            }
        };
        let what = if warm { "warm" } else { "cold" };
        let sb = sandbox(&engine).await;
        sb.write_file("sub/dir/keep", b"").await.unwrap();
        // `esc -> /` made by a program inside (where `/` is the container's root),
        // one made on the host, and a symlinked parent.
        let r = run(&*sb, sh("ln -s / esc && ln -s ../.. sub/up")).await;
        assert_eq!(r.outcome, exit(0), "{what}: {r:?}");
        std::os::unix::fs::symlink("/", sb.host_dir().join("host-esc")).unwrap();
        let in_dir = |cwd: &str| {
            let mut req = sh("pwd");
            req.cwd = Some(cwd.to_string());
            req
        };
        for cwd in [
            "sub/dir",
            "/workspace/sub/dir",
            "/workspace/sub/dir/",
            "./sub//dir",
        ] {
            let r = run(&*sb, in_dir(cwd)).await;
            assert_eq!(r.stdout, "/workspace/sub/dir\n", "{what} {cwd}: {r:?}");
        }
        for cwd in ["/workspace", "/workspace/", "."] {
            assert_eq!(run(&*sb, in_dir(cwd)).await.stdout, "/workspace\n", "{cwd}");
        }
        for cwd in [
            "esc",
            "/workspace/esc",
            "esc/usr",
            "host-esc",
            "sub/up",
            "/workspace/sub/up/tmp",
            "/workspace/..",
        ] {
            let e = sb
                .exec(in_dir(cwd), &DiscardSink, CancelToken::new())
                .await
                .unwrap_err();
            assert_eq!(e.code, ErrorCode::PathEscape, "{what} {cwd}: {e}");
        }
        // A directory of the container's own root is the container's to work in:
        // its processes see the container, not the host.
        for cwd in ["/tmp", "/etc", "/"] {
            let r = run(&*sb, in_dir(cwd)).await;
            assert_eq!(r.stdout, format!("{cwd}\n"), "{what} {cwd}: {r:?}");
        }
        // Kernel views and `..` are refused before anything runs.
        for cwd in ["/proc/self/fd/3", "/sys", "/tmp/../etc"] {
            let e = sb
                .exec(in_dir(cwd), &DiscardSink, CancelToken::new())
                .await
                .unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidOptions, "{what} {cwd}: {e}");
        }
        // One that does not exist there fails the program's start, naming it.
        let r = sb
            .exec(in_dir("/workspacex"), &DiscardSink, CancelToken::new())
            .await;
        eprintln!("{what} /workspacex: {r:?}");
        match r {
            Err(e) => assert!(e.message.contains("/workspacex"), "{what}: {e}"),
            Ok(r) => panic!("{what}: a missing cwd ran: {r:?}"),
        }
        let e = sb
            .exec(in_dir("/workspace/nope"), &DiscardSink, CancelToken::new())
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidOptions, "{what}: {e}");
        assert!(e.message.contains("`/workspace/nope`"), "{e}");

        if warm && engine.agent().is_ok() {
            let mut spec = paddock_core::ProcessSpec::new(["pwd"]);
            spec.cwd = Some("/workspace/sub/dir".into());
            let p = sb.start_process(spec.clone()).await.unwrap();
            assert_eq!(process_output(&p).await, "/workspace/sub/dir\n");
            spec.cwd = Some("esc".into());
            let e = sb.start_process(spec).await.unwrap_err();
            assert_eq!(e.code, ErrorCode::PathEscape, "{e}");
            let mut term = paddock_core::TerminalSpec::new("sh", Vec::<String>::new());
            term.cwd = Some("/workspace/esc".into());
            let e = sb.open_terminal(term).await.unwrap_err();
            assert_eq!(e.code, ErrorCode::PathEscape, "{e}");
        }
        sb.destroy().await.unwrap();
    }
}

/// A Python busy loop that spins for `wall_ms` of wall-clock time.
fn busy_for(wall_ms: u64, limits: Limits) -> ExecRequest {
    let mut req = ExecRequest::new(Program::code(
        Language::Python,
        format!(
            "import time\nend = time.monotonic() + {wall_ms} / 1000\nn = 0\nwhile time.monotonic() < end:\n    n += 1\nprint(n)"
        ),
    ));
    req.limits = Limits {
        timeout_ms: Some(30_000),
        ..limits
    };
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_millicores_sets_the_containers_cpu_quota() {
    let Some(engine) = engine_with(OciRuntime::Auto) else {
        return;
    };
    if !engine.capabilities().enforces("cpu_millicores") {
        eprintln!("skipped: no CPU controller for the containers here");
        return;
    }
    let sb = sandbox(&engine).await;
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
    for r in [&free, &capped] {
        assert_eq!(r.outcome, exit(0), "{r:?}");
    }
    let share = |r: &ExecResult| r.usage.cpu_ms as f64 / r.usage.wall_ms.max(1) as f64;
    let (f, c) = (share(&free), share(&capped));
    eprintln!("cpu share: default quota {f}, 200 millicores {c}");
    // A fifth of a core against the default of one core; generous bounds (the
    // wall time includes the container's start).
    assert!(c < 0.35, "capped share {c} (default {f})");
    assert!(f > c * 1.5, "default {f} vs capped {c}");
    let count = |r: &ExecResult| r.stdout.trim().parse::<u64>().unwrap_or(0);
    assert!(
        count(&capped) < count(&free),
        "{} vs {}",
        count(&capped),
        count(&free)
    );
    sb.destroy().await.unwrap();
}
/// The host uid of the process whose command line contains `token`, once it runs.
async fn host_uid_of(token: &str) -> Option<u32> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if !String::from_utf8_lossy(&cmdline).contains(token) {
                continue;
            }
            let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
            if let Some(uid) = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
            {
                return Some(uid);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// With `container.user_namespace` (the default), warm and cold: the container's
/// processes run as the sandbox's unprivileged host uid, a file its root writes in
/// `/workspace` is owned by that uid on the host (and so is what the files API
/// writes, which the container's root can then change), and a host file only root
/// may read cannot be read. Without it, the same file can be read: the check tells
/// the two apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_run_as_an_unprivileged_host_user() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    for (warm, user_namespace) in [(true, true), (false, true), (true, false)] {
        let what = format!("warm {warm}, user namespace {user_namespace}");
        let config = ContainerConfig {
            warm,
            user_namespace,
            ..ContainerConfig::default()
        };
        let engine = match ContainerEngine::new(&config) {
            Ok(e) => e,
            Err(e) if std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_some() => {
                panic!("the container engine must start here: {e}")
            }
            Err(e) => {
                eprintln!("skipped: {e}");
                return;
            }
        };
        assert_eq!(engine.runtime_info().user_namespace, user_namespace);
        let sb = engine.open(&SandboxSpec::default()).await.unwrap();
        let uid = sb.host_root_uid();
        assert_eq!(uid != 0, user_namespace, "{what}");

        // Root inside, and the map says onto which host ids.
        let r = run(&sb, sh("id -u; id -g; cat /proc/self/uid_map")).await;
        let lines: Vec<Vec<&str>> = r
            .stdout
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(lines[0], ["0"], "{what}: {r:?}");
        assert_eq!(lines[1], ["0"], "{what}: {r:?}");
        if user_namespace {
            assert_eq!(lines[2], ["0", &uid.to_string(), "65536"], "{what}: {r:?}");
        } else {
            assert_eq!(lines[2], ["0", "0", "4294967295"], "{what}: {r:?}");
        }

        // 1. The program is that uid on the host.
        let token = format!("{}.{}", 300 + u32::from(warm), std::process::id());
        let cancel = CancelToken::new();
        let exec = sb.exec(
            sh(&format!("sleep {token}; true")),
            &DiscardSink,
            cancel.clone(),
        );
        let watch = async {
            let seen = host_uid_of(&format!("sleep\0{token}")).await;
            cancel.cancel();
            seen
        };
        let (ended, seen) = tokio::join!(exec, watch);
        assert!(ended.is_ok(), "{what}: {ended:?}");
        assert_eq!(seen, Some(uid), "{what}: the host uid of the program");

        // 2. What its root writes in /workspace is the sandbox uid's on the host; so
        // is what the files API writes, and the container's root may change that.
        sb.write_file("api/made-by-api.txt", b"api\n")
            .await
            .unwrap();
        let r = run(
            &sb,
            sh("echo inside > /workspace/made-inside.txt && echo more >> api/made-by-api.txt && mkdir api/sub && echo ok"),
        )
        .await;
        assert_eq!(r.stdout, "ok\n", "{what}: {r:?}");
        for path in [
            "",
            "made-inside.txt",
            "api",
            "api/made-by-api.txt",
            "api/sub",
        ] {
            let m = std::fs::metadata(sb.host_dir().join(path)).unwrap();
            assert_eq!((m.uid(), m.gid()), (uid, uid), "{what}: owner of `{path}`");
        }
        assert_eq!(
            sb.read_file("api/made-by-api.txt").await.unwrap(),
            b"api\nmore\n"
        );

        // 3. A host file only root may read (0600, the host's root) cannot be read.
        let secret = sb.host_dir().join("host-secret.txt");
        std::fs::write(&secret, "host secret\n").unwrap();
        std::os::unix::fs::chown(&secret, Some(0), Some(0)).unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let r = run(&sb, sh("cat /workspace/host-secret.txt")).await;
        if user_namespace {
            assert_ne!(r.outcome, exit(0), "{what}: {r:?}");
            assert!(r.stderr.contains("Permission denied"), "{what}: {r:?}");
            assert!(!r.stdout.contains("host secret"), "{what}: {r:?}");
        } else {
            assert_eq!(r.stdout, "host secret\n", "{what}: {r:?}");
        }
        sb.destroy().await.unwrap();
    }
}

/// gVisor's runsc, when it is installed: the engine runs containers on its
/// user-space kernel, warm and cold, without a user namespace of the host's, and
/// offers no processes, terminals or TCP there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runsc_runs_containers_on_a_user_space_kernel() {
    let Some(engine) = runsc_engine(true) else {
        return;
    };
    let info = engine.runtime_info();
    assert_eq!(info.kind, RuntimeKind::Runsc, "{info:?}");
    assert!(!info.user_namespace, "{info:?}");
    let caps = engine.capabilities();
    for feature in ["process", "terminal", "tcp"] {
        assert!(!caps.features.iter().any(|f| f == feature), "{caps:?}");
    }
    let sb = engine.open(&SandboxSpec::default()).await.unwrap();
    // gVisor's kernel answers `uname`, not the host's.
    let r = run(&sb, sh("uname -r; echo out; echo err >&2; exit 3")).await;
    assert_eq!(r.outcome, exit(3), "{r:?}");
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{r:?}");
    assert_ne!(lines[0], host.trim(), "{r:?}");
    assert_eq!((lines[1], r.stderr.as_str()), ("out", "err\n"), "{r:?}");
    // The warm container serves executions (it is there between them).
    assert!(sb.warm_container_id().is_some());
    // The seccomp profile holds in gVisor's kernel (no nested user namespace), and
    // the host's secrets are masked as with crun and runc.
    let r = run(
        &sb,
        sh("unshare -U true 2>/dev/null; echo rc=$?; cat /etc/shadow 2>/dev/null | wc -c; ls -A /etc/ssl/private 2>/dev/null | wc -l; test -s /etc/passwd && echo passwd"),
    )
    .await;
    assert_eq!(r.stdout, "rc=1\n0\n0\npasswd\n", "{r:?}");
    sb.write_file("in.txt", b"from the host").await.unwrap();
    let r = run(&sb, sh("cat in.txt; echo made > made.txt")).await;
    assert_eq!(r.stdout, "from the host", "{r:?}");
    assert_eq!(sb.read_file("made.txt").await.unwrap(), b"made\n");
    let e = sb
        .open_terminal(paddock_core::TerminalSpec::new("sh", Vec::<String>::new()))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::CapabilityNotSupported, "{e}");
    // Its agent has no control channel to reset the container through: a used one
    // is replaced at a recycle.
    let used = sb.warm_container_id();
    sb.recycle().await.unwrap();
    assert_ne!(sb.warm_container_id(), used);
    assert_eq!(engine.warm_resets(), (0, 1));
    sb.destroy().await.unwrap();
}

/// The engine on runsc, or `None` (said why) when it cannot start here; with
/// `PADDOCK_REQUIRE_CONTAINERS` set (as `.ci/run` does, which installs runsc) it
/// must start.
fn runsc_engine(warm: bool) -> Option<ContainerEngine> {
    let config = ContainerConfig {
        runtime: OciRuntime::Runsc,
        warm,
        ..ContainerConfig::default()
    };
    match ContainerEngine::new(&config) {
        Ok(e) => Some(e),
        Err(e) if std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_some() => {
            panic!("the container engine must start with runsc here: {e}")
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// A sandbox whose workdir its containers mount at `/home/user`, E2B's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_with_a_home_mounts_its_workdir_there() {
    let Some(engine) = engine_with(OciRuntime::Auto) else {
        return;
    };
    let sb = engine
        .create(&SandboxSpec {
            home: Some("/home/user".into()),
            ..SandboxSpec::default()
        })
        .await
        .expect("sandbox opens");
    assert_eq!(sb.root_dir(), std::path::Path::new("/home/user"));
    sb.write_file("/home/user/a.txt", b"from the files API")
        .await
        .unwrap();
    let r = run(
        &*sb,
        sh("pwd; echo $HOME; cat /home/user/a.txt; echo; echo made > b.txt; ls -A /workspace 2>/dev/null | wc -l"),
    )
    .await;
    assert_eq!(
        r.stdout, "/home/user\n/home/user\nfrom the files API\n0\n",
        "{r:?}"
    );
    assert_eq!(sb.read_file("/home/user/b.txt").await.unwrap(), b"made\n");
    run(&*sb, sh("mkdir -p /home/user/sub")).await;
    let mut req = sh("pwd");
    req.cwd = Some("/home/user/sub".into());
    assert_eq!(run(&*sb, req).await.stdout, "/home/user/sub\n");
    // A background process runs in the warm container, whose agent was started
    // there too.
    let p = sb
        .start_process(paddock_core::ProcessSpec::new([
            "sh",
            "-c",
            "pwd; cat a.txt",
        ]))
        .await
        .unwrap();
    let mut out = p.output();
    let mut text = Vec::new();
    while let Some(c) = out.next().await {
        text.extend_from_slice(&c.data);
    }
    assert_eq!(text, b"/home/user\nfrom the files API");
    let listed = sb.list_files("/home/user").await.unwrap();
    assert!(
        listed.iter().any(|e| e.path == "/home/user/b.txt"),
        "{listed:?}"
    );
    sb.destroy().await.unwrap();
}

/// An engine under a name of its own (`[engines.NAME]`) reports that name on its
/// sandboxes and results, beside the built-in one in the same process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_container_engine_runs_beside_the_built_in_one() {
    let Some(builtin) = engine_with(OciRuntime::Auto) else {
        return;
    };
    let name = paddock_core::EngineName::new("ct-other").unwrap();
    let named = ContainerEngine::named(
        name.clone(),
        &ContainerConfig::default(),
        Limits::defaults(),
    )
    .expect("a second container engine starts");
    assert_eq!(named.name(), name);
    let (a, b) = (sandbox(&builtin).await, sandbox(&named).await);
    assert_eq!(
        (a.engine(), b.engine()),
        (paddock_core::EngineName::CONTAINER, name.clone())
    );
    let (ra, rb) = (run(&*a, sh("echo a")).await, run(&*b, sh("echo b")).await);
    assert_eq!((ra.stdout.as_str(), rb.stdout.as_str()), ("a\n", "b\n"));
    assert_eq!(
        (ra.engine, rb.engine),
        (paddock_core::EngineName::CONTAINER, name)
    );
    a.destroy().await.unwrap();
    b.destroy().await.unwrap();
}

use super::warm::{age as age_of, JS_AGE, PY_AGE};

fn as_tenant(mut r: ExecRequest, tenant: &str) -> ExecRequest {
    r.tenant = Some(tenant.into());
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_container_sandboxs_first_snippets_run_on_runners_started_ahead() {
    const WAIT: f64 = 0.5;
    let config = ContainerConfig {
        runners: paddock_engines::WarmConfig {
            unused_ms: 300,
            ..Default::default()
        },
        ..ContainerConfig::default()
    };
    let Some(engine) = engine_with_agent(&config) else {
        return;
    };
    let py = |t: &str| as_tenant(ExecRequest::new(Program::code(Language::Python, PY_AGE)), t);
    let js = |t: &str| {
        as_tenant(
            ExecRequest::new(Program::code(Language::Javascript, JS_AGE)),
            t,
        )
    };
    let pause = || tokio::time::sleep(Duration::from_secs_f64(WAIT));

    // The first tenant takes both runners, started before it came.
    let sb = sandbox(&engine).await;
    pause().await;
    let r = run(&*sb, py("a")).await;
    assert!(
        age_of(&r) >= WAIT,
        "the first Python ran on a runner started ahead: {r:?}"
    );
    let r = run(&*sb, js("a")).await;
    assert!(age_of(&r) >= WAIT, "and the first JavaScript: {r:?}");
    // Another tenant never gets them.
    let r = run(&*sb, py("b")).await;
    assert!(age_of(&r) < WAIT, "tenant b got its own: {r:?}");
    // After a recycle the container is fresh (reset in place), and so are the
    // runners ahead of the next lease.
    sb.recycle().await.unwrap();
    pause().await;
    let r = run(&*sb, js("c")).await;
    assert!(age_of(&r) >= WAIT, "{r:?}");
    sb.destroy().await.unwrap();

    // Once another tenant's code ran in the container, nobody adopts them.
    let sb = sandbox(&engine).await;
    pause().await;
    run(&*sb, as_tenant(sh("true"), "b")).await;
    let r = run(&*sb, py("a")).await;
    assert!(
        age_of(&r) < WAIT,
        "tenant b's program ran beside the runner: {r:?}"
    );
    sb.destroy().await.unwrap();

    // A lease that leaves them unused for `unused_ms` sees them retired; the
    // recycle that ends it starts them again for the next lease.
    let sb = sandbox(&engine).await;
    pause().await;
    sb.leased();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let r = run(&*sb, py("a")).await;
    assert!(age_of(&r) < WAIT, "the unused runner was retired: {r:?}");
    sb.destroy().await.unwrap();
    let sb = sandbox(&engine).await;
    sb.leased();
    tokio::time::sleep(Duration::from_millis(800)).await;
    sb.recycle().await.unwrap();
    pause().await;
    let r = run(&*sb, py("a")).await;
    assert!(age_of(&r) >= WAIT, "started again at the recycle: {r:?}");
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_turn_that_times_out_beside_a_background_process_leaves_nothing_of_the_snippet() {
    let Some(engine) = engine_with_agent(&ContainerConfig::default()) else {
        return;
    };
    let sb = sandbox(&engine).await;
    // The background process keeps the container through a failed turn.
    let bg = sb
        .start_process(paddock_core::ProcessSpec::new(["sleep", "600"]))
        .await
        .unwrap();
    // A turn that does not complete (a timeout), after starting a daemon.
    let r = run(
        &*sb,
        py(
            "a",
            "import subprocess, sys, time\nprint(subprocess.Popen(['sleep', '300'], start_new_session=True).pid)\nsys.stdout.flush()\ntime.sleep(30)",
        )
        .with_timeout_ms(1_500),
    )
    .await;
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    let (_, daemon) = pid_and_rest(&r);
    let check = format!(
        "import os\nprint(os.path.exists('/proc/{}'))\nprint(sorted(open('/proc/%s/cmdline' % p).read().split(chr(0))[0] for p in os.listdir('/proc') if p.isdigit() and open('/proc/%s/cmdline' % p).read().startswith('sleep')))",
        daemon.trim()
    );
    let r = run(&*sb, py("a", &check)).await;
    let (_, rest) = pid_and_rest(&r);
    assert_eq!(
        rest, "False\n['sleep']\n",
        "the snippet's daemon died, the background process lives: {r:?}"
    );
    bg.kill().unwrap();
    sb.destroy().await.unwrap();
}

/// What a process of the container can see of what earlier leases left: the
/// places a reset clears, the agent's inheritable attributes, the processes.
const LEASE_VIEW: &str = "echo tmp: $(ls -A /tmp)
echo shm: $(ls -A /dev/shm)
echo mqueue: $(ls -A /dev/mqueue)
echo dev: $(ls -A /dev)
echo workspace: $(ls -A /workspace)
echo stdin: $(readlink /dev/stdin)
echo modes: $(stat -c %a /tmp /dev/shm /dev)
echo ipc: $(tail -n +2 /proc/sysvipc/shm | wc -l) $(tail -n +2 /proc/sysvipc/msg | wc -l) $(tail -n +2 /proc/sysvipc/sem | wc -l)
echo sleeping: $(cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^sleep$')
echo nofile: $(prlimit --pid 1 --nofile -o SOFT,HARD --noheadings)
echo autogroup: $(cut -d' ' -f3 /proc/1/autogroup 2>/dev/null)
echo xattrs: $(python3 -c 'import os; print(os.listxattr(\"/tmp\"))')";

/// What one lease leaves behind, everywhere a process of the container can leave
/// something that outlives it.
const LEFTOVERS: &str = "set -e
touch /tmp/leftover /dev/shm/leftover /dev/extra /workspace/leftover
mkdir -p /tmp/d/e && touch /tmp/d/e/f && chmod 0 /tmp/d
ln -s /workspace /tmp/link
rm /dev/stdin && echo x > /dev/stdin
chmod 700 /tmp /dev/shm
ipcmk -M 4096 >/dev/null && ipcmk -Q >/dev/null && ipcmk -S 1 >/dev/null
python3 -c '
import ctypes, os
rt = ctypes.CDLL(\"librt.so.1\", use_errno=True)
assert rt.mq_open(b\"/left\", os.O_CREAT | os.O_RDWR, 0o600, None) >= 0, ctypes.get_errno()
try:
    os.setxattr(\"/tmp\", \"user.left\", b\"1\")
except OSError:
    pass
'
prlimit --pid 1 --nofile=512:
echo 5 > /proc/1/autogroup 2>/dev/null || true
setsid sleep 300 </dev/null >/dev/null 2>&1 &
echo planted";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_used_container_sandbox_is_reset_in_place_and_keeps_nothing_of_the_lease() {
    reset_in_place_on(OciRuntime::Auto).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runc_resets_a_used_container_in_place_too() {
    reset_in_place_on(OciRuntime::Runc).await;
}

/// A lease that leaves something everywhere it can, on `runtime`; the next lease
/// sees the reset container as a fresh one.
async fn reset_in_place_on(runtime: OciRuntime) {
    let config = ContainerConfig {
        runtime,
        ..ContainerConfig::default()
    };
    let Some(engine) = engine_with_agent(&config) else {
        return;
    };
    let sb = engine.open(&SandboxSpec::default()).await.unwrap();
    let fresh = run(&sb, sh(LEASE_VIEW)).await;
    assert!(
        fresh.stdout.contains("ipc: 0 0 0\nsleeping: 0\n"),
        "{fresh:?}"
    );
    assert!(fresh.stdout.contains("mqueue:\n"), "{fresh:?}");
    let id = sb.warm_container_id().expect("a warm container");
    // The agent, which outlives the lease, is out of reach of the code beside it.
    let r = run(
        &sb,
        sh("readlink /proc/1/fd/0 2>/dev/null || echo denied; head -c1 /proc/1/environ 2>/dev/null || echo denied; head -c1 /proc/1/mem 2>/dev/null || echo denied"),
    )
    .await;
    assert_eq!(r.stdout, "denied\ndenied\ndenied\n", "{r:?}");
    // A background process (with a child of its own), and a command that leaves
    // files, IPC objects, a message queue and changed attributes of the agent.
    let bg = sb
        .start_process(paddock_core::ProcessSpec::new([
            "sh",
            "-c",
            "sleep 300 & exec sleep 301",
        ]))
        .await
        .unwrap();
    let r = run(&sb, sh(LEFTOVERS)).await;
    assert_eq!(
        (r.outcome.clone(), r.stdout.as_str()),
        (exit(0), "planted\n"),
        "{r:?}"
    );
    let dirty = run(&sb, sh(LEASE_VIEW)).await;
    assert!(
        dirty.stdout.contains("ipc: 1 1 1\nsleeping: 2\n"),
        "{dirty:?}"
    );
    assert!(dirty.stdout.contains("mqueue: left\n"), "{dirty:?}");
    sb.recycle().await.unwrap();
    // The same container, reset in place; the background process was killed.
    assert_eq!(sb.warm_container_id().as_deref(), Some(id.as_str()));
    assert_eq!(engine.warm_resets(), (1, 0));
    let ended = tokio::time::timeout(Duration::from_secs(10), bg.wait())
        .await
        .expect("the background process's end is reported");
    assert_eq!(ended.signal, Some(libc::SIGKILL), "{ended:?}");
    // The next lease sees what a fresh container shows, nothing of the last one.
    let after = run(&sb, sh(LEASE_VIEW)).await;
    assert_eq!(after.stdout, fresh.stdout, "{after:?}");
    assert_eq!(sb.warm_container_id().as_deref(), Some(id.as_str()));
    // Snippets still run, on runners started again after the reset.
    let r = run(&sb, py("c", "print('ok')")).await;
    assert_eq!(
        (r.outcome.clone(), pid_and_rest(&r).1),
        (exit(0), "ok\n".into()),
        "{r:?}"
    );
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_the_agent_cannot_put_right_is_replaced() {
    // Without a user namespace the runtime makes /dev's devices as nodes, which
    // code in the container can remove and the agent cannot make again.
    let config = ContainerConfig {
        user_namespace: false,
        ..ContainerConfig::default()
    };
    let Some(engine) = engine_with_agent(&config) else {
        return;
    };
    let sb = engine.open(&SandboxSpec::default()).await.unwrap();
    let first = sb.warm_container_id().expect("a warm container");
    let r = run(
        &sb,
        sh("rm /dev/null && echo x > /dev/null && echo replaced"),
    )
    .await;
    assert_eq!(r.stdout, "replaced\n", "{r:?}");
    sb.recycle().await.unwrap();
    let second = sb.warm_container_id().expect("a warm container");
    assert_ne!(first, second, "a fresh container");
    assert_eq!(engine.warm_resets(), (0, 1));
    let r = run(&sb, sh("test -c /dev/null && echo device")).await;
    assert_eq!(r.stdout, "device\n", "{r:?}");
    // A nice value the agent cannot lower again (every program it starts would
    // inherit it).
    let r = run(&sb, sh("renice -n 5 -p 1 >/dev/null && echo reniced")).await;
    assert_eq!(r.stdout, "reniced\n", "{r:?}");
    sb.recycle().await.unwrap();
    let third = sb.warm_container_id().expect("a warm container");
    assert_ne!(second, third);
    assert_eq!(engine.warm_resets(), (0, 2));
    let r = run(&sb, sh("cut -d' ' -f19 /proc/1/stat")).await;
    assert_eq!(r.stdout, "0\n", "{r:?}");
    // A terminal whose handle the last lease still holds: its master is open, so
    // the next lease could open its other side. Replaced.
    let held = sb
        .open_terminal(paddock_core::TerminalSpec::new("sh", Vec::<String>::new()))
        .await
        .unwrap();
    sb.recycle().await.unwrap();
    let fourth = sb.warm_container_id().expect("a warm container");
    assert_ne!(third, fourth);
    assert_eq!(engine.warm_resets(), (0, 3));
    drop(held);
    // One whose handle is gone is closed by the recycle: reset in place.
    let t = sb
        .open_terminal(paddock_core::TerminalSpec::new("sh", Vec::<String>::new()))
        .await
        .unwrap();
    drop(t);
    sb.recycle().await.unwrap();
    assert_eq!(sb.warm_container_id().as_deref(), Some(fourth.as_str()));
    assert_eq!(engine.warm_resets(), (1, 3));
    let r = run(&sb, sh("ls -A /dev/pts")).await;
    assert_eq!(r.stdout, "ptmx\n", "{r:?}");
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runners_are_started_ahead_only_for_the_languages_recent_leases_used() {
    const WAIT: f64 = 0.5;
    let Some(engine) = engine_with_agent(&ContainerConfig::default()) else {
        return;
    };
    let snippet = |lang, source: &str| {
        as_tenant(ExecRequest::new(Program::code(lang, source)), "a").with_timeout_ms(20_000)
    };
    let pause = || tokio::time::sleep(Duration::from_secs_f64(WAIT));
    // A fresh engine starts every runner ahead of need.
    assert_eq!(engine.runner_demand(Language::Python), 1.0);
    let sb = engine.open(&SandboxSpec::default()).await.unwrap();
    // Leases that run no snippet wear the demand down: after 59 of them the runners
    // are no longer started ahead.
    let mut leases = 0;
    while engine.runner_demand(Language::Python) >= 0.05 {
        run(&sb, sh("true")).await;
        sb.recycle().await.unwrap();
        leases += 1;
        assert!(leases < 100, "the demand never fell");
    }
    assert_eq!(leases, 59);
    assert!(engine.runner_demand(Language::Javascript) < 0.05);
    pause().await;
    let r = run(&sb, snippet(Language::Python, PY_AGE)).await;
    assert!(
        age_of(&r) < WAIT,
        "Python's runner started on first use: {r:?}"
    );
    // One lease with a Python snippet brings its runner back for the next leases;
    // JavaScript's stays off.
    sb.recycle().await.unwrap();
    assert!(engine.runner_demand(Language::Python) >= 0.05);
    pause().await;
    let r = run(&sb, snippet(Language::Python, PY_AGE)).await;
    assert!(
        age_of(&r) >= WAIT,
        "Python's runner was started ahead: {r:?}"
    );
    let r = run(&sb, snippet(Language::Javascript, JS_AGE)).await;
    assert!(age_of(&r) < WAIT, "JavaScript's was not: {r:?}");
    assert_eq!(engine.warm_resets(), (60, 0));
    sb.destroy().await.unwrap();
}
