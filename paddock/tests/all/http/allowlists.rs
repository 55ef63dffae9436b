//! Allowlists under API keys: what a tenant may name. The closed ranges (loopback,
//! link-local and the metadata address, unspecified, multicast, reserved) are
//! refused to everyone in every spelling; private ranges only to a tenant the
//! operator allows them (`[egress] allow_private`, or the key's `allow_private`).
//! Sandboxes and executions pass the same check.

use paddock::PaddockConfig;
use paddock_core::IsolationLevel;
use paddock_pool::http::ApiKey;
use serde_json::json;

use crate::http::client::Request;
use crate::http::support::{server_config, TestServer};

const ALICE: &str = "key-alice-0123456789";
const BOB: &str = "key-bob-0123456789ab";

fn as_(key: &str, r: Request) -> Request {
    r.header("Authorization", &format!("Bearer {key}"))
}

/// Alice may not list private ranges (the default under keys); bob's key allows
/// them.
fn server(mut config: PaddockConfig) -> TestServer {
    let mut server = server_config();
    let mut bob = ApiKey::new(BOB, "bob");
    bob.allow_private = Some(true);
    server.api_keys = vec![ApiKey::new(ALICE, "alice"), bob];
    server.allowed_levels = Some(vec![
        IsolationLevel::None,
        IsolationLevel::ContextIsolated,
        IsolationLevel::Strict,
    ]);
    config.server = server;
    TestServer::start_whole(config)
}

fn allowlist(host: &str) -> serde_json::Value {
    json!({"allowlist": {"hosts": ["pypi.org", host], "ports": [80]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_tenant_names_a_closed_range_and_private_ones_need_the_operator() {
    let t = server(PaddockConfig::default());
    let closed = [
        "127.0.0.1",
        "127.1",
        "2130706433",
        "0x7f.0.0.1",
        "0177.0.0.1",
        "::1",
        "::ffff:127.0.0.1",
        "169.254.169.254",
        "169.254.0.0/16",
        "0.0.0.0/0",
        "0.0.0.0",
        "::/0",
        "224.0.0.1",
        "fe80::1",
    ];
    for key in [ALICE, BOB] {
        for host in closed {
            for (path, body) in [
                ("/v1/sandboxes", json!({"network": allowlist(host)})),
                (
                    "/v1/executions",
                    json!({"program": {"command": ["true"]}, "network": allowlist(host)}),
                ),
            ] {
                let r = as_(key, Request::post(path)).json(&body).send(t.addr).await;
                let message = r.expect_error(400, "INVALID_OPTIONS");
                assert!(
                    message.contains("network.allowlist.hosts[1]")
                        && message.contains("no sandbox reaches"),
                    "{path} {host}: {message}"
                );
            }
        }
    }
    for host in [
        "10.0.0.0/8",
        "192.168.1.7",
        "172.16.0.0/12",
        "100.64.0.1",
        "fd00::/8",
    ] {
        let r = as_(ALICE, Request::post("/v1/sandboxes"))
            .json(&json!({"network": allowlist(host)}))
            .send(t.addr)
            .await;
        let message = r.expect_error(400, "INVALID_OPTIONS");
        assert!(
            message.contains("allow_private") && message.contains("tenant `alice`"),
            "{host}: {message}"
        );
        // Bob's key allows them: whatever the engine answers, it is not this
        // refusal.
        let r = as_(BOB, Request::post("/v1/sandboxes"))
            .json(&json!({"network": allowlist(host)}))
            .send(t.addr)
            .await;
        assert!(
            !r.text().contains("allow_private"),
            "{host}: {} {}",
            r.status,
            r.text()
        );
    }
    // Public ranges are anyone's to list.
    let r = as_(ALICE, Request::post("/v1/sandboxes"))
        .json(&json!({"network": allowlist("198.51.100.0/24")}))
        .send(t.addr)
        .await;
    assert!(!r.text().contains("INVALID_OPTIONS"), "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_opens_private_ranges_for_every_key() {
    let mut config = PaddockConfig::default();
    config.egress.allow_private = Some(true);
    let t = server(config);
    let r = as_(ALICE, Request::post("/v1/sandboxes"))
        .json(&json!({"network": allowlist("10.0.0.0/8")}))
        .send(t.addr)
        .await;
    assert!(!r.text().contains("allow_private"), "{}", r.text());
    // Closed ranges stay closed.
    as_(ALICE, Request::post("/v1/sandboxes"))
        .json(&json!({"network": allowlist("127.0.0.0/8")}))
        .send(t.addr)
        .await
        .expect_error(400, "INVALID_OPTIONS");
}
