//! Each check on an execution's path runs once: the scheduler validates the request
//! and hands the engine its proof, which the engine does not check again.

use std::time::Duration;

use paddock_core::{ErrorCode, ExecRequest, ExecResult, Program, ValidationProbe};
use paddock_pool::{Execute, ExecutionStream, StreamEvent};

fn sh(script: &str) -> ExecRequest {
    ExecRequest::new(Program::command(["sh", "-c", script]))
}

/// A request wrong in itself: a zero timeout.
fn wrong() -> ExecRequest {
    sh("true").with_timeout_ms(0)
}

async fn finish(mut stream: ExecutionStream) -> ExecResult {
    let mut result = None;
    while let Some(ev) = stream.next().await {
        if let StreamEvent::Finished(r) = ev {
            result = Some(r.unwrap());
        }
    }
    result.expect("a final result")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_validated_once_on_its_way_to_the_engine() {
    let paddock = paddock::builder().start().unwrap();
    let once = |probe: &ValidationProbe, path: &str| {
        assert_eq!(
            probe.count(),
            1,
            "{path}: the scheduler validates, the engine takes its proof"
        );
    };

    let r = sh("echo hi");
    let probe = ValidationProbe::watch(&r.id);
    assert_eq!(paddock.execute(r).await.unwrap().stdout, "hi\n");
    once(&probe, "execute");

    let r = sh("echo hi");
    let probe = ValidationProbe::watch(&r.id);
    let stream = paddock.execute_stream(Execute::new(r)).await.unwrap();
    assert_eq!(finish(stream).await.stdout, "hi\n");
    once(&probe, "execute_stream");

    let sandbox = paddock
        .open_sandbox(Default::default(), None)
        .await
        .unwrap();
    let r = sh("echo hi");
    let probe = ValidationProbe::watch(&r.id);
    assert_eq!(sandbox.exec(r).await.unwrap().stdout, "hi\n");
    once(&probe, "a sandbox's exec");

    let r = sh("echo hi");
    let probe = ValidationProbe::watch(&r.id);
    let stream = sandbox.exec_stream(r).await.unwrap();
    assert_eq!(finish(stream).await.stdout, "hi\n");
    once(&probe, "a sandbox's exec_stream");
    sandbox.destroy().await.unwrap();
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_a_request_wrong_in_itself_is_refused_before_it_begins() {
    let paddock = paddock::builder().start().unwrap();
    let r = wrong();
    let probe = ValidationProbe::watch(&r.id);
    let Err(e) = paddock.execute_stream(Execute::new(r)).await else {
        panic!("a stream began for a request wrong in itself");
    };
    assert_eq!(e.code, ErrorCode::InvalidOptions);
    assert!(e.message.contains("limits.timeout_ms"), "{}", e.message);
    assert_eq!(probe.count(), 1);

    let sandbox = paddock
        .open_sandbox(Default::default(), None)
        .await
        .unwrap();
    let r = wrong();
    let probe = ValidationProbe::watch(&r.id);
    let Err(e) = sandbox.exec_stream(r).await else {
        panic!("a sandbox's stream began for a request wrong in itself");
    };
    assert_eq!(e.code, ErrorCode::InvalidOptions);
    assert_eq!(probe.count(), 1);

    // A refusal once the request passed still comes at the stream's end.
    let mut blocked = sh("true");
    blocked.program = Program::code(paddock_core::Language::Javascript, "process.exit(1)");
    let mut stream = paddock.execute_stream(Execute::new(blocked)).await.unwrap();
    let mut last = None;
    while let Some(ev) = stream.next().await {
        if let StreamEvent::Finished(r) = ev {
            last = Some(r);
        }
    }
    let refused = last.expect("an end").unwrap_err();
    assert_eq!(refused.code, ErrorCode::CodeBlocked);
    let stats = paddock.stats().await.unwrap();
    assert_eq!(stats.refused_total.unwrap_or_default(), 3);
    sandbox.destroy().await.unwrap();
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}
