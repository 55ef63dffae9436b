//! The template API's alias lookup (`Template.exists`): the server's templates,
//! the same for every key, in E2B's shapes.

use paddock_e2b::TemplateConfig;
use serde_json::json;

use crate::live::{send, E2bServer, Req, ALICE, BOB};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_template_exists_for_every_key() {
    let t = E2bServer::start(256, &[("base", TemplateConfig::default())]);
    for key in [ALICE, BOB] {
        let r = send(
            t.addr,
            Req::new("GET", "/templates/aliases/base").header("x-api-key", key),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["templateID"], "base");
    }
    let r = send(
        t.addr,
        Req::new("GET", "/templates/aliases/no-such-template").header("x-api-key", ALICE),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.json()["code"], 404, "E2B's shape: {}", r.text());
    // Without a key: E2B's 401, before anything else.
    let r = send(t.addr, Req::new("GET", "/templates/aliases/base")).await;
    assert_eq!(
        (r.status, &r.json()["code"]),
        (401, &json!(401)),
        "{}",
        r.text()
    );
    // Another path of the template API this server does not offer: E2B's 404.
    let r = send(
        t.addr,
        Req::new("POST", "/v3/templates").header("x-api-key", ALICE),
    )
    .await;
    assert_eq!(
        (r.status, &r.json()["code"]),
        (404, &json!(404)),
        "{}",
        r.text()
    );
    t.stop().await;
}
