//! An engine that no built-in code knows about, plugged in from outside the core,
//! pool and engines crates: `ns-shell` runs commands in fresh Linux namespaces
//! through util-linux `unshare` and `nsenter`, built from the engines crate's public
//! building blocks (workdir, output capture, environment sanitizing) and the core's
//! life cycle and cancel token.
//!
//! It runs the whole conformance suite (one `#[test]` per case, plus a check that the
//! cases its capabilities allow really ran and passed) and serves an execution over
//! the HTTP API of a `Paddock` it is registered with.
//!
//! Making the namespaces needs root (or the right capabilities). Elsewhere the engine
//! cannot start, and the suite skips every case, saying why; as root, that is a
//! failure.

mod engine;
mod exec;
mod http;

use std::sync::Arc;

use paddock_conformance::{cases, run_all, CaseResult, Requirement};
use paddock_core::{Engine, ProgramKind};

use engine::NsShell;

/// A fresh `ns-shell` engine, or why this host cannot run one.
fn ns_shell() -> Result<Arc<dyn Engine>, String> {
    NsShell::new().map(|engine| Arc::new(engine) as Arc<dyn Engine>)
}

/// Whether the test runs as root (effective uid 0), where the engine must start.
fn running_as_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        == Some("0")
}

/// The engine, or `None` (the test skips) when this host cannot run it and the test
/// is not root. As root, an engine that cannot start fails the test.
fn engine_or_skip(test: &str) -> Option<NsShell> {
    match NsShell::new() {
        Ok(engine) => Some(engine),
        Err(why) if !running_as_root() => {
            println!("{test} skipped: not root, and the ns-shell engine cannot start: {why}");
            None
        }
        Err(why) => panic!("running as root, the ns-shell engine must start: {why}"),
    }
}

paddock_conformance::conformance_tests!(conformance, || async { ns_shell() });

/// The stamped cases above skip when the engine cannot start; this one makes sure
/// they did not all skip: every case the engine's capabilities allow ran and passed,
/// and those are at least every case that needs nothing but commands.
#[test]
fn every_case_the_capabilities_allow_passes() {
    paddock_conformance::prepare_process_env();
    let Some(engine) = engine_or_skip("every_case_the_capabilities_allow_passes") else {
        return;
    };
    let caps = engine.capabilities().clone();
    let allowed: Vec<&str> = cases()
        .iter()
        .filter(|c| c.can_run(&caps).is_ok())
        .map(|c| c.name)
        .collect();
    let command_only: Vec<&str> = cases()
        .iter()
        .filter(|c| c.requires == [Requirement::Program(ProgramKind::Command)])
        .map(|c| c.name)
        .collect();
    assert!(!command_only.is_empty(), "the suite has no command cases");
    for name in &command_only {
        assert!(
            allowed.contains(name),
            "`{name}` needs only commands, which ns-shell runs, yet its capabilities rule it out: {caps:?}"
        );
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let results = runtime.block_on(run_all(|| async { ns_shell() }));
    assert_eq!(results.len(), cases().len());
    let mut passed = Vec::new();
    let mut problems = Vec::new();
    for (name, result) in &results {
        match result {
            CaseResult::Passed => passed.push(*name),
            CaseResult::Failed(_) => problems.push(format!("{name}: {result}")),
            CaseResult::Skipped(_) if allowed.contains(name) => {
                problems.push(format!("{name} (allowed by the capabilities): {result}"))
            }
            CaseResult::Skipped(_) => {}
        }
    }
    println!(
        "ns-shell: {} of {} cases passed, {} skipped (outside its capabilities)",
        passed.len(),
        results.len(),
        results.len() - passed.len()
    );
    assert!(
        problems.is_empty(),
        "cases that did not pass:\n{}",
        problems.join("\n")
    );
    assert_eq!(
        passed, allowed,
        "exactly the cases the capabilities allow must pass"
    );
    assert!(passed.len() >= command_only.len());
}
