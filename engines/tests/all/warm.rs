//! Warm python workers in the subprocess engine.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use paddock_core::{
    CancelToken, DiscardSink, Engine, ErrorCode, ExecRequest, ExecResult, Language, LimitKind,
    Outcome, OutputChunk, OutputSink, Program, Sandbox, SandboxSpec,
};
use paddock_engines::subprocess::SubprocessEngine;
use paddock_engines::SubprocessConfig;
use serde_json::json;

fn warm_engine() -> SubprocessEngine {
    let mut config = SubprocessConfig::default();
    config.warm.enabled = true;
    SubprocessEngine::new(&config).expect("engine starts")
}

async fn sandbox() -> Arc<dyn Sandbox> {
    warm_engine()
        .create(&SandboxSpec::default())
        .await
        .expect("sandbox opens")
}

fn py(source: &str) -> ExecRequest {
    ExecRequest::new(Program::code(Language::Python, source)).with_timeout_ms(20_000)
}

async fn run(sb: &dyn Sandbox, req: ExecRequest) -> ExecResult {
    sb.exec(req, &DiscardSink, CancelToken::new())
        .await
        .expect("exec runs")
}

fn exit(code: i32) -> Outcome {
    Outcome::Completed {
        exit_code: code,
        signal: None,
    }
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
async fn snippets_run_like_processes_with_a_value() {
    let sb = sandbox().await;
    let r = run(
        &*sb,
        py("import sys\nprint('hi')\nprint('err', file=sys.stderr)\n6 * 7"),
    )
    .await;
    assert_eq!(r.outcome, exit(0), "{r:?}");
    assert_eq!(r.stdout, "hi\n");
    assert_eq!(r.stderr, "err\n");
    assert_eq!(r.value, Some(json!(42)));
    let r = run(&*sb, py("raise ValueError('bad input')")).await;
    assert_eq!(r.outcome, exit(1), "{r:?}");
    assert!(
        r.stderr.contains("ValueError: bad input") && r.stderr.contains("<snippet>"),
        "{}",
        r.stderr
    );
    let r = run(&*sb, py("import sys; sys.exit(3)")).await;
    assert_eq!(r.outcome, exit(3), "{r:?}");
    // Each snippet has its own namespace.
    run(&*sb, py("x = 1")).await;
    let r = run(&*sb, py("x")).await;
    assert_eq!(r.outcome, exit(1), "{r:?}");
    assert!(r.stderr.contains("NameError"), "{}", r.stderr);
    // What JSON cannot hold comes back as its repr.
    let r = run(&*sb, py("{1, 2}")).await;
    assert_eq!(r.value, Some(json!("{1, 2}")));
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_serves_one_tenant() {
    let sb = sandbox().await;
    let as_tenant = |t: &str, src: &str| {
        let mut r = py(src);
        r.tenant = Some(t.into());
        r
    };
    // Interpreter state lives on between turns of one tenant's worker …
    run(&*sb, as_tenant("a", "import sys; sys.paddock_mark = 'a'")).await;
    let r = run(
        &*sb,
        as_tenant("a", "import sys; getattr(sys, 'paddock_mark', None)"),
    )
    .await;
    assert_eq!(
        r.value,
        Some(json!("a")),
        "the same warm worker served tenant a: {r:?}"
    );
    // … and never reaches another tenant.
    let r = run(
        &*sb,
        as_tenant("b", "import sys; getattr(sys, 'paddock_mark', None)"),
    )
    .await;
    // (A last expression that is None gives no value, as in a notebook.)
    assert_eq!(r.value, None, "{r:?}");
    assert_eq!(r.outcome, exit(0), "{r:?}");
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_measured_per_turn() {
    let sb = sandbox().await;
    let r = run(
        &*sb,
        py("b = bytearray(64 << 20)\nx = 0\nfor i in range(3_000_000): x += i\ndel b"),
    )
    .await;
    assert_eq!(r.outcome, exit(0), "{r:?}");
    assert!(r.usage.cpu_ms > 0, "{:?}", r.usage);
    assert!(r.usage.peak_memory_bytes >= 64 << 20, "{:?}", r.usage);
    // The peak is the turn's own, not the worker's lifetime high-water mark.
    let r = run(&*sb, py("1")).await;
    assert!(r.usage.peak_memory_bytes > 0, "{:?}", r.usage);
    assert!(r.usage.peak_memory_bytes < 48 << 20, "{:?}", r.usage);
    assert!(r.usage.cpu_ms < 1_000, "{:?}", r.usage);
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_and_cancel_stop_the_turn_and_the_worker_is_replaced() {
    let sb = sandbox().await;
    let mut req = py("while True: pass");
    req.limits.timeout_ms = Some(300);
    let t = Instant::now();
    let r = run(&*sb, req).await;
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let cancel = CancelToken::new();
    let c = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        c.cancel();
    });
    let r = sb
        .exec(py("import time; time.sleep(30)"), &DiscardSink, cancel)
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Cancelled, "{r:?}");
    let r = run(&*sb, py("'alive'")).await;
    assert_eq!(r.value, Some(json!("alive")), "{r:?}");
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_dies_mid_turn_fails_the_turn_and_is_replaced() {
    let sb = sandbox().await;
    let r = run(
        &*sb,
        py("import os\nprint('going', flush=True)\nos._exit(9)"),
    )
    .await;
    assert_eq!(
        r.outcome.error_code(),
        Some(ErrorCode::WorkerFailed),
        "{r:?}"
    );
    // A frame cut in half: the runner's frame channel gets half a line, then it dies.
    let r = run(
        &*sb,
        py("import os\nos.write(3, b'{\"v\":1,\"kind\":\"output\",\"id\":')\nos._exit(0)"),
    )
    .await;
    assert_eq!(
        r.outcome.error_code(),
        Some(ErrorCode::WorkerFailed),
        "{r:?}"
    );
    if let Outcome::Failed { error } = &r.outcome {
        assert!(error.message.contains("middle of a frame"), "{error}");
    }
    // Garbage on the frame channel is a protocol error.
    let r = run(
        &*sb,
        py("import os\nos.write(3, b'not json\\n')\nimport time; time.sleep(5)"),
    )
    .await;
    assert_eq!(
        r.outcome.error_code(),
        Some(ErrorCode::ProtocolError),
        "{r:?}"
    );
    let r = run(&*sb, py("'replaced'")).await;
    assert_eq!(r.value, Some(json!("replaced")), "{r:?}");
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_streams_live_and_background_processes_die_with_the_turn() {
    let sb = sandbox().await;
    let sink = Collect::default();
    let started = Instant::now();
    let r = sb
        .exec(
            py("import time\nprint('early')\ntime.sleep(0.6)\nprint('late')"),
            &sink,
            CancelToken::new(),
        )
        .await
        .unwrap();
    let ended = Instant::now();
    assert_eq!(r.stdout, "early\nlate\n", "{r:?}");
    let chunks = sink.0.lock().unwrap().clone();
    let mut seen = Vec::new();
    let at = chunks
        .iter()
        .find_map(|(at, c)| {
            seen.extend_from_slice(&c.data);
            seen.starts_with(b"early\n").then_some(*at)
        })
        .expect("`early` reached the sink");
    assert!(
        at + Duration::from_millis(300) < ended,
        "`early` arrived {:?} after the start, the run ended {:?} after it",
        at - started,
        ended - started
    );
    let r = run(
        &*sb,
        py("import subprocess\np = subprocess.Popen(['sleep', '30'])\np.pid"),
    )
    .await;
    let pid = r
        .value
        .as_ref()
        .and_then(|v| v.as_i64())
        .expect("the child's pid");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit(')').next().unwrap_or("").trim().chars().next();
    assert!(
        stat.is_empty() || state == Some('Z'),
        "`sleep 30` left by the snippet must be dead after its turn: {stat}"
    );
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_limit_holds_for_warm_workers() {
    let engine = warm_engine();
    if engine.host_support().cgroup.is_err() {
        eprintln!("skipped: no cgroup on this host");
        return;
    }
    let sb = engine.create(&SandboxSpec::default()).await.unwrap();
    let mut req = py("x = bytearray(600 << 20)\nx[::4096] = b'1' * len(x[::4096])\nlen(x)");
    req.limits.memory_bytes = Some(128 << 20);
    let r = run(&*sb, req).await;
    assert_eq!(
        r.outcome,
        Outcome::LimitExceeded {
            limit: LimitKind::Memory
        },
        "{r:?}"
    );
    let r = run(&*sb, py("'after'")).await;
    assert_eq!(r.value, Some(json!("after")), "{r:?}");
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_warm_mode_cannot_honour_exactly_run_cold() {
    let sb = sandbox().await;
    let mut with_stdin = py("import sys; print(sys.stdin.read().upper())");
    with_stdin.stdin = Some("from stdin".into());
    let r = run(&*sb, with_stdin).await;
    assert_eq!(r.stdout, "FROM STDIN\n", "{r:?}");
    assert_eq!(r.value, None, "cold runs have no value");
    let mut with_env = py("import os; print(os.environ['GREETING'])");
    with_env.env.insert("GREETING".into(), "hello".into());
    let r = run(&*sb, with_env).await;
    assert_eq!(r.stdout, "hello\n", "{r:?}");
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_during_a_warm_turn_ends_it() {
    let sb = sandbox().await;
    let runner = {
        let sb = sb.clone();
        tokio::spawn(async move { run(&*sb, py("import time; time.sleep(30)")).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    sb.destroy().await.unwrap();
    let r = runner.await.unwrap();
    assert!(!r.is_success(), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

/// The age in seconds of the process that runs the snippet: its start time
/// (`/proc/self/stat` field 22, in clock ticks of 1/100 s) against the uptime.
/// A snippet that answers its interpreter's age in seconds (Python, then Node).
pub(super) const PY_AGE: &str = "import os\nst = open('/proc/self/stat').read().rsplit(')', 1)[1].split()\nup = float(open('/proc/uptime').read().split()[0])\nround(up - int(st[19]) / os.sysconf('SC_CLK_TCK'), 3)";
pub(super) const JS_AGE: &str = "const fs = require('fs'); const st = fs.readFileSync('/proc/self/stat', 'utf8').split(')').pop().trim().split(' '); (parseFloat(fs.readFileSync('/proc/uptime', 'utf8')) - parseInt(st[19]) / 100).toFixed(3)";

pub(super) fn age(r: &ExecResult) -> f64 {
    match &r.value {
        Some(serde_json::Value::Number(n)) => n.as_f64().unwrap(),
        Some(serde_json::Value::String(s)) => s.parse().unwrap(),
        other => panic!("no age in {other:?}: {r:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_sandboxs_runners_serve_its_first_tenant_and_no_other() {
    let as_tenant = |mut req: ExecRequest, t: &str| {
        req.tenant = Some(t.into());
        req
    };
    // Opened for no tenant, as the pool opens its idle sandboxes: its runners start
    // now, and are older than any execution below by the wait.
    const WAIT: f64 = 0.5;
    let pause = || tokio::time::sleep(Duration::from_secs_f64(WAIT));

    // The first tenant to run code takes both runners: a command of its own does
    // not spoil them, nor does its own Python for its JavaScript.
    let sb = sandbox().await;
    pause().await;
    let mut cmd = ExecRequest::new(Program::Command {
        argv: vec!["/bin/true".into()],
    });
    cmd.tenant = Some("a".into());
    run(&*sb, cmd).await;
    let r = run(&*sb, as_tenant(py(PY_AGE), "a")).await;
    assert!(age(&r) >= WAIT, "tenant a's first Python ran warm: {r:?}");
    let r = run(&*sb, as_tenant(js(JS_AGE), "a")).await;
    assert!(
        age(&r) >= WAIT,
        "tenant a's first JavaScript ran warm: {r:?}"
    );
    // Another tenant never gets them: fresh interpreters, started for it.
    let r = run(&*sb, as_tenant(py(PY_AGE), "b")).await;
    assert!(age(&r) < WAIT, "tenant b got a fresh Python: {r:?}");
    let r = run(&*sb, as_tenant(js(JS_AGE), "b")).await;
    assert!(age(&r) < WAIT, "tenant b got a fresh node: {r:?}");
    sb.destroy().await.unwrap();

    // Once another tenant has run anything beside them, nobody adopts them.
    let sb = sandbox().await;
    pause().await;
    run(&*sb, as_tenant(py("1"), "a")).await;
    let r = run(&*sb, as_tenant(js(JS_AGE), "b")).await;
    assert!(age(&r) < WAIT, "node ran beside tenant a's code: {r:?}");
    sb.destroy().await.unwrap();

    // Nor after a process, whose tenant the engine does not know.
    let sb = sandbox().await;
    pause().await;
    let p = sb
        .start_process(paddock_core::interactive::ProcessSpec::new(["/bin/true"]))
        .await
        .expect("a process starts");
    drop(p);
    let r = run(&*sb, as_tenant(py(PY_AGE), "a")).await;
    assert!(age(&r) < WAIT, "a process ran beside the runner: {r:?}");
    sb.destroy().await.unwrap();
}

fn js(source: &str) -> ExecRequest {
    ExecRequest::new(Program::code(Language::Javascript, source)).with_timeout_ms(20_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_snippets_run_warm_too() {
    let sb = sandbox().await;
    // The end of a Python turn spares the other language's worker.
    let r = run(&*sb, py("1")).await;
    assert_eq!(r.value, Some(json!(1)), "{r:?}");
    let r = run(&*sb, js("console.log('hi'); console.error('err'); 6 * 7")).await;
    assert_eq!(r.outcome, exit(0), "{r:?}");
    assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("hi\n", "err\n"));
    assert_eq!(r.value, Some(json!(42)));
    let r = run(&*sb, js("Promise.resolve({ok: [1, 2]})")).await;
    assert_eq!(r.value, Some(json!({"ok": [1, 2]})), "{r:?}");
    let r = run(&*sb, js("throw new TypeError('bad input')")).await;
    assert_eq!(r.outcome, exit(1), "{r:?}");
    assert!(r.stderr.contains("TypeError: bad input"), "{}", r.stderr);
    assert!(
        !r.stderr.contains("node.js:"),
        "runner frames are trimmed: {}",
        r.stderr
    );
    let r = run(&*sb, js("process.exit(4)")).await;
    assert_eq!(r.outcome, exit(4), "{r:?}");
    // A fresh context per snippet: the same `let` twice, and no globals carried over.
    run(&*sb, js("let x = 1; globalThis.leak = 1")).await;
    let r = run(&*sb, js("let x = 2; typeof leak")).await;
    assert_eq!(r.value, Some(json!("undefined")), "{r:?}");
    let mut spin = js("while (true) {}");
    spin.limits.timeout_ms = Some(300);
    let t = Instant::now();
    let r = run(&*sb, spin).await;
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let r = run(&*sb, js("'after'")).await;
    assert_eq!(r.value, Some(json!("after")), "{r:?}");
    sb.destroy().await.unwrap();
}

/// The example handler shipped with the engines crate, in JavaScript.
fn sum_handler() -> paddock_engines::HandlerConfig {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/handlers/sum.js");
    paddock_engines::HandlerConfig {
        command: vec!["node".into(), script.to_string_lossy().into_owned()],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_handlers_and_module_functions_answer_invokes() {
    let mut config = SubprocessConfig::default();
    config.warm.enabled = true;
    config.handlers.insert("sum".into(), sum_handler());
    let engine = SubprocessEngine::new(&config).unwrap();
    assert!(engine
        .capabilities()
        .supports_program(paddock_core::ProgramKind::Invoke));
    let sb = engine.create(&SandboxSpec::default()).await.unwrap();
    let invoke = |handler: &str, input: serde_json::Value| {
        ExecRequest::new(Program::Invoke {
            handler: handler.into(),
            input,
        })
        .with_timeout_ms(20_000)
    };
    // The example handler in JavaScript, kept warm between invocations.
    for _ in 0..3 {
        let r = run(&*sb, invoke("sum", json!({"numbers": [1, 2, 3.5]}))).await;
        assert_eq!(r.outcome, exit(0), "{r:?}");
        assert_eq!(r.value, Some(json!(6.5)));
        assert_eq!(r.stderr, "summing 3 numbers\n", "log frames are output");
    }
    let r = run(&*sb, invoke("sum", json!({"numbers": "six"}))).await;
    assert_eq!(
        r.outcome.error_code(),
        Some(ErrorCode::WorkerFailed),
        "{r:?}"
    );
    if let Outcome::Failed { error } = &r.outcome {
        assert!(error.message.contains("BAD_INPUT"), "{error}");
    }
    // `module:function` on the warm Python runner, from a file in the workdir.
    sb.write_file(
        "tools/stats.py",
        b"def mean(data):\n    return sum(data['xs']) / len(data['xs'])\n",
    )
    .await
    .unwrap();
    let r = run(
        &*sb,
        invoke("tools/stats.py:mean", json!({"xs": [1, 2, 3, 4]})),
    )
    .await;
    assert_eq!(r.value, Some(json!(2.5)), "{r:?}");
    // Neither a configured name nor `module:function`: refused before it runs.
    let err = sb
        .exec(
            invoke("nope", json!(null)),
            &DiscardSink,
            CancelToken::new(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::CapabilityNotSupported);
    sb.destroy().await.unwrap();
}

/// A long-running handler that suspends on an approval token and keeps the
/// invocation's state in memory; with `--one-shot` it exits with code 42 after
/// suspending and keeps the state in a file instead (protocol §7).
const APPROVAL_HANDLER: &str = r#"
import json, os, sys
one_shot = "--one-shot" in sys.argv
pending = {}
def send(f):
    sys.stdout.write(json.dumps(dict({"v": 1}, **f)) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    f = json.loads(line)
    if f["kind"] == "invoke":
        pending[f["id"]] = f["input"]
        if one_shot:
            with open("state-" + f["id"] + ".json", "w") as out:
                json.dump(f["input"], out)
        send({"kind": "suspend", "id": f["id"], "token_id": "approve-" + f["id"]})
        if one_shot:
            sys.exit(42)
    elif f["kind"] == "resume":
        if one_shot:
            with open("state-" + f["id"] + ".json") as saved:
                task = json.load(saved)
        else:
            task = pending.pop(f["id"])
        send({"kind": "output", "id": f["id"], "output": {"task": task, "approved": f["value"]}})
        if one_shot:
            sys.exit(0)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_suspend_and_resume_long_running_and_one_shot() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("approve.py");
    std::fs::write(&script, APPROVAL_HANDLER).unwrap();
    let script = script.to_string_lossy().into_owned();
    let mut config = SubprocessConfig::default();
    for (name, extra) in [("approve", None), ("approve_once", Some("--one-shot"))] {
        let mut command = vec!["python3".to_string(), script.clone()];
        command.extend(extra.map(String::from));
        config
            .handlers
            .insert(name.into(), paddock_engines::HandlerConfig { command });
    }
    let engine = SubprocessEngine::new(&config).unwrap();
    assert!(engine.capabilities().has_feature("suspend"));
    assert!(engine
        .capabilities()
        .supports_program(paddock_core::ProgramKind::Resume));
    let sb = engine.create(&SandboxSpec::default()).await.unwrap();
    for handler in ["approve", "approve_once"] {
        let r = run(
            &*sb,
            ExecRequest::new(Program::Invoke {
                handler: handler.into(),
                input: json!({"deploy": "v2"}),
            }),
        )
        .await;
        let Outcome::Suspended { token_id } = &r.outcome else {
            panic!("{handler}: expected a suspension, got {r:?}");
        };
        assert!(r.outcome.error_code().is_none());
        let token_id = token_id.clone();
        // An unknown token is not found; the right one continues the invocation.
        let resume = |token: &str, value: serde_json::Value| {
            ExecRequest::new(Program::Resume {
                token_id: token.into(),
                value,
            })
        };
        let err = sb
            .exec(
                resume("no-such-token", json!(true)),
                &DiscardSink,
                CancelToken::new(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
        // Another tenant cannot resume it.
        let mut other = resume(&token_id, json!(true));
        other.tenant = Some("someone-else".into());
        let err = sb
            .exec(other, &DiscardSink, CancelToken::new())
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
        let r = run(&*sb, resume(&token_id, json!({"by": "alice"}))).await;
        assert_eq!(r.outcome, exit(0), "{handler}: {r:?}");
        assert_eq!(
            r.value,
            Some(json!({"task": {"deploy": "v2"}, "approved": {"by": "alice"}})),
            "{handler}"
        );
        // A token resumes once.
        let again = sb
            .exec(
                resume(&token_id, json!(true)),
                &DiscardSink,
                CancelToken::new(),
            )
            .await
            .unwrap_err();
        assert_eq!(again.code, ErrorCode::NotFound);
    }
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_reaches_the_worker_that_suspended_even_past_max_turns() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("approve.py");
    std::fs::write(&script, APPROVAL_HANDLER).unwrap();
    let mut config = SubprocessConfig::default();
    // Recycle-after-1: the worker is spent after the invoke, but the suspended
    // invocation lives in its memory.
    config.warm.max_turns = 1;
    config.handlers.insert(
        "approve".into(),
        paddock_engines::HandlerConfig {
            command: vec!["python3".into(), script.to_string_lossy().into_owned()],
        },
    );
    let engine = SubprocessEngine::new(&config).unwrap();
    let sb = engine.create(&SandboxSpec::default()).await.unwrap();
    let invoke = |n: u32| {
        ExecRequest::new(Program::Invoke {
            handler: "approve".into(),
            input: json!({ "n": n }),
        })
    };
    let r = run(&*sb, invoke(1)).await;
    let Outcome::Suspended { token_id } = r.outcome.clone() else {
        panic!("expected a suspension, got {r:?}");
    };
    // The invocation id is the execution's, so the handler's token carries it.
    assert_eq!(token_id, format!("approve-{}", r.id));
    let r = run(
        &*sb,
        ExecRequest::new(Program::Resume {
            token_id,
            value: json!("ok"),
        }),
    )
    .await;
    assert_eq!(r.outcome, exit(0), "{r:?}");
    assert_eq!(r.value, Some(json!({"task": {"n": 1}, "approved": "ok"})));
    // A fresh invocation gets a fresh worker, as max_turns says.
    let r = run(&*sb, invoke(2)).await;
    assert!(matches!(r.outcome, Outcome::Suspended { .. }), "{r:?}");
    sb.destroy().await.unwrap();
}

/// What a Python snippet reports of its process: its parent's command line, its
/// descriptors, and what a program of the sandbox would share with it.
const PY_SELF: &str = r#"
import json, os, resource, sys
ppid = os.getppid()
parent = open('/proc/%d/cmdline' % ppid).read().split('\0')
fds = [f for f in sorted(int(f) for f in os.listdir('/proc/self/fd')) if os.path.exists('/proc/self/fd/%d' % f)]
print(json.dumps({
    'ppid': ppid,
    'exe': sys.executable,
    'parent': parent,
    'fds': fds,
    'same': {
        'env': dict(os.environ),
        'cwd': os.getcwd(),
        'net': os.readlink('/proc/self/ns/net'),
        'mnt': os.readlink('/proc/self/ns/mnt'),
        'rlimits': [resource.getrlimit(r) for r in range(16)],
        'session_leader': os.getsid(0) == os.getpid(),
    },
    'cgroup': open('/proc/self/cgroup').read(),
    'parent_cgroup': open('/proc/%d/cgroup' % ppid).read(),
}))
"#;

fn report(r: &ExecResult) -> serde_json::Value {
    assert_eq!(r.outcome, exit(0), "{r:?}");
    serde_json::from_str(r.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {r:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_runners_are_forked_into_their_sandbox_from_one_server() {
    let engine = warm_engine();
    let a = engine.create(&SandboxSpec::default()).await.unwrap();
    let b = engine.create(&SandboxSpec::default()).await.unwrap();
    let mut as_a = py(PY_SELF);
    as_a.tenant = Some("a".into());
    let ra = report(&run(&*a, as_a).await);
    // Forked from the engine's fork server, which is no sandbox's.
    let parent = ra["parent"].as_array().unwrap();
    assert!(
        parent.iter().any(|p| p == "--zygote"),
        "the runner's parent is the fork server: {ra}"
    );
    assert_ne!(ra["ppid"], json!(std::process::id()), "{ra}");
    assert_ne!(
        ra["cgroup"], ra["parent_cgroup"],
        "the runner left the server's cgroup: {ra}"
    );
    // Nothing of the server's descriptors: stdin, stdout, stderr and the frames.
    assert_eq!(ra["fds"], json!([0, 1, 2, 3]), "{ra}");
    // It has what a program started in the sandbox has: environment, working
    // directory, network and mount namespaces, rlimits, a session of its own.
    // (The interpreter itself: a launcher such as pyenv's shim would change PATH.)
    let exe = ra["exe"].as_str().unwrap();
    let mut cold = ExecRequest::new(Program::command([exe, "-c", PY_SELF]));
    cold.tenant = Some("a".into());
    let rc = report(&run(&*a, cold).await);
    for (key, forked) in ra["same"].as_object().unwrap() {
        let program = &rc["same"][key];
        if let (Some(f), Some(p)) = (forked.as_object(), program.as_object()) {
            let differ: Vec<_> = f
                .keys()
                .chain(p.keys())
                .filter(|k| f.get(*k) != p.get(*k))
                .map(|k| (k, f.get(k), p.get(k)))
                .collect();
            assert!(differ.is_empty(), "{key} differs: {differ:?}");
        }
        assert_eq!(forked, program, "a forked runner's {key} is a program's");
    }
    // One server for the engine; each sandbox's runner is its own process, set up
    // for its own sandbox, and shares no interpreter state with another tenant's.
    let mut mark = py("import sys\nsys.paddock_mark = 'a'\nprint(1)");
    mark.tenant = Some("a".into());
    assert_eq!(run(&*a, mark).await.stdout, "1\n");
    let mut as_b = py(&format!(
        "{PY_SELF}\nimport sys\nprint(hasattr(sys, 'paddock_mark'))"
    ));
    as_b.tenant = Some("b".into());
    let r = run(&*b, as_b).await;
    let (json_line, marked) = r.stdout.trim().split_once('\n').unwrap();
    assert_eq!(marked, "False", "{r:?}");
    let rb: serde_json::Value = serde_json::from_str(json_line).unwrap();
    assert_eq!(rb["ppid"], ra["ppid"], "one fork server per engine");
    assert_ne!(rb["same"]["cwd"], ra["same"]["cwd"]);
    assert_ne!(rb["same"]["net"], ra["same"]["net"]);
    a.destroy().await.unwrap();
    b.destroy().await.unwrap();

    // A sandbox's open-files limit holds for its runner too, set after the runner's
    // descriptors are in place.
    let mut spec = SandboxSpec::default();
    spec.limits.open_files = Some(16);
    let c = engine.create(&spec).await.unwrap();
    let rf = report(&run(&*c, py(PY_SELF)).await);
    assert!(
        rf["parent"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == "--zygote"),
        "{rf}"
    );
    assert_eq!(rf["fds"], json!([0, 1, 2, 3]), "{rf}");
    let exe = rf["exe"].as_str().unwrap();
    let cold = report(
        &run(
            &*c,
            ExecRequest::new(Program::command([exe, "-c", PY_SELF])),
        )
        .await,
    );
    assert_eq!(
        rf["same"]["rlimits"], cold["same"]["rlimits"],
        "{rf} {cold}"
    );
    assert_eq!(
        rf["same"]["rlimits"][7],
        json!([16, 16]),
        "RLIMIT_NOFILE: {rf}"
    );
    c.destroy().await.unwrap();

    // Without the fork server, the engine starts the interpreter itself.
    let mut config = SubprocessConfig::default();
    config.warm.fork_server = false;
    let engine = SubprocessEngine::new(&config).unwrap();
    let sb = engine.create(&SandboxSpec::default()).await.unwrap();
    let r = report(&run(&*sb, py(PY_SELF)).await);
    assert_eq!(r["ppid"], json!(std::process::id()), "{r}");
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runners_a_lease_leaves_unused_are_retired() {
    // Runners older than WAIT were started ahead of need; younger ones were started
    // for the snippet that reports their age.
    const WAIT: f64 = 0.5;
    let mut config = SubprocessConfig::default();
    config.warm.unused_ms = 300;
    let engine = SubprocessEngine::new(&config).unwrap();
    let mut sbs = Vec::new();
    for _ in 0..4 {
        sbs.push(engine.create(&SandboxSpec::default()).await.unwrap());
    }
    let [idle, unused, used, recycled] = &sbs[..] else {
        unreachable!()
    };
    tokio::time::sleep(Duration::from_secs_f64(WAIT)).await;
    unused.leased();
    used.leased();
    recycled.leased();
    // A lease's own use keeps a runner: it is its tenant's now.
    let js_used = run(&**used, js(JS_AGE)).await;
    assert!(age(&js_used) >= WAIT, "warm at first: {js_used:?}");
    recycled.recycle().await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;

    // Unused through the lease's first unused_ms: both retired, started afresh
    // (Python forked) for the snippets that follow.
    let r = run(&**unused, js(JS_AGE)).await;
    assert!(age(&r) < WAIT, "the unused node was retired: {r:?}");
    let r = run(&**unused, py(PY_AGE)).await;
    assert!(age(&r) < WAIT, "the unused Python was retired: {r:?}");
    // The used node stays; the Python beside it, unused, went.
    let r = run(&**used, js(JS_AGE)).await;
    assert!(
        age(&r) >= age(&js_used),
        "the same node: {js_used:?} then {r:?}"
    );
    let r = run(&**used, py(PY_AGE)).await;
    assert!(age(&r) < WAIT, "{r:?}");
    // A sandbox the pool holds (never leased, or recycled before the retirement
    // came due) keeps its runners for its next lease.
    for sb in [idle, recycled] {
        let r = run(&**sb, js(JS_AGE)).await;
        assert!(age(&r) >= WAIT + 0.8, "{r:?}");
        let r = run(&**sb, py(PY_AGE)).await;
        assert!(age(&r) >= WAIT + 0.8, "{r:?}");
    }
    for sb in sbs {
        sb.destroy().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_made_in_a_burst_start_node_once_the_burst_is_over() {
    let engine = SubprocessEngine::new(&SubprocessConfig::default()).unwrap();
    // Four at once: those made while others were being made fork Python only, and
    // leave Node for after the burst.
    let spec = SandboxSpec::default();
    let made = tokio::join!(
        engine.create(&spec),
        engine.create(&spec),
        engine.create(&spec),
        engine.create(&spec)
    );
    let burst_over = Instant::now();
    let sbs = [made.0, made.1, made.2, made.3].map(Result::unwrap);
    // A leased one starts what its snippets need, when they need it.
    sbs[1].leased();
    // A snippet that comes first in one of them starts what it needs (and the
    // runner started after the burst, stale then, does not replace it).
    let first = run(&*sbs[0], js(JS_AGE)).await;
    assert_eq!(first.exit_code(), Some(0), "{first:?}");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for (i, sb) in sbs.iter().enumerate() {
        let r = run(&**sb, js(JS_AGE)).await;
        let waited = burst_over.elapsed().as_secs_f64();
        if i == 1 {
            assert!(age(&r) < 1.0, "leased: Node started for its snippet: {r:?}");
            continue;
        }
        // Started ahead of the snippet, and not long before the burst ended (the
        // one made first, before the others began, started its own at once).
        assert!(
            age(&r) >= 1.0 && age(&r) <= waited + 1.5,
            "sandbox {i}: Node {} s old, {waited} s after the burst: {r:?}",
            age(&r)
        );
        let r = run(&**sb, py(PY_AGE)).await;
        assert!(age(&r) >= 1.0, "sandbox {i}: {r:?}");
    }
    for sb in sbs {
        sb.destroy().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forked_runner_that_is_replaced_takes_its_session_with_it_even_without_cgroups() {
    let config = SubprocessConfig {
        cgroup: paddock_engines::CgroupMode::Off,
        ..Default::default()
    };
    let engine = SubprocessEngine::new(&config).unwrap();
    let sb = engine.create(&SandboxSpec::default()).await.unwrap();
    // A child in the runner's session, then a failed turn: the runner is replaced.
    let r = run(
        &*sb,
        py("import os, subprocess\nprint(os.getppid())\nprint(subprocess.Popen(['sleep', '300']).pid)\nraise SystemExit(1)"),
    )
    .await;
    assert_eq!(r.outcome, exit(1), "{r:?}");
    let mut lines = r.stdout.lines();
    let server = lines.next().unwrap().to_string();
    let child: u32 = lines.next().unwrap().parse().unwrap();
    // The fork server reaped the runner and killed the rest of its session.
    let gone = format!(
        "import os, time\nfor _ in range(200):\n    try:\n        st = open('/proc/{child}/stat').read().rsplit(')', 1)[1].split()[0]\n    except FileNotFoundError:\n        break\n    if st == 'Z':\n        break\n    time.sleep(0.01)\nelse:\n    raise SystemExit('still running')\nprint(os.getppid())"
    );
    let r = run(&*sb, py(&gone)).await;
    assert_eq!(r.outcome, exit(0), "the runner's child outlived it: {r:?}");
    assert_eq!(
        r.stdout.trim(),
        server,
        "forked from the same server: {r:?}"
    );
    sb.destroy().await.unwrap();
}
