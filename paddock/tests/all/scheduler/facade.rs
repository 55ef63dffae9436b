use std::sync::Arc;
use std::time::Duration;

use paddock::PaddockConfig;
use paddock_core::{EngineName, ErrorCode, ExecRequest, Language, Outcome, Program};
use paddock_pool::noop::NoopEngine;
use paddock_pool::{Execute, StreamEvent};

fn sh(script: &str) -> ExecRequest {
    ExecRequest::new(Program::command(["sh", "-c", script]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executes_through_the_whole_pipeline() {
    let paddock = paddock::builder().start().unwrap();
    let r = paddock.execute(sh("echo hi; exit 3")).await.unwrap();
    assert_eq!(
        r.outcome,
        Outcome::Completed {
            exit_code: 3,
            signal: None
        }
    );
    assert_eq!(r.stdout, "hi\n");
    let r = paddock
        .execute(ExecRequest::new(Program::code(
            Language::Python,
            "print(6*7)",
        )))
        .await
        .unwrap();
    assert_eq!(r.stdout, "42\n");
    let blocked = paddock
        .execute(ExecRequest::new(Program::code(
            Language::Javascript,
            "process.exit(1)",
        )))
        .await
        .unwrap_err();
    assert_eq!(blocked.code, ErrorCode::CodeBlocked);
    let audit = paddock
        .audit(&paddock_pool::Caller::Embedder, Default::default())
        .await
        .unwrap();
    assert_eq!(
        audit.len(),
        2,
        "one entry per accepted execution: {audit:?}"
    );
    let stats = paddock.stats().await.unwrap();
    assert_eq!(stats.accepted_total.unwrap_or_default(), 2);
    assert_eq!(stats.refused_total.unwrap_or_default(), 1);
    let report = paddock.shutdown(Duration::from_secs(5)).await.unwrap();
    assert_eq!(report.cancelled, 0);
    let after = paddock.execute(sh("true")).await.unwrap_err();
    assert_eq!(after.code, ErrorCode::EngineDisposed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_output_then_the_result() {
    let paddock = paddock::builder().start().unwrap();
    let mut stream = paddock
        .execute_stream(Execute::new(sh("echo one; sleep 0.3; echo two >&2")))
        .await
        .unwrap();
    let mut out = Vec::new();
    let mut result = None;
    while let Some(ev) = stream.next().await {
        match ev {
            StreamEvent::Output(c) => out.push((c.stream, String::from_utf8(c.data).unwrap())),
            StreamEvent::Finished(r) => result = Some(r.unwrap()),
        }
    }
    let result = result.expect("a final result");
    assert!(result.is_success());
    assert_eq!(
        out,
        vec![
            (paddock_core::StreamKind::Stdout, "one\n".to_string()),
            (paddock_core::StreamKind::Stderr, "two\n".to_string())
        ]
    );
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_by_id_while_running() {
    let paddock = paddock::builder().start().unwrap();
    let req = sh("sleep 30");
    let id = req.id.clone();
    let p2 = paddock.clone();
    let running = tokio::spawn(async move { p2.execute(req).await });
    let mut cancelled = false;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if paddock.cancel(&paddock_pool::Caller::Embedder, &id) {
            cancelled = true;
            break;
        }
    }
    assert!(cancelled, "the execution never showed up as running");
    let r = running.await.unwrap().unwrap();
    assert_eq!(r.outcome, Outcome::Cancelled);
    assert!(
        !paddock.cancel(&paddock_pool::Caller::Embedder, &id),
        "cancel after finish is a no-op"
    );
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_keep_files_and_refuse_after_destroy() {
    let paddock = paddock::builder().start().unwrap();
    let sb = paddock
        .open_sandbox(Default::default(), None)
        .await
        .unwrap();
    sb.write_file("notes/a.txt", b"hello").await.unwrap();
    let r = sb
        .exec(sh("cat notes/a.txt; echo more >> notes/a.txt"))
        .await
        .unwrap();
    assert_eq!(r.stdout, "hello");
    assert_eq!(sb.read_file("notes/a.txt").await.unwrap(), b"hellomore\n");
    let list = sb.list_files("").await.unwrap();
    assert!(
        list.iter()
            .any(|e| e.path.ends_with("notes/a.txt") && e.size == 10),
        "{list:?}"
    );
    assert_eq!(
        sb.read_file("../x").await.unwrap_err().code,
        ErrorCode::PathEscape
    );
    sb.destroy().await.unwrap();
    sb.destroy().await.unwrap();
    assert_eq!(
        sb.exec(sh("true")).await.unwrap_err().code,
        ErrorCode::EngineDisposed
    );
    assert_eq!(
        sb.status().await.unwrap(),
        paddock_core::SandboxStatus::Destroyed
    );
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_destroys_all_return_after_the_teardown() {
    let paddock = paddock::builder()
        .without_isolate()
        .without_container()
        .start()
        .unwrap();
    for round in 0..3 {
        let sb = paddock
            .open_sandbox(Default::default(), None)
            .await
            .unwrap();
        // Enough files that removing the workdir takes a while.
        let r = sb
            .exec(sh("mkdir -p d && cd d && seq 4000 | xargs touch"))
            .await
            .unwrap();
        assert!(
            matches!(r.outcome, Outcome::Completed { exit_code: 0, .. }),
            "{r:?}"
        );
        let root = std::path::PathBuf::from(&sb.info().host_dir);
        assert!(root.join("d/4000").exists());
        let again = paddock
            .sandbox(&paddock_pool::Caller::Embedder, sb.id())
            .await
            .unwrap();
        let destroys: Vec<_> = [sb, again]
            .into_iter()
            .enumerate()
            .map(|(i, handle)| {
                let root = root.clone();
                tokio::spawn(async move {
                    if i == 1 {
                        // The second arrives while the first tears down.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    handle.destroy().await.unwrap();
                    // Whichever returns, the sandbox's files are gone (its
                    // instance is recycled for the next sandbox, or removed).
                    root.exists() && std::fs::read_dir(&root).unwrap().next().is_some()
                })
            })
            .collect();
        for (i, d) in destroys.into_iter().enumerate() {
            assert!(
                !d.await.unwrap(),
                "round {round}: destroy {i} returned while the workdir was still there"
            );
        }
    }
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_facade_says_which_engines_run_and_what_they_can_do() {
    let paddock = paddock::builder()
        .without_container()
        .engine(Arc::new(NoopEngine::new()))
        .start()
        .unwrap();
    assert_eq!(paddock.engines(), ["isolate", "noop", "subprocess"]);
    let caps = paddock.capabilities();
    let names: Vec<&str> = caps.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["isolate", "noop", "subprocess"]);
    let of = |name: &str| &caps.iter().find(|(n, _)| *n == name).unwrap().1;
    assert_eq!(
        of("isolate").max_level,
        paddock_core::IsolationLevel::ContextIsolated
    );
    assert!(
        of("subprocess").has_feature("process"),
        "{:?}",
        of("subprocess")
    );
    assert!(of("subprocess").supports_program(paddock_core::ProgramKind::Command));
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_chosen_by_level_is_the_first_registered_on_a_tie() {
    // The default (isolate) is not allowed, so the weakest engine that gives level
    // `none` is chosen: subprocess and noop tie, and subprocess was registered first
    // (not `noop`, which comes first by name).
    let server = paddock_pool::http::ServerConfig {
        allowed_levels: Some(vec![paddock_core::IsolationLevel::None]),
        ..Default::default()
    };
    let paddock = paddock::builder()
        .without_container()
        .engine(Arc::new(NoopEngine::new()))
        .default_engine(EngineName::ISOLATE)
        .access(server.access_rules())
        .start()
        .unwrap();
    let r = paddock.execute(sh("echo chosen")).await.unwrap();
    assert_eq!(r.engine, EngineName::SUBPROCESS, "{r:?}");
    assert_eq!(r.stdout, "chosen\n");
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_typed() {
    let paddock = paddock::builder()
        .engine(Arc::new(NoopEngine::new()))
        .without_container()
        .start()
        .unwrap();
    let mut msg = Execute::new(sh("true"));
    msg.order.level = paddock_core::IsolationLevel::Strict;
    assert_eq!(
        paddock.execute_with(msg).await.unwrap_err().code,
        ErrorCode::LevelNotSupported
    );
    let msg = Execute::new(ExecRequest::new(Program::Invoke {
        handler: "h".into(),
        input: serde_json::json!({}),
    }));
    assert_eq!(
        paddock.execute_with(msg).await.unwrap_err().code,
        ErrorCode::CapabilityNotSupported
    );
    let msg = Execute::new(sh("true")).on(EngineName::CONTAINER);
    assert_eq!(
        paddock.execute_with(msg).await.unwrap_err().code,
        ErrorCode::CapabilityNotSupported
    );
    let r = paddock
        .execute_with(Execute::new(sh("true")).on(EngineName::NOOP))
        .await
        .unwrap();
    assert!(r.is_success());
    assert_eq!(r.engine, EngineName::NOOP);
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_answers_pool_exhausted() {
    let mut config = PaddockConfig::default();
    config.pool.max_size = 1;
    config.pool.min_idle = 0;
    config.pool.max_waiting = 1;
    config.pool.acquire_timeout_ms = 300;
    let paddock = paddock::builder().config(config).start().unwrap();
    let p = paddock.clone();
    let first = tokio::spawn(async move { p.execute(sh("sleep 1")).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let p = paddock.clone();
    let second = tokio::spawn(async move { p.execute(sh("true")).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let third = paddock.execute(sh("true")).await.unwrap_err();
    assert_eq!(third.code, ErrorCode::PoolExhausted, "{third}");
    assert!(third.retry_after_ms.is_some());
    let second = second.await.unwrap().unwrap_err();
    assert_eq!(
        second.code,
        ErrorCode::PoolExhausted,
        "waited past acquire_timeout"
    );
    assert!(first.await.unwrap().unwrap().is_success());
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_streamed_execution_ends_at_once() {
    let paddock = paddock::builder().start().unwrap();
    let msg = Execute::new(ExecRequest::new(Program::code(
        Language::Javascript,
        "process.exit(1)",
    )));
    let mut stream = paddock.execute_stream(msg).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("a refused execution must not leave its stream hanging");
    match first {
        Some(StreamEvent::Finished(r)) => assert_eq!(r.unwrap_err().code, ErrorCode::CodeBlocked),
        other => panic!("{other:?}"),
    }
    assert!(stream.next().await.is_none());
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_subscriber_by_id_gets_the_buffered_output() {
    let paddock = paddock::builder().start().unwrap();
    let req = sh("echo kept-for-later");
    let id = req.id.clone();
    let r = paddock.execute(req).await.unwrap();
    assert!(r.is_success());
    let mut sub = paddock.subscribe(id).await.unwrap();
    let chunk = tokio::time::timeout(Duration::from_secs(5), sub.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(chunk.data, b"kept-for-later\n");
    assert!(tokio::time::timeout(Duration::from_secs(5), sub.next())
        .await
        .unwrap()
        .is_none());
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolates_are_pooled_engines_chosen_by_name_or_by_level() {
    let paddock = paddock::builder().without_container().start().unwrap();
    let js = |src: &str| ExecRequest::new(Program::code(Language::Javascript, src));
    let r = paddock
        .execute_with(Execute::new(js("console.log('hi'); 6 * 7")).on(EngineName::ISOLATE))
        .await
        .unwrap();
    assert_eq!(r.engine, EngineName::ISOLATE, "{r:?}");
    assert_eq!(r.value, Some(serde_json::json!(42)));
    assert_eq!(r.stdout, "hi\n");
    // No engine named: the level picks the weakest engine that provides it.
    let mut level = Execute::new(js("typeof process"));
    level.order.level = paddock_core::IsolationLevel::ContextIsolated;
    let r = paddock.execute_with(level).await.unwrap();
    assert_eq!(r.engine, EngineName::ISOLATE, "{r:?}");
    assert_eq!(r.value, Some(serde_json::json!("undefined")));
    // Still never a downgrade: strict is refused while no engine provides it.
    let mut strict = Execute::new(js("1"));
    strict.order.level = paddock_core::IsolationLevel::Strict;
    let e = paddock.execute_with(strict).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::LevelNotSupported);
    let stats = paddock.stats().await.unwrap();
    let pool = stats
        .pools
        .iter()
        .find(|p| p.engine == EngineName::ISOLATE)
        .expect("an isolate pool");
    assert!(pool.size >= 1, "{pool:?}");
    let text = paddock.telemetry().render_prometheus();
    assert!(
        text.lines()
            .any(|l| l.starts_with("paddock_executions_total")
                && l.contains("engine=\"isolate\"")
                && l.contains("outcome=\"completed\"")
                && l.ends_with(" 2")),
        "{text}"
    );
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// A long-running json-stdio handler that suspends and is resumed.
const APPROVAL: &str = r#"
import json, sys
for line in sys.stdin:
    f = json.loads(line)
    if f["kind"] == "invoke":
        sys.stdout.write(json.dumps({"v": 1, "kind": "suspend", "id": f["id"], "token_id": "ok-" + f["id"]}) + "\n")
    elif f["kind"] == "resume":
        sys.stdout.write(json.dumps({"v": 1, "kind": "output", "id": f["id"], "output": f["value"]}) + "\n")
    sys.stdout.flush()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_handler_resumes_in_its_session_through_the_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("approval.py");
    std::fs::write(&script, APPROVAL).unwrap();
    let mut config = PaddockConfig::default();
    config.subprocess.handlers.insert(
        "approval".into(),
        paddock_engines::HandlerConfig {
            command: vec!["python3".into(), script.to_string_lossy().into_owned()],
        },
    );
    let paddock = paddock::builder()
        .config(config)
        .without_isolate()
        .start()
        .unwrap();
    let sandbox = paddock
        .open_sandbox(Default::default(), None)
        .await
        .unwrap();
    let r = sandbox
        .exec(ExecRequest::new(Program::Invoke {
            handler: "approval".into(),
            input: serde_json::json!({"change": 1}),
        }))
        .await
        .unwrap();
    let Outcome::Suspended { token_id } = r.outcome.clone() else {
        panic!("expected a suspension: {r:?}");
    };
    let r = sandbox
        .exec(ExecRequest::new(Program::Resume {
            token_id,
            value: serde_json::json!({"approved": true}),
        }))
        .await
        .unwrap();
    assert!(r.is_success(), "{r:?}");
    assert_eq!(r.value, Some(serde_json::json!({"approved": true})));
    let audit = paddock
        .audit(&paddock_pool::Caller::Embedder, Default::default())
        .await
        .unwrap();
    assert_eq!(
        audit.len(),
        2,
        "the invoke and the resume are both audited: {audit:?}"
    );
    sandbox.destroy().await.unwrap();
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_isolation_goes_to_the_container_engine() {
    let paddock = paddock::builder().start().unwrap();
    let stats = paddock.stats().await.unwrap();
    if !stats
        .pools
        .iter()
        .any(|p| p.engine == EngineName::CONTAINER)
    {
        assert!(
            std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none(),
            "the container engine must start here"
        );
        eprintln!("skipped: no OCI runtime on this host");
        return;
    }
    let mut strict = Execute::new(sh("echo $$; cat /proc/net/dev | wc -l"));
    strict.order.level = paddock_core::IsolationLevel::Strict;
    let r = paddock.execute_with(strict).await.unwrap();
    assert_eq!(r.engine, EngineName::CONTAINER, "{r:?}");
    // Inside its own pid namespace (its pid is a small number: after the agent's,
    // pid 1, and the warm runners it started and their helpers, which vary), with
    // only loopback.
    let (pid, devices) = r.stdout.split_once('\n').unwrap_or_default();
    assert!(
        pid.parse::<u32>().is_ok_and(|p| (2..100).contains(&p)),
        "{r:?}"
    );
    assert_eq!(devices, "3\n", "{r:?}");
    // A request naming no level still runs on the default (subprocess) engine.
    let r = paddock.execute(sh("true")).await.unwrap();
    assert_eq!(r.engine, EngineName::SUBPROCESS);
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// The no-op engine under another name.
#[derive(Debug)]
struct Renamed(NoopEngine, EngineName);

#[async_trait::async_trait]
impl paddock_core::Engine for Renamed {
    fn name(&self) -> EngineName {
        self.1.clone()
    }
    fn capabilities(&self) -> &paddock_core::Capabilities {
        self.0.capabilities()
    }
    async fn create(
        &self,
        spec: &paddock_core::SandboxSpec,
    ) -> paddock_core::Result<Arc<dyn paddock_core::Sandbox>> {
        self.0.create(spec).await
    }
}

/// An engine of `[engines.NAME]` is had by naming it, never by level alone (nor as
/// the default), even when no other engine gives the level; an engine registered in
/// code may not take its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_engine_is_chosen_only_by_its_name() {
    let mut config =
        PaddockConfig::from_toml_str("[engines.ct-two]\nkind = \"container\"\n").unwrap();
    config.container.enabled = false;
    config.isolate.enabled = false;
    let paddock = paddock::builder().config(config.clone()).start().unwrap();
    let named = EngineName::new("ct-two").unwrap();
    if !paddock.engines().contains(&named) {
        assert!(
            std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none(),
            "the container engine must start here"
        );
        eprintln!("skipped: no OCI runtime on this host");
        return;
    }
    // Strict, naming no engine: no engine it may be chosen from gives it.
    let mut strict = Execute::new(sh("true"));
    strict.order.level = paddock_core::IsolationLevel::Strict;
    let e = paddock.execute_with(strict.clone()).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::LevelNotSupported, "{e}");
    // Named, it runs there.
    strict.order.engine = Some(named.clone());
    let r = paddock.execute_with(strict).await.unwrap();
    assert_eq!(r.engine, named, "{r:?}");
    // The default stays subprocess.
    assert_eq!(
        paddock.execute(sh("true")).await.unwrap().engine,
        EngineName::SUBPROCESS
    );
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();

    let e = paddock::builder()
        .config(config)
        .engine(Arc::new(Renamed(NoopEngine::new(), named.clone())))
        .start()
        .unwrap_err();
    assert!(e.message.contains("`engines.ct-two`"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedder_keeps_a_pool_of_its_own_sandboxes_warm() {
    // One ready in the default pool, so that its count cannot pass for the one
    // asked for.
    let mut config = PaddockConfig::default();
    config.pool.min_idle = 1;
    let paddock = paddock::builder()
        .config(config)
        .without_container()
        .without_isolate()
        .start()
        .unwrap();
    let spec = paddock_core::SandboxSpec {
        home: Some("/home/user".into()),
        ..Default::default()
    };
    paddock
        .warm_pool(EngineName::SUBPROCESS, spec.clone(), 3)
        .await
        .unwrap();
    // The default pool keeps `pool.min_idle` (1 here); the one asked for, three.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let stats = paddock.stats().await.unwrap();
        let idle: Vec<usize> = stats.pools.iter().map(|p| p.idle).collect();
        if idle.contains(&3) {
            assert_eq!(stats.pools.len(), 2, "{idle:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never 3 idle: {idle:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A sandbox of that spec comes from it, with its home.
    let sb = paddock
        .open_sandbox(spec, Some(EngineName::SUBPROCESS))
        .await
        .unwrap();
    assert_eq!(sb.info().root_dir, "/home/user");
    sb.destroy().await.unwrap();
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// `check_admission` answers what running the execution would be refused for (the
/// same code, from the same checks) without running it or making a pool; and the
/// engine it would run on when it would be admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_check_refuses_what_execution_refuses_and_runs_nothing() {
    let paddock = paddock::builder()
        .engine(Arc::new(NoopEngine::new()))
        .without_container()
        .start()
        .unwrap();
    let strict = {
        let mut msg = Execute::new(sh("true"));
        msg.order.level = paddock_core::IsolationLevel::Strict;
        msg
    };
    let mut zero_timeout = sh("true");
    zero_timeout.limits.timeout_ms = Some(0);
    let refused = [
        (strict, ErrorCode::LevelNotSupported),
        (
            Execute::new(sh("true")).on(EngineName::CONTAINER),
            ErrorCode::CapabilityNotSupported,
        ),
        (
            Execute::new(sh("true")).on(EngineName::new("no-such-engine").unwrap()),
            ErrorCode::CapabilityNotSupported,
        ),
        (Execute::new(zero_timeout), ErrorCode::InvalidOptions),
    ];
    let pools_before = paddock.stats().await.unwrap().pools.len();
    for (msg, code) in &refused {
        let checked = paddock
            .check_admission(msg)
            .await
            .expect_err(&format!("{:?}", msg.order.request.program));
        assert_eq!(checked.code, *code, "{checked}");
    }
    assert_eq!(
        paddock.stats().await.unwrap().pools.len(),
        pools_before,
        "a check makes no pool"
    );
    for (msg, code) in refused {
        let ran = paddock.execute_with(msg).await.unwrap_err();
        assert_eq!(ran.code, code, "{ran}");
    }
    let fine = Execute::new(sh("true")).on(EngineName::NOOP);
    assert_eq!(
        paddock.check_admission(&fine).await.unwrap(),
        EngineName::NOOP
    );
    assert_eq!(
        paddock
            .check_admission(&Execute::new(sh("true")))
            .await
            .unwrap(),
        EngineName::SUBPROCESS
    );
    assert_eq!(paddock.stats().await.unwrap().accepted_total, Some(0));
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}
