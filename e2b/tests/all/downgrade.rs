//! An engine that cannot start is never replaced by a weaker one: a template that
//! needs it is refused with why, and so is a native request that names it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use paddock::PaddockConfig;
use paddock_core::{EngineName, ErrorCode, IsolationLevel, SandboxSpec};
use paddock_e2b::{E2bApi, E2bConfig};
use paddock_pool::http::ApiKey;

use crate::live::{send, Req, ALICE, BOB};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_whose_engine_cannot_start_is_refused_not_moved_to_a_weaker_one() {
    let mut config = PaddockConfig::default();
    config.pool.min_idle = 0;
    config.server.listen = "127.0.0.1:0".into();
    config.server.api_keys = vec![ApiKey::new(ALICE, "alice"), ApiKey::new(BOB, "bob")];
    // Level `none` allowed: the subprocess engine would take the sandbox if the
    // template were downgraded.
    config.server.allowed_levels = Some(vec![IsolationLevel::None, IsolationLevel::Strict]);
    // A container engine that cannot start: its runtime is not there.
    config.container.runtime_path = Some("/nonexistent/paddock-test-runtime".into());
    let server = config.server.clone();
    let paddock = paddock::builder()
        .config(config)
        .access(server.access_rules())
        .start()
        .expect("Paddock starts without the container engine");
    let unavailable = paddock.unavailable_engines();
    assert_eq!(unavailable.len(), 1, "{unavailable:?}");
    assert_eq!(unavailable[0].0, EngineName::CONTAINER);
    assert!(unavailable[0].1.contains("runtime_path"), "{unavailable:?}");

    // Natively: naming the engine is refused with why.
    let spec = SandboxSpec {
        tenant: Some("alice".into()),
        ..SandboxSpec::default()
    };
    let e = paddock
        .open_sandbox(spec, Some(EngineName::CONTAINER))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::CapabilityNotSupported, "{e}");
    assert!(e.message.contains("runtime_path"), "{}", e.message);

    // Through E2B: the built-in `base` template (no engine named) is refused.
    let e2b = E2bConfig {
        enabled: true,
        ..E2bConfig::default()
    };
    let api = E2bApi::new(paddock.clone(), e2b, &server, BTreeMap::new()).expect("the E2B API");
    let routes = api.clone();
    let extension: paddock_pool::http::Extension =
        Arc::new(move |cfg: &mut actix_web::web::ServiceConfig| routes.configure(cfg));
    let http = paddock_pool::http::start_with(paddock.clone(), server, vec![extension])
        .expect("the server starts");
    let r = send(
        http.local_addr(),
        Req::new("POST", "/sandboxes")
            .header("x-api-key", ALICE)
            .json(&serde_json::json!({"templateID": "base"})),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    let text = r.text();
    for part in [
        "CAPABILITY_NOT_SUPPORTED",
        "template `base`",
        "container engine",
        "runtime_path",
    ] {
        assert!(text.contains(part), "{part:?} in {text}");
    }
    // And nothing was opened on another engine.
    let stats = paddock.stats().await.unwrap();
    assert_eq!(stats.sandboxes, 0, "{stats:?}");

    api.close_all().await;
    http.begin_drain();
    let _ = paddock.shutdown(Duration::from_secs(5)).await;
    http.stop().await;
}
