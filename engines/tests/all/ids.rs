//! Ids cannot be guessed: sandboxes and processes opened in a burst get ids that share
//! nothing beyond their fixed tag, each carrying a UUIDv4 (122 random bits), on every
//! engine this host runs.

use std::sync::Arc;

use paddock_core::ids::{longest_shared_prefix, random_part};
use paddock_core::{Engine, ProcessSpec, Sandbox, SandboxSpec, TerminalSpec};
use paddock_engines::container::ContainerEngine;
use paddock_engines::isolate::IsolateEngine;
use paddock_engines::subprocess::SubprocessEngine;
use paddock_engines::{ContainerConfig, IsolateConfig, SubprocessConfig};

/// Two of `n` ids of 122 random bits share 8 hex digits after their tag with a
/// chance of about n²/2 · 2⁻³²: never, for the handfuls opened here.
const MOST_SHARED_HEX: usize = 8;

/// Checks that every id is `{tag}-{UUIDv4}` and that no two share more than their
/// tag and [`MOST_SHARED_HEX`] digits.
fn unguessable(what: &str, tag: &str, ids: &[String]) {
    assert!(ids.len() >= 2, "{what}: {ids:?}");
    for id in ids {
        let u = random_part(id, tag)
            .unwrap_or_else(|| panic!("{what}: `{id}` is not `{tag}-` and a UUIDv4"));
        assert_eq!(u.get_version_num(), 4, "{what}: {id}");
        assert_eq!(u.get_variant(), uuid::Variant::RFC4122, "{what}: {id}");
    }
    let unique: std::collections::HashSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "{what}: {ids:?}");
    let shared = longest_shared_prefix(ids);
    assert!(
        shared <= tag.len() + 1 + MOST_SHARED_HEX,
        "{what}: two ids share {shared} characters: {ids:?}"
    );
}

/// Opens `n` sandboxes of `engine` at once and returns them.
async fn burst<E: Engine + 'static>(engine: &Arc<E>, n: usize) -> Vec<Arc<dyn Sandbox>> {
    let mut opening = tokio::task::JoinSet::new();
    for _ in 0..n {
        let engine = engine.clone();
        opening.spawn(async move { engine.create(&SandboxSpec::default()).await });
    }
    opening
        .join_all()
        .await
        .into_iter()
        .map(|s| s.expect("a sandbox opens"))
        .collect()
}

async fn destroy_all(sandboxes: Vec<Arc<dyn Sandbox>>) {
    for sb in sandboxes {
        sb.destroy().await.expect("destroyed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subprocess_sandboxes_processes_and_terminals_opened_in_a_burst_share_no_prefix() {
    let engine =
        Arc::new(SubprocessEngine::new(&SubprocessConfig::default()).expect("engine starts"));
    let sandboxes = burst(&engine, 8).await;
    let ids: Vec<String> = sandboxes.iter().map(|s| s.id().to_string()).collect();
    unguessable("subprocess sandboxes", "sp", &ids);

    // Processes and terminals of one sandbox, started at once.
    let sb = sandboxes[0].clone();
    let mut starting = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let sb = sb.clone();
        starting.spawn(async move {
            sb.start_process(ProcessSpec {
                argv: vec!["sleep".into(), "30".into()],
                ..Default::default()
            })
            .await
        });
    }
    let processes: Vec<_> = starting
        .join_all()
        .await
        .into_iter()
        .map(|p| p.expect("a process starts"))
        .collect();
    let ids: Vec<String> = processes
        .iter()
        .map(|p| p.shared().id().to_string())
        .collect();
    unguessable("processes", "p", &ids);
    let mut terminals = Vec::new();
    for _ in 0..3 {
        terminals.push(
            sb.open_terminal(TerminalSpec::default())
                .await
                .expect("a terminal opens"),
        );
    }
    let ids: Vec<String> = terminals
        .iter()
        .map(|t| t.shared().id().to_string())
        .collect();
    unguessable("terminals", "t", &ids);
    destroy_all(sandboxes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolate_sandboxes_opened_in_a_burst_share_no_prefix() {
    let engine = Arc::new(IsolateEngine::new(&IsolateConfig::default()).expect("engine starts"));
    let sandboxes = burst(&engine, 8).await;
    let ids: Vec<String> = sandboxes.iter().map(|s| s.id().to_string()).collect();
    unguessable("isolate sandboxes", "iso", &ids);
    destroy_all(sandboxes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_sandboxes_opened_in_a_burst_share_no_prefix() {
    let engine = match ContainerEngine::new(&ContainerConfig::default()) {
        Ok(e) => Arc::new(e),
        Err(e) if std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_some() => {
            panic!("the container engine must start here: {e}")
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let sandboxes = burst(&engine, 4).await;
    let ids: Vec<String> = sandboxes.iter().map(|s| s.id().to_string()).collect();
    unguessable("container sandboxes", "ct", &ids);
    destroy_all(sandboxes).await;
}
