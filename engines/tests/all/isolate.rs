//! The QuickJS isolate engine against real QuickJS.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use paddock_core::{
    CancelToken, DiscardSink, Engine, ErrorCode, ExecRequest, ExecResult, Language, LimitKind,
    Outcome, OutputChunk, OutputSink, Program, Sandbox, SandboxSpec, StreamKind,
};
use paddock_engines::isolate::{HostModules, IsolateEngine};
use paddock_engines::IsolateConfig;
use serde_json::json;

fn js(source: &str) -> ExecRequest {
    ExecRequest::new(Program::code(Language::Javascript, source)).with_timeout_ms(10_000)
}

fn call(function: &str, input: serde_json::Value) -> ExecRequest {
    ExecRequest::new(Program::Invoke {
        handler: function.into(),
        input,
    })
    .with_timeout_ms(10_000)
}

async fn sandbox_of(engine: &IsolateEngine) -> Arc<dyn Sandbox> {
    engine
        .create(&SandboxSpec::default())
        .await
        .expect("sandbox opens")
}

async fn sandbox() -> Arc<dyn Sandbox> {
    sandbox_of(&IsolateEngine::with_defaults().expect("engine starts")).await
}

async fn run(sb: &dyn Sandbox, req: ExecRequest) -> ExecResult {
    sb.exec(req, &DiscardSink, CancelToken::new())
        .await
        .expect("exec runs")
}

fn completed(code: i32) -> Outcome {
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

#[tokio::test]
async fn invoke_calls_a_function_with_json_arguments() {
    let sb = sandbox().await;
    let r = run(&*sb, call("(a, b) => a * b", json!([6, 7]))).await;
    assert_eq!(r.outcome, completed(0), "{r:?}");
    assert_eq!(r.value, Some(json!(42)));
    assert_eq!(r.engine, paddock_core::EngineName::ISOLATE);
    // A non-array input is the single argument; null passes none.
    let r = run(
        &*sb,
        call("(o) => o.items.length", json!({"items": [1, 2, 3]})),
    )
    .await;
    assert_eq!(r.value, Some(json!(3)));
    let r = run(
        &*sb,
        call("function () { return arguments.length }", json!(null)),
    )
    .await;
    assert_eq!(r.value, Some(json!(0)));
    // Async handlers are awaited.
    let r = run(
        &*sb,
        call("async (x) => { await null; return x + 1 }", json!([1])),
    )
    .await;
    assert_eq!(r.value, Some(json!(2)));
    // Something that is not a function is refused, not run.
    let r = run(&*sb, call("42", json!([]))).await;
    assert_eq!(
        r.outcome.error_code(),
        Some(ErrorCode::InvalidOptions),
        "{r:?}"
    );
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn configured_handlers_are_called_by_name() {
    let mut config = IsolateConfig::default();
    config
        .handlers
        .insert("multiply".into(), "(a, b) => a * b".into());
    let engine = IsolateEngine::new(&config).unwrap();
    let sb = sandbox_of(&engine).await;
    let r = run(&*sb, call("multiply", json!([6, 7]))).await;
    assert_eq!(r.value, Some(json!(42)), "{r:?}");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn values_round_trip_and_unserializable_ones_come_back_as_strings() {
    let sb = sandbox().await;
    let cases = [
        ("1 + 1", Some(json!(2))),
        (
            "({a: [1, 'x', null], b: {c: true}})",
            Some(json!({"a": [1, "x", null], "b": {"c": true}})),
        ),
        ("'text'", Some(json!("text"))),
        ("undefined", None),
        ("null", Some(json!(null))),
        ("10n ** 20n", Some(json!("100000000000000000000"))),
        (
            "(function f() { return 1 })",
            Some(json!("function f() { return 1 }")),
        ),
        (
            "const o = {}; o.self = o; o",
            Some(json!("[object Object]")),
        ),
        ("Promise.resolve(5)", Some(json!(5))),
        ("Promise.resolve('awaited')", Some(json!("awaited"))),
        ("(async () => 7)()", Some(json!(7))),
        (
            "await new Promise(r => setTimeout(() => r('late'), 20))",
            Some(json!("late")),
        ),
        ("export default Math.max(3, 9)", Some(json!(9))),
    ];
    for (source, want) in cases {
        let r = run(&*sb, js(source)).await;
        assert_eq!(r.outcome, completed(0), "{source}: {r:?}");
        assert_eq!(r.value, want, "{source}");
    }
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn safe_builtins_are_there() {
    let sb = sandbox().await;
    let r = run(
        &*sb,
        js("[typeof Math.sqrt, typeof JSON.parse, typeof Date.now, typeof Map, typeof Promise, typeof RegExp, typeof Uint8Array, typeof Proxy].join()"),
    )
    .await;
    assert_eq!(
        r.value,
        Some(json!(
            "function,function,function,function,function,function,function,function"
        )),
        "{r:?}"
    );
    // No host escape hatches: no process, require or fetch.
    let r = run(
        &*sb,
        js("[typeof process, typeof require, typeof fetch].join()"),
    )
    .await;
    assert_eq!(r.value, Some(json!("undefined,undefined,undefined")));
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn uncaught_errors_complete_with_exit_code_one() {
    let sb = sandbox().await;
    let r = run(
        &*sb,
        js("console.log('before'); throw new TypeError('boom')"),
    )
    .await;
    assert_eq!(r.outcome, completed(1));
    assert_eq!(r.stdout, "before\n");
    assert!(
        r.stderr.starts_with("Uncaught TypeError: boom"),
        "{}",
        r.stderr
    );
    let r = run(&*sb, js("let = ;")).await;
    assert_eq!(r.outcome, completed(1));
    assert!(r.stderr.contains("SyntaxError"), "{}", r.stderr);
    let r = run(&*sb, js("await Promise.reject(new Error('nope'))")).await;
    assert_eq!(r.outcome, completed(1));
    assert!(r.stderr.contains("Error: nope"), "{}", r.stderr);
    let r = run(&*sb, js("await new Promise(() => {})")).await;
    assert_eq!(r.outcome, completed(1));
    assert!(r.stderr.contains("never settled"), "{}", r.stderr);
    // Timers still pending when the script ends run, as node runs them.
    let r = run(
        &*sb,
        js("setTimeout(() => console.log('later'), 10); 'now'"),
    )
    .await;
    assert_eq!(r.value, Some(json!("now")));
    assert_eq!(r.stdout, "later\n");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn no_state_leaks_between_executions() {
    let sb = sandbox().await;
    let r = run(
        &*sb,
        js("globalThis.leak = 1; var v = 2; Array.prototype.evil = 3; Math.max = () => 0; 'set'"),
    )
    .await;
    assert_eq!(r.value, Some(json!("set")), "{r:?}");
    let r = run(
        &*sb,
        js("[typeof leak, typeof v, typeof [].evil, Math.max(1, 2)].join()"),
    )
    .await;
    assert_eq!(
        r.value,
        Some(json!("undefined,undefined,undefined,2")),
        "{r:?}"
    );
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn memory_limit_is_memory_exceeded_even_when_caught_and_the_isolate_recovers() {
    let sb = sandbox().await;
    let mut req = js("const a = []; while (true) a.push(new Array(100000).fill(1));");
    req.limits.memory_bytes = Some(32 << 20);
    let r = run(&*sb, req).await;
    assert_eq!(
        r.outcome,
        Outcome::LimitExceeded {
            limit: LimitKind::Memory
        },
        "{r:?}"
    );
    assert_eq!(r.outcome.error_code(), Some(ErrorCode::MemoryExceeded));
    assert!(r.usage.peak_memory_bytes > 16 << 20, "{:?}", r.usage);
    let mut req = js(
        "let caught = false; try { const a = []; while (true) a.push('x'.repeat(1 << 20) + Math.random()); } catch (e) { caught = true } caught",
    );
    req.limits.memory_bytes = Some(32 << 20);
    let r = run(&*sb, req).await;
    assert_eq!(
        r.outcome.error_code(),
        Some(ErrorCode::MemoryExceeded),
        "{r:?}"
    );
    // The same sandbox runs the next execution normally.
    let r = run(&*sb, js("6 * 7")).await;
    assert_eq!(r.value, Some(json!(42)), "{r:?}");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn deep_recursion_hits_the_stack_limit_not_the_host() {
    let sb = sandbox().await;
    let r = run(&*sb, js("function f(n) { return f(n + 1) + 1 } f(0)")).await;
    assert_eq!(r.outcome, completed(1), "{r:?}");
    assert!(
        r.stderr.contains("RangeError") && r.stderr.contains("stack"),
        "{}",
        r.stderr
    );
    let r = run(&*sb, js("'still here'")).await;
    assert_eq!(r.value, Some(json!("still here")));
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn deadline_interrupts_an_endless_loop() {
    let sb = sandbox().await;
    for source in [
        "while (true) {}",
        "for (;;) { try { while (true) {} } catch (e) {} }",
        "(async () => { while (true) await null })()",
    ] {
        let mut req = js(source);
        req.limits.timeout_ms = Some(200);
        let t = Instant::now();
        let r = run(&*sb, req).await;
        let took = t.elapsed();
        assert_eq!(r.outcome, Outcome::TimedOut, "{source}: {r:?}");
        assert!(r.stderr.is_empty(), "no interrupt noise: {}", r.stderr);
        // The deadline plus a small slack (generous for a shared machine).
        assert!(
            took < Duration::from_millis(1500),
            "{source}: took {took:?}"
        );
    }
    let r = run(&*sb, js("1")).await;
    assert_eq!(r.value, Some(json!(1)));
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn cancel_interrupts_a_running_script() {
    let sb = sandbox().await;
    let cancel = CancelToken::new();
    let c = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.cancel();
    });
    let t = Instant::now();
    let r = sb
        .exec(js("while (true) {}"), &DiscardSink, cancel)
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Cancelled);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // A cancel while a timer is awaited works too.
    let cancel = CancelToken::new();
    let c = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.cancel();
    });
    let r = sb
        .exec(
            js("await new Promise(r => setTimeout(r, 60000))"),
            &DiscardSink,
            cancel,
        )
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Cancelled);
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn console_is_streamed_while_the_script_runs() {
    let sb = sandbox().await;
    let sink = Collect::default();
    let t = Instant::now();
    let r = sb
        .exec(
            js("console.log('first', {a: 1}, [2]); console.error('oops'); const t = Date.now(); while (Date.now() - t < 400) {} console.info('second')"),
            &sink,
            CancelToken::new(),
        )
        .await
        .unwrap();
    let done = Instant::now();
    assert_eq!(r.stdout, "first {\"a\":1} [2]\nsecond\n");
    assert_eq!(r.stderr, "oops\n");
    let chunks = sink.0.lock().unwrap().clone();
    let (first_at, first) = &chunks[0];
    assert_eq!(first.data, b"first {\"a\":1} [2]\n");
    assert!(
        *first_at < done - Duration::from_millis(200),
        "the first line arrived {:?} after the start, the run ended {:?} after it",
        *first_at - t,
        done - t
    );
    let stdout: Vec<u8> = chunks
        .iter()
        .filter(|(_, c)| c.stream == StreamKind::Stdout)
        .flat_map(|(_, c)| c.data.clone())
        .collect();
    assert_eq!(stdout, r.stdout.as_bytes());
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn console_respects_the_output_cap() {
    let sb = sandbox().await;
    let mut req = js("for (let i = 0; i < 10000; i++) console.log('line ' + i); 'done'");
    req.limits.max_output_bytes = Some(1000);
    let r = run(&*sb, req).await;
    assert_eq!(r.outcome, completed(0));
    assert!(r.stdout_truncated);
    assert!(r.stdout.starts_with("line 0\nline 1\n"));
    assert!(
        r.stdout.ends_with("[output truncated at 1000 bytes]\n"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.len() < 1100, "{}", r.stdout.len());
    // A value larger than the cap is refused as an output limit.
    let mut req = js("'x'.repeat(5000)");
    req.limits.max_output_bytes = Some(1000);
    let r = run(&*sb, req).await;
    assert_eq!(
        r.outcome,
        Outcome::LimitExceeded {
            limit: LimitKind::Output
        }
    );
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn denylisted_modules_are_blocked_at_import() {
    let sb = sandbox().await;
    for source in [
        "import fs from 'fs'; fs.readFileSync('/etc/passwd')",
        "import { exec } from 'node:child_process';",
        "const m = await import('net')",
        "let ok = true; try { await import('os') } catch (e) { ok = false } ok",
    ] {
        let r = run(&*sb, js(source)).await;
        assert_eq!(
            r.outcome.error_code(),
            Some(ErrorCode::BlockedModule),
            "{source}: {r:?}"
        );
    }
    // A module nobody registered is an ordinary script error.
    let r = run(&*sb, js("import x from 'left-pad'")).await;
    assert_eq!(r.outcome, completed(1), "{r:?}");
    assert!(r.stderr.contains("left-pad"), "{}", r.stderr);
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn host_modules_export_json_functions_and_source() {
    let mut modules = HostModules::new();
    modules
        .json("config", json!({"answer": 42, "names": ["a", "b"]}))
        .unwrap();
    modules
        .function("math", "add", |args| {
            let sum: f64 = args.iter().filter_map(|a| a.as_f64()).sum();
            Ok(json!(sum))
        })
        .unwrap();
    modules
        .function("math", "fail", |_| Err("always fails".into()))
        .unwrap();
    modules
        .source("greet", "export function hello(n) { return 'hello ' + n }")
        .unwrap();
    assert_eq!(
        modules.json("fs", json!({})).map(|_| ()).unwrap_err().code,
        ErrorCode::BlockedModule
    );
    let mut config = IsolateConfig::default();
    config
        .modules
        .insert("settings".into(), json!({"mode": "fast"}));
    let engine = IsolateEngine::with_modules(&config, modules).unwrap();
    let sb = sandbox_of(&engine).await;
    let r = run(
        &*sb,
        js("import { answer, names } from 'config'; import cfg from 'config'; import { add } from 'math'; import { hello } from 'greet'; import { mode } from 'settings'; export default [answer, names.length, cfg.answer, add(2, 3), hello('x'), mode]"),
    )
    .await;
    assert_eq!(
        r.value,
        Some(json!([42, 2, 42, 5, "hello x", "fast"])),
        "{r:?}"
    );
    let r = run(
        &*sb,
        js("import { fail } from 'math'; let m; try { fail() } catch (e) { m = e.message } export default m"),
    )
    .await;
    assert_eq!(r.value, Some(json!("fail: always fails")), "{r:?}");
    sb.destroy().await.unwrap();

    let mut bad = IsolateConfig::default();
    bad.modules.insert("child_process".into(), json!({}));
    assert_eq!(
        IsolateEngine::new(&bad).unwrap_err().code,
        ErrorCode::BlockedModule
    );
    let mut bad = IsolateConfig::default();
    bad.modules.insert("cfg".into(), json!("not an object"));
    assert_eq!(
        IsolateEngine::new(&bad).unwrap_err().code,
        ErrorCode::InvalidModule
    );
}

#[tokio::test]
async fn sandbox_fs_is_confined_to_the_workdir() {
    let sb = sandbox().await;
    sb.write_file("in/data.txt", b"from the caller")
        .await
        .unwrap();
    let r = run(
        &*sb,
        js("import { readFile, writeFile, listFiles, exists } from 'sandbox:fs';
            const text = readFile('in/data.txt');
            writeFile('out/result.txt', text.toUpperCase());
            export default [text, exists('in/data.txt'), exists('missing'), listFiles('in').length];"),
    )
    .await;
    assert_eq!(
        r.value,
        Some(json!(["from the caller", true, false, 1])),
        "{r:?}"
    );
    assert_eq!(
        sb.read_file("out/result.txt").await.unwrap(),
        b"FROM THE CALLER"
    );
    // The workdir is seen at /workspace: no host path (nor the server's pid in it)
    // reaches a script or a caller of the files API.
    assert_eq!(sb.root_dir(), std::path::Path::new("/workspace"));
    assert_ne!(sb.host_dir(), sb.root_dir());
    let listed = sb.list_files("/workspace/out").await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].path, "/workspace/out/result.txt");
    let r = run(
        &*sb,
        js("import { readFile } from 'sandbox:fs'; export default readFile('/workspace/out/result.txt');"),
    )
    .await;
    assert_eq!(r.value, Some(json!("FROM THE CALLER")), "{r:?}");
    let r = run(
        &*sb,
        js("import { readFile } from 'sandbox:fs';
            const codes = [];
            for (const p of ['../../etc/passwd', '/etc/passwd', 'nope.txt']) {
              try { readFile(p) } catch (e) { codes.push(e.code) }
            }
            export default codes;"),
    )
    .await;
    assert_eq!(
        r.value,
        Some(json!(["PATH_ESCAPE", "PATH_ESCAPE", "NOT_FOUND"])),
        "{r:?}"
    );
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn unsupported_programs_and_inputs_are_refused() {
    let sb = sandbox().await;
    let refused = |r: paddock_core::Result<ExecResult>| r.unwrap_err().code;
    let exec = |req| sb.exec(req, &DiscardSink, CancelToken::new());
    assert_eq!(
        refused(exec(ExecRequest::new(Program::command(["true"]))).await),
        ErrorCode::CapabilityNotSupported
    );
    assert_eq!(
        refused(exec(ExecRequest::new(Program::code(Language::Python, "1"))).await),
        ErrorCode::CapabilityNotSupported
    );
    let mut with_stdin = js("1");
    with_stdin.stdin = Some("x".into());
    assert_eq!(
        refused(exec(with_stdin).await),
        ErrorCode::CapabilityNotSupported
    );
    let engine = IsolateEngine::with_defaults().unwrap();
    let strict = SandboxSpec {
        level: paddock_core::IsolationLevel::Strict,
        ..SandboxSpec::default()
    };
    assert_eq!(
        engine.create(&strict).await.unwrap_err().code,
        ErrorCode::LevelNotSupported
    );
    let open = SandboxSpec {
        network: paddock_core::NetworkPolicy::Unrestricted,
        ..SandboxSpec::default()
    };
    assert_eq!(
        engine.create(&open).await.unwrap_err().code,
        ErrorCode::CapabilityNotSupported
    );
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_ends_a_running_script_and_refuses_later_calls() {
    let sb = sandbox().await;
    let root = sb.host_dir().to_path_buf();
    let runner = {
        let sb = sb.clone();
        tokio::spawn(async move { run(&*sb, js("while (true) {}")).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    sb.destroy().await.unwrap();
    let r = runner.await.unwrap();
    assert_eq!(r.outcome, Outcome::Cancelled);
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(sb.status(), paddock_core::SandboxStatus::Destroyed);
    assert!(!root.exists(), "the workdir is removed");
    let err = sb
        .exec(js("1"), &DiscardSink, CancelToken::new())
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::EngineDisposed);
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn a_fresh_runtime_per_execution_and_alternating_tenants_keep_working() {
    // Runtime replacement itself is not visible from a script (every execution has a
    // fresh context anyway); when it happens is unit-tested in `worker.rs`. This checks
    // that replacing the runtime on every execution and on every tenant change keeps
    // executions working with no state showing through.
    let config = IsolateConfig {
        recycle_after: 1,
        ..IsolateConfig::default()
    };
    let engine = IsolateEngine::new(&config).unwrap();
    let sb = sandbox_of(&engine).await;
    for i in 0..5 {
        let mut req = js("globalThis.seen = (globalThis.seen || 0) + 1; seen");
        req.tenant = Some(format!("tenant-{}", i % 2));
        let r = run(&*sb, req).await;
        assert_eq!(r.value, Some(json!(1)), "{r:?}");
    }
    sb.destroy().await.unwrap();
}

#[test]
fn run_blocking_uses_a_fresh_runtime_on_the_calling_thread() {
    let engine = IsolateEngine::with_defaults().unwrap();
    let r = engine
        .run_blocking(js("console.log('hi'); [1, 2, 3].map(x => x * 2)"))
        .unwrap();
    assert_eq!(r.outcome, completed(0), "{r:?}");
    assert_eq!(r.value, Some(json!([2, 4, 6])));
    assert_eq!(r.stdout, "hi\n");
    let mut spin = js("while (true) {}");
    spin.limits.timeout_ms = Some(100);
    assert_eq!(
        engine.run_blocking(spin).unwrap().outcome,
        Outcome::TimedOut
    );
    let r = engine
        .run_blocking(js("import { readFile } from 'sandbox:fs'; let c; try { readFile('x') } catch (e) { c = e.code } export default c"))
        .unwrap();
    assert_eq!(r.value, Some(json!("CAPABILITY_NOT_SUPPORTED")), "{r:?}");
    assert_eq!(
        engine
            .run_blocking(ExecRequest::new(Program::command(["true"])))
            .unwrap_err()
            .code,
        ErrorCode::CapabilityNotSupported
    );
}

#[tokio::test]
async fn an_abandoned_execution_is_stopped_not_left_running() {
    let sb = sandbox().await;
    let abandoned = tokio::time::timeout(
        Duration::from_millis(100),
        sb.exec(js("while (true) {}"), &DiscardSink, CancelToken::new()),
    )
    .await;
    assert!(abandoned.is_err(), "the caller gave up");
    assert_eq!(sb.status(), paddock_core::SandboxStatus::Ready);
    // The next execution runs at once instead of waiting out the first one's 10 s.
    let t = Instant::now();
    let r = run(&*sb, js("'next'")).await;
    assert_eq!(r.value, Some(json!("next")), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_validates_a_plain_request_and_exec_valid_trusts_its_proof() {
    use paddock_core::{ValidRequest, ValidationProbe};
    let sb = sandbox().await;
    let r = js("console.log('hi')");
    let probe = ValidationProbe::watch(&r.id);
    assert_eq!(run(&*sb, r).await.stdout, "hi\n");
    assert_eq!(probe.count(), 1, "a direct caller's request is validated");

    let r = js("console.log('hi')");
    let probe = ValidationProbe::watch(&r.id);
    let valid = ValidRequest::new(r).unwrap();
    let out = sb
        .exec_valid(valid, &DiscardSink, CancelToken::new())
        .await
        .unwrap();
    assert_eq!(out.stdout, "hi\n");
    assert_eq!(probe.count(), 1, "the proof's validation, and no other");

    let e = sb
        .exec(js("1").with_timeout_ms(0), &DiscardSink, CancelToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidOptions);
    sb.destroy().await.unwrap();
}
