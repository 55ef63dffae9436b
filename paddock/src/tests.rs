//! The built-in engines made from the whole configuration, and the scheduler's
//! builder given its part of it.

use std::sync::Arc;
use std::time::Duration;

use paddock_core::{EngineName, ErrorCode};
use paddock_engines::builtin;
use paddock_pool::noop::NoopEngine;
use paddock_pool::Paddock;

use crate::PaddockConfig;

#[test]
fn makes_only_what_the_config_enables_and_the_caller_wants() {
    let mut config = PaddockConfig::default();
    config.container.enabled = false;
    let made = builtin(&config.builtin(), |_| true).unwrap();
    let names: Vec<_> = made.engines.iter().map(|e| e.name()).collect();
    assert_eq!(names, [EngineName::SUBPROCESS, EngineName::ISOLATE]);

    let made = builtin(&config.builtin(), |n| *n != EngineName::SUBPROCESS).unwrap();
    let names: Vec<_> = made.engines.iter().map(|e| e.name()).collect();
    assert_eq!(names, [EngineName::ISOLATE]);

    config.isolate.enabled = false;
    config.subprocess.enabled = false;
    let made = builtin(&config.builtin(), |_| true).unwrap();
    assert!(made.engines.is_empty() && made.unavailable.is_empty());
}

#[test]
fn a_container_runtime_that_is_missing_is_unavailable_not_fatal() {
    let mut config = PaddockConfig::default();
    config.subprocess.enabled = false;
    config.isolate.enabled = false;
    config.container.runtime_path = Some("/nonexistent/oci-runtime".into());
    let made = builtin(&config.builtin(), |_| true).unwrap();
    assert!(made.engines.is_empty());
    assert_eq!(made.unavailable.len(), 1, "{:?}", made.unavailable);
    assert_eq!(made.unavailable[0].0, EngineName::CONTAINER);
    assert!(
        made.unavailable[0]
            .1
            .contains("container engine cannot start"),
        "{:?}",
        made.unavailable
    );
}

#[test]
fn named_engines_come_after_the_built_ins_under_their_own_names() {
    let mut config = PaddockConfig::from_toml_str(
        "[engines.tiny]\nkind = \"container\"\nruntime_path = \"/nonexistent/oci-runtime\"\n",
    )
    .unwrap();
    config.container.enabled = false;
    config.isolate.enabled = false;
    let made = builtin(&config.builtin(), |_| true).unwrap();
    let names: Vec<_> = made.engines.iter().map(|e| e.name()).collect();
    assert_eq!(names, [EngineName::SUBPROCESS]);
    // The section's engine runs with `[container]` disabled; here it cannot (no
    // runtime at that path), and says so under its own name.
    assert_eq!(made.unavailable.len(), 1, "{:?}", made.unavailable);
    assert_eq!(made.unavailable[0].0, "tiny");
    assert!(
        made.unavailable[0]
            .1
            .contains("container engine `tiny` cannot start"),
        "{:?}",
        made.unavailable
    );
    // And it is left out like a built-in when not wanted.
    let made = builtin(&config.builtin(), |n| *n != "tiny").unwrap();
    assert!(made.unavailable.is_empty(), "{:?}", made.unavailable);
}

#[actix_rt::test]
async fn without_a_registry_only_the_engines_registered_in_code_run() {
    let e = Paddock::builder().start().unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidConfig);
    assert!(
        e.message.starts_with("no engine is registered")
            && e.message.contains("`paddock::builder()`")
            && e.message.contains("`PaddockBuilder::engine`"),
        "{e}"
    );

    // The config enables subprocess and isolate by default: nothing makes them here.
    let paddock = Paddock::builder()
        .engine(Arc::new(NoopEngine::new()))
        .start()
        .unwrap();
    assert_eq!(paddock.engines(), ["noop"]);
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();

    let e = Paddock::builder()
        .engine(Arc::new(NoopEngine::new()))
        .default_engine(EngineName::SUBPROCESS)
        .start()
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidConfig);
    assert!(
        e.message
            .contains("`subprocess` is not among the configured engines")
            && e.message.contains("`paddock::builder()`"),
        "{e}"
    );

    let config = PaddockConfig::from_toml_str("[engines.tiny]\nkind = \"container\"\n").unwrap();
    let e = Paddock::builder()
        .config(config.scheduler())
        .engine(Arc::new(NoopEngine::new()))
        .start()
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidConfig);
    assert!(
        e.message.contains("`engines.tiny`") && e.message.contains("`paddock::builder()`"),
        "{e}"
    );
}
