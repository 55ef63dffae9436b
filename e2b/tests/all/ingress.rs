//! Who reaches a sandbox's ports: a stranger learns nothing from an id (the answer
//! is the same for a sandbox that exists, is paused, or never did), a sandbox's own
//! ports take its traffic token unless it was created with `allowPublicTraffic`, a
//! port has one spelling for the routing and the count alike, and the egress
//! gateway's ports are never forwarded.

use std::time::{Duration, Instant};

use paddock_core::{EngineName, NetworkPolicy};
use paddock_e2b::TemplateConfig;
use serde_json::{json, Value};

use crate::live::{envelope, open, send, Answer, E2bServer, Req, ALICE, BOB};

/// A server on the sandbox's loopback port 8000 that answers every GET with a secret.
const SECRET: &str = "ALICE-SECRET-42";
const SERVER: &str = "import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = b'ALICE-SECRET-42'
        self.send_response(200); self.send_header('Content-Length', str(len(b))); self.end_headers(); self.wfile.write(b)
    def log_message(self, *a): pass
http.server.HTTPServer(('127.0.0.1', 8000), H).serve_forever()
";

fn base() -> TemplateConfig {
    TemplateConfig::default()
}

fn interpreter() -> TemplateConfig {
    TemplateConfig {
        code_interpreter: true,
        ..TemplateConfig::default()
    }
}

/// An id of the same shape as the engine's that no sandbox has.
fn ghost() -> String {
    paddock_core::ids::tagged("sp")
}

/// What a stranger can tell from an answer: its status and its body with the id it
/// named taken out.
fn shape(a: &Answer, id: &str) -> (u16, String) {
    (a.status, a.text().replace(id, "<id>"))
}

fn str_of<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field]
        .as_str()
        .unwrap_or_else(|| panic!("no {field}: {v}"))
}

/// Requests a stranger may send to a sandbox (`id`) and its ports, with `tokens`
/// (access, traffic) of another sandbox of theirs; `ports` says whether the
/// sandbox's own ports are in (not for a public sandbox, whose are open).
fn stranger_requests(id: &str, tokens: (&str, &str), ports: bool) -> Vec<(String, Req)> {
    let list = || Req::new("POST", "/process.Process/List").json(&json!({}));
    let start = || {
        Req::new("POST", "/process.Process/Start").body(
            "application/connect+json",
            envelope(&json!({"process": {"cmd": "/bin/true"}})),
        )
    };
    let mut r = vec![
        ("envd List, no token".into(), list().at_port(id, "49983")),
        (
            "envd List, a wrong token".into(),
            list()
                .at_port(id, "49983")
                .header("x-access-token", "wrong"),
        ),
        (
            "envd List, another sandbox's token".into(),
            list()
                .at_port(id, "49983")
                .header("x-access-token", tokens.0),
        ),
        (
            "envd List, its traffic token's header".into(),
            list()
                .at_port(id, "49983")
                .header("e2b-traffic-access-token", tokens.1),
        ),
        (
            "envd Start stream, no token".into(),
            start().at_port(id, "49983"),
        ),
        (
            "envd health by host name".into(),
            Req::new("GET", "/health").at_host(id, "49983"),
        ),
        (
            "envd files".into(),
            Req::new("GET", "/files?path=/etc/hostname").at_port(id, "49983"),
        ),
        (
            "interpreter, no token".into(),
            Req::new("POST", "/execute")
                .json(&json!({"code": "1"}))
                .at_port(id, "49999"),
        ),
        (
            "interpreter, another sandbox's tokens".into(),
            Req::new("GET", "/contexts")
                .at_port(id, "49999")
                .header("x-access-token", tokens.0)
                .header("e2b-traffic-access-token", tokens.1),
        ),
    ];
    if ports {
        r.extend([
            (
                "port 8000, no token".into(),
                Req::new("GET", "/").at_port(id, "8000"),
            ),
            (
                "port 8000 by host name".into(),
                Req::new("GET", "/").at_host(id, "8000"),
            ),
            (
                "port 8000, another sandbox's traffic token".into(),
                Req::new("GET", "/")
                    .at_port(id, "8000")
                    .header("e2b-traffic-access-token", tokens.1),
            ),
            (
                "port 8000, its access token alone".into(),
                Req::new("GET", "/")
                    .at_port(id, "8000")
                    .header("x-access-token", tokens.0),
            ),
            ("port 3128".into(), Req::new("GET", "/").at_port(id, "3128")),
        ]);
    }
    r
}

/// Sends every stranger's request to `id` and to an id that never existed: the two
/// answers must be the same, byte for byte once each answer's own id is taken out,
/// and the "not found" of a sandbox E2B does not know (502).
async fn same_as_a_ghost(t: &E2bServer, what: &str, id: &str, tokens: (&str, &str), ports: bool) {
    let ghost = ghost();
    assert_eq!(ghost.len(), id.len(), "{id}");
    let theirs = stranger_requests(id, tokens, ports);
    let nobodys = stranger_requests(&ghost, tokens, ports);
    assert!(theirs.len() >= 9);
    for ((name, real), (_, none)) in theirs.into_iter().zip(nobodys) {
        let a = send(t.addr, real).await;
        let b = send(t.addr, none).await;
        assert_eq!(
            shape(&a, id),
            shape(&b, &ghost),
            "{what}, {name}: the sandbox's answer and a missing one's differ"
        );
        assert_eq!(a.status, 502, "{what}, {name}: {}", a.text());
        assert!(
            a.text().contains("was not found"),
            "{what}, {name}: {}",
            a.text()
        );
        // E2B's proxy's shape, outside Connect's routes: its code, message and the id.
        if a.json()["code"] == 502 {
            assert_eq!(
                a.json()["message"],
                "The sandbox was not found",
                "{what}, {name}"
            );
            assert_eq!(a.json()["sandboxId"], id, "{what}, {name}");
        }
        assert!(!a.text().contains(SECRET), "{what}, {name}");
    }
}

/// Starts the secret server in sandbox `id` through the native API (the E2B
/// sandbox is alice's session there too).
async fn start_server(t: &E2bServer, id: &str) {
    let r = send(
        t.addr,
        Req::new("POST", &format!("/v1/sandboxes/{id}/processes"))
            .header("authorization", &format!("Bearer {ALICE}"))
            .json(&json!({"argv": ["python3", "-c", SERVER]})),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
}

/// Waits up to 15 s for `req` to be answered 200 with the secret.
async fn until_served(t: &E2bServer, req: Req) -> Answer {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let a = send(t.addr, req.clone()).await;
        if a.status == 200 || Instant::now() > deadline {
            return a;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_without_the_sandboxs_token_learns_nothing_from_its_id() {
    let containers = paddock_engines_available();
    let mut templates = vec![("base", base()), ("code-interpreter-v1", interpreter())];
    if containers {
        templates.push((
            "frozen",
            TemplateConfig {
                engine: Some(EngineName::CONTAINER),
                level: paddock_core::IsolationLevel::Strict,
                ..TemplateConfig::default()
            },
        ));
    }
    let t = E2bServer::start(256, &templates);
    let private = t.create(ALICE, "base", json!({})).await;
    let public = t
        .create(ALICE, "base", json!({"allowPublicTraffic": true}))
        .await;
    let interp = t.create(ALICE, "code-interpreter-v1", json!({})).await;
    let bobs = t.create(BOB, "code-interpreter-v1", json!({})).await;
    let tokens = (
        str_of(&bobs, "envdAccessToken"),
        str_of(&bobs, "trafficAccessToken"),
    );
    // Ids are the engine's, random: no counter, no clock.
    for s in [&private, &public, &interp, &bobs] {
        let id = str_of(s, "sandboxID");
        assert!(
            paddock_core::ids::random_part(id, "sp").is_some(),
            "{id} is not `sp-` and a UUIDv4"
        );
    }

    same_as_a_ghost(
        &t,
        "a private sandbox",
        str_of(&private, "sandboxID"),
        tokens,
        true,
    )
    .await;
    same_as_a_ghost(
        &t,
        "an interpreter",
        str_of(&interp, "sandboxID"),
        tokens,
        true,
    )
    .await;
    // A public sandbox's agent and interpreter are not public.
    same_as_a_ghost(
        &t,
        "a public sandbox",
        str_of(&public, "sandboxID"),
        tokens,
        false,
    )
    .await;

    // Paused (the container engine has a freezer): the same again.
    if containers {
        let frozen = t.create(ALICE, "frozen", json!({})).await;
        let id = str_of(&frozen, "sandboxID");
        assert!(paddock_core::ids::random_part(id, "ct").is_some(), "{id}");
        let r = send(
            t.addr,
            Req::new("POST", &format!("/sandboxes/{id}/pause")).header("x-api-key", ALICE),
        )
        .await;
        assert_eq!(r.status, 204, "pause: {}", r.text());
        let ghost = paddock_core::ids::tagged("ct");
        for (name, req) in stranger_requests(id, tokens, true) {
            let a = send(t.addr, req).await;
            let b = send(
                t.addr,
                stranger_requests(&ghost, tokens, true)
                    .into_iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, r)| r)
                    .expect("the same request"),
            )
            .await;
            assert_eq!(shape(&a, id), shape(&b, &ghost), "paused, {name}");
            assert_eq!(a.status, 502, "paused, {name}: {}", a.text());
        }
        // Its owner gets what E2B's proxy answers for a paused sandbox: a 502
        // (which the SDK's `is_running()` reads as `False`) that names it.
        let r = send(
            t.addr,
            Req::new("GET", "/health")
                .at_port(id, "49983")
                .header("x-access-token", str_of(&frozen, "envdAccessToken")),
        )
        .await;
        assert_eq!(r.status, 502, "{}", r.text());
        let body = r.json();
        assert_eq!(
            (&body["code"], &body["message"], &body["sandboxId"]),
            (&json!(502), &json!("The sandbox is paused"), &json!(id)),
            "{body}"
        );
    } else {
        eprintln!("the paused case skipped: no container engine here");
    }
    t.stop().await;
}

/// Whether this host runs the container engine (crun or runc); required where
/// `PADDOCK_REQUIRE_CONTAINERS` is set.
fn paddock_engines_available() -> bool {
    let found = ["crun", "runc"].iter().any(|r| {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {r}")])
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    assert!(
        found || std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none(),
        "PADDOCK_REQUIRE_CONTAINERS is set but neither crun nor runc is installed"
    );
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxs_own_ports_take_its_traffic_token_unless_it_is_public() {
    let listed = TemplateConfig {
        network: NetworkPolicy::Allowlist {
            hosts: vec!["example.test".into()],
            ports: vec![],
        },
        ..TemplateConfig::default()
    };
    let t = E2bServer::start(256, &[("base", base()), ("listed", listed)]);
    let private = t.create(ALICE, "base", json!({})).await;
    let public = t
        .create(ALICE, "base", json!({"allowPublicTraffic": true}))
        .await;
    let explicit = t
        .create(ALICE, "base", json!({"allowPublicTraffic": false}))
        .await;
    // A private sandbox gets a traffic token (256 random bits), a public one none.
    for s in [&private, &explicit] {
        let token = str_of(s, "trafficAccessToken");
        assert_eq!(token.len(), 64, "{s}");
        assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{s}");
    }
    assert!(public.get("trafficAccessToken").is_none(), "{public}");
    let (pid, traffic) = (
        str_of(&private, "sandboxID"),
        str_of(&private, "trafficAccessToken"),
    );
    let qid = str_of(&public, "sandboxID");
    start_server(&t, pid).await;
    start_server(&t, qid).await;

    // Private: the traffic token opens it, by header and by host name...
    let r = until_served(
        &t,
        Req::new("GET", "/")
            .at_port(pid, "8000")
            .header("e2b-traffic-access-token", traffic),
    )
    .await;
    assert_eq!((r.status, r.text().as_str()), (200, SECRET));
    let r = send(
        t.addr,
        Req::new("GET", "/x")
            .at_host(pid, "8000")
            .header("e2b-traffic-access-token", traffic),
    )
    .await;
    assert_eq!((r.status, r.text().as_str()), (200, SECRET));
    // ...and nothing else does: no token, its access token, another's traffic token.
    let explicit_traffic = str_of(&explicit, "trafficAccessToken");
    for (name, req) in [
        ("no token", Req::new("GET", "/").at_port(pid, "8000")),
        ("by host name", Req::new("GET", "/").at_host(pid, "8000")),
        (
            "its access token",
            Req::new("GET", "/")
                .at_port(pid, "8000")
                .header("x-access-token", str_of(&private, "envdAccessToken")),
        ),
        (
            "another sandbox's traffic token",
            Req::new("GET", "/")
                .at_port(pid, "8000")
                .header("e2b-traffic-access-token", explicit_traffic),
        ),
    ] {
        let r = send(t.addr, req).await;
        assert_eq!(r.status, 502, "{name}: {}", r.text());
        assert!(!r.text().contains(SECRET), "{name}");
    }

    // Public: open to anyone, by header and by host name; its agent is not.
    let r = until_served(&t, Req::new("GET", "/").at_port(qid, "8000")).await;
    assert_eq!((r.status, r.text().as_str()), (200, SECRET));
    let r = send(t.addr, Req::new("GET", "/").at_host(qid, "8000")).await;
    assert_eq!((r.status, r.text().as_str()), (200, SECRET));
    let r = send(t.addr, Req::new("GET", "/health").at_port(qid, "49983")).await;
    assert_eq!(r.status, 502, "the agent of a public sandbox: {}", r.text());
    let r = send(
        t.addr,
        Req::new("GET", "/health")
            .at_port(qid, "49983")
            .header("x-access-token", str_of(&public, "envdAccessToken")),
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text());

    // The egress gateway's ports in an allowlist sandbox are never forwarded, even
    // to its owner's traffic token, while its own ports are.
    let allowlists = t
        .paddock
        .capabilities()
        .iter()
        .any(|(n, c)| *n == EngineName::SUBPROCESS && c.network.contains("allowlist"));
    if allowlists {
        let listed = t.create(ALICE, "listed", json!({})).await;
        let (lid, ltraffic) = (
            str_of(&listed, "sandboxID"),
            str_of(&listed, "trafficAccessToken"),
        );
        start_server(&t, lid).await;
        let r = until_served(
            &t,
            Req::new("GET", "/")
                .at_port(lid, "8000")
                .header("e2b-traffic-access-token", ltraffic),
        )
        .await;
        assert_eq!((r.status, r.text().as_str()), (200, SECRET));
        for port in ["3128", "15001", "53"] {
            let r = send(
                t.addr,
                Req::new("GET", "/")
                    .at_port(lid, port)
                    .header("e2b-traffic-access-token", ltraffic),
            )
            .await;
            assert_eq!(r.status, 403, "port {port}: {}", r.text());
            assert!(r.text().contains("gateway"), "port {port}: {}", r.text());
        }
    } else {
        assert!(
            std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none(),
            "allowlists must be enforced here"
        );
        eprintln!("the gateway case skipped: no allowlists here");
    }
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_has_one_spelling_for_the_routing_and_the_count() {
    // One request in progress per tenant.
    let t = E2bServer::start(1, &[("base", base())]);
    let s = t.create(ALICE, "base", json!({})).await;
    let (id, token) = (str_of(&s, "sandboxID"), str_of(&s, "envdAccessToken"));
    let health = |id: &str, port: &str| {
        Req::new("GET", "/health")
            .at_port(id, port)
            .header("x-access-token", token)
    };
    let r = send(t.addr, health(id, "49983")).await;
    assert_eq!(r.status, 204, "{}", r.text());

    // Other spellings reach no agent: refused before any sandbox is looked up, the
    // same for a sandbox that exists and one that does not.
    let ghost = ghost();
    let spelled = |id: &str, port: &str| -> Vec<Req> {
        vec![
            health(id, port),
            Req::new("GET", "/health")
                .at_host(id, port)
                .header("x-access-token", token),
        ]
    };
    for port in [
        "049983", "+49983", "0049983", "49983.0", "0x c34f", "0", "65536",
    ] {
        for (mine, nobodys) in spelled(id, port).into_iter().zip(spelled(&ghost, port)) {
            let by_host = mine.headers.iter().any(|(n, _)| n == "host");
            let a = send(t.addr, mine).await;
            let b = send(t.addr, nobodys).await;
            if by_host && !port.bytes().all(|c| c.is_ascii_digit()) {
                // Not a `{digits}-` label: not a sandbox's host name at all, so the
                // native API answers it (it is no E2B request).
                assert_ne!(a.status, 204, "{port:?} by host");
                continue;
            }
            assert_eq!(a.status, 400, "{port:?} (host: {by_host}): {}", a.text());
            assert_eq!(shape(&a, id), shape(&b, &ghost), "{port:?}");
        }
    }

    // The count sees the port the routing sees: with alice's one place held by a
    // stream, the agent's port is 429 for her, and its other spellings are still
    // no port (400), never admitted around the cap.
    let held = open(
        t.addr,
        Req::new("POST", "/process.Process/Start")
            .body(
                "application/connect+json",
                envelope(&json!({"process": {"cmd": "/bin/sleep", "args": ["5"]}})),
            )
            .at_port(id, "49983")
            .header("x-access-token", token),
    )
    .await;
    assert_eq!(held.status().as_u16(), 200);
    let r = send(t.addr, health(id, "49983")).await;
    assert_eq!(r.status, 429, "{}", r.text());
    for port in ["049983", "+49983"] {
        let r = send(t.addr, health(id, port)).await;
        assert_eq!(r.status, 400, "{port}: {}", r.text());
    }
    drop(held);
    t.stop().await;
}

/// Without `e2b.domain` (the URL mode), a sandbox's `domain` is the name the client
/// reached the server by (a loopback address as `localhost`), and the server routes
/// the names `get_host(port)` builds under it by their `Host`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_modes_domain_names_this_server() {
    let t = E2bServer::start_with(256, &[("base", base())], |c| c.e2b.domain = None);
    let created = t
        .create(ALICE, "base", json!({"allowPublicTraffic": true}))
        .await;
    let id = str_of(&created, "sandboxID");
    let domain = format!("localhost:{}", t.addr.port());
    assert_eq!(created["domain"], domain.as_str(), "{created}");
    let r = send(
        t.addr,
        Req::new("GET", &format!("/sandboxes/{id}")).header("x-api-key", ALICE),
    )
    .await;
    assert_eq!(r.json()["domain"], domain.as_str());
    start_server(&t, id).await;
    // What `get_host(8000)` gives: `8000-{id}.{domain}`.
    let r = until_served(
        &t,
        Req::new("GET", "/").header("host", &format!("8000-{id}.{domain}")),
    )
    .await;
    assert_eq!((r.status, r.text().as_str()), (200, SECRET));
    // The native API and the control plane are still reached by the address.
    let r = send(
        t.addr,
        Req::new("GET", "/sandboxes").header("x-api-key", ALICE),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    t.stop().await;
}

/// A server on port 8000 that answers the `Host` it was sent.
const HOST_ECHO: &str = "import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = self.headers.get('Host', '').encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(('127.0.0.1', 8000), H).serve_forever()
";

/// `network.maskRequestHost`: the `Host` a sandbox's servers see, `${PORT}` put in;
/// without it, the caller's own. A mask that makes no host is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_masked_sandbox_s_servers_see_the_mask_as_host() {
    let t = E2bServer::start(256, &[("base", base())]);
    let masked = t
        .create(
            ALICE,
            "base",
            json!({"allowPublicTraffic": true, "maskRequestHost": "localhost:${PORT}"}),
        )
        .await;
    let plain = t
        .create(ALICE, "base", json!({"allowPublicTraffic": true}))
        .await;
    for s in [&masked, &plain] {
        let id = str_of(s, "sandboxID");
        let r = send(
            t.addr,
            Req::new("POST", &format!("/v1/sandboxes/{id}/processes"))
                .header("authorization", &format!("Bearer {ALICE}"))
                .json(&json!({"argv": ["python3", "-c", HOST_ECHO]})),
        )
        .await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let r = until_served(
        &t,
        Req::new("GET", "/").at_port(str_of(&masked, "sandboxID"), "8000"),
    )
    .await;
    assert_eq!((r.status, r.text().as_str()), (200, "localhost:8000"));
    let r = until_served(
        &t,
        Req::new("GET", "/").at_port(str_of(&plain, "sandboxID"), "8000"),
    )
    .await;
    assert_eq!((r.status, r.text()), (200, t.addr.to_string()));
    for bad in ["", "two words", "user@${PORT}.example.test", "a/b"] {
        let r = send(
            t.addr,
            Req::new("POST", "/sandboxes")
                .header("x-api-key", ALICE)
                .json(&json!({"templateID": "base", "network": {"maskRequestHost": bad}})),
        )
        .await;
        assert_eq!(r.status, 400, "{bad:?}: {}", r.text());
        assert!(r.text().contains("maskRequestHost"), "{}", r.text());
    }
    t.stop().await;
}
