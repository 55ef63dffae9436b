//! A live Paddock serving the E2B API on a free loopback port, and a small HTTP/1.1
//! client.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use paddock::PaddockConfig;
use paddock_core::{EngineName, IsolationLevel, NetworkKind};
use paddock_e2b::{E2bApi, E2bConfig, TemplateConfig};
use paddock_pool::http::{ApiKey, HttpServerHandle};
use paddock_pool::Paddock;
use serde_json::Value;

pub const ALICE: &str = "alice-key-0123456789abcdef";
pub const BOB: &str = "bob-key-0123456789abcdef00";
pub const DOMAIN: &str = "e2b.test";

/// A server with keys for alice and bob, E2B on, and `templates` (all on the
/// subprocess engine unless they name another).
pub struct E2bServer {
    pub addr: SocketAddr,
    pub paddock: Paddock,
    pub api: E2bApi,
    http: Option<HttpServerHandle>,
}

impl E2bServer {
    pub fn start(max_requests_per_tenant: u32, templates: &[(&str, TemplateConfig)]) -> E2bServer {
        E2bServer::start_with(max_requests_per_tenant, templates, |_| {})
    }

    /// [`start`](Self::start), with `tweak` applied to the configuration last.
    pub fn start_with(
        max_requests_per_tenant: u32,
        templates: &[(&str, TemplateConfig)],
        tweak: impl FnOnce(&mut PaddockConfig),
    ) -> E2bServer {
        let mut config = PaddockConfig::default();
        // One ready sandbox per pool: these tests open their own.
        config.pool.min_idle = 1;
        config.server.listen = "127.0.0.1:0".into();
        config.server.api_keys = vec![ApiKey::new(ALICE, "alice"), ApiKey::new(BOB, "bob")];
        config.server.allowed_levels = Some(vec![IsolationLevel::None, IsolationLevel::Strict]);
        config.server.allowed_networks = Some(vec![NetworkKind::None, NetworkKind::Allowlist]);
        config.server.max_requests_per_tenant = max_requests_per_tenant;
        config.e2b = E2bConfig {
            enabled: true,
            domain: Some(DOMAIN.into()),
            ..E2bConfig::default()
        };
        tweak(&mut config);
        let server = config.server.clone();
        let e2b = config.e2b.clone();
        let templates: BTreeMap<String, TemplateConfig> = templates
            .iter()
            .map(|(name, t)| {
                let mut t = t.clone();
                t.engine.get_or_insert(EngineName::SUBPROCESS);
                (name.to_string(), t)
            })
            .collect();
        let paddock = paddock::builder()
            .config(config)
            .access(server.access_rules())
            .start()
            .expect("Paddock starts");
        let api = E2bApi::new(paddock.clone(), e2b, &server, templates).expect("the E2B API");
        let routes = api.clone();
        let extension: paddock_pool::http::Extension =
            Arc::new(move |cfg: &mut actix_web::web::ServiceConfig| routes.configure(cfg));
        let http = paddock_pool::http::start_with(paddock.clone(), server, vec![extension])
            .expect("the server starts");
        let addr = http.local_addr();
        assert!(addr.ip().is_loopback(), "{addr}");
        E2bServer {
            addr,
            paddock,
            api,
            http: Some(http),
        }
    }

    /// Ends every sandbox, shuts Paddock down and stops the server.
    pub async fn stop(mut self) {
        self.api.close_all().await;
        let http = self.http.take().expect("running");
        http.begin_drain();
        let _ = self.paddock.shutdown(Duration::from_secs(5)).await;
        http.stop().await;
    }

    /// Opens a sandbox of `template` for `key` with `network` (E2B's create body
    /// field) and answers the create's body.
    pub async fn create(&self, key: &str, template: &str, network: Value) -> Value {
        let body = serde_json::json!({"templateID": template, "network": network});
        let r = send(
            self.addr,
            Req::new("POST", "/sandboxes")
                .header("x-api-key", key)
                .json(&body),
        )
        .await;
        assert_eq!(r.status, 201, "create {template}: {}", r.text());
        r.json()
    }
}

/// A request.
#[derive(Clone)]
pub struct Req {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Req {
    pub fn new(method: &str, path: &str) -> Req {
        Req {
            method: method.into(),
            path: path.into(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Req {
        self.headers.push((name.to_ascii_lowercase(), value.into()));
        self
    }

    pub fn json(self, v: &Value) -> Req {
        let mut r = self.header("content-type", "application/json");
        r.body = v.to_string().into_bytes();
        r
    }

    pub fn body(mut self, content_type: &str, body: Vec<u8>) -> Req {
        self = self.header("content-type", content_type);
        self.body = body;
        self
    }

    /// The same request to the sandbox `id`'s `port`, by the routing headers.
    pub fn at_port(self, id: &str, port: &str) -> Req {
        self.header("e2b-sandbox-id", id)
            .header("e2b-sandbox-port", port)
    }

    /// The same request to `{port}-{id}.{DOMAIN}`, by host name.
    pub fn at_host(self, id: &str, port: &str) -> Req {
        self.header("host", &format!("{port}-{id}.{DOMAIN}"))
    }
}

/// An answer, read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.text()))
    }
}

/// Sends `req` and reads the whole answer (within 30 s).
pub async fn send(addr: SocketAddr, req: Req) -> Answer {
    let answer = tokio::time::timeout(Duration::from_secs(30), async {
        let response = open(addr, req).await;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes().to_vec())
            .unwrap_or_default();
        Answer { status, body }
    })
    .await;
    answer.expect("an answer within 30 s")
}

/// Sends `req` and answers as soon as the answer's head is in; its body streams on.
pub async fn open(addr: SocketAddr, req: Req) -> hyper::Response<hyper::body::Incoming> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("HTTP/1.1 handshake");
    tokio::spawn(connection);
    let mut builder = hyper::Request::builder()
        .method(req.method.as_str())
        .uri(req.path.as_str());
    if !req.headers.iter().any(|(n, _)| n == "host") {
        builder = builder.header("host", addr.to_string());
    }
    for (n, v) in &req.headers {
        builder = builder.header(n.as_str(), v.as_str());
    }
    let request = builder
        .body(http_body_util::Full::new(bytes::Bytes::from(req.body)))
        .expect("a request");
    sender.send_request(request).await.expect("an answer")
}

/// A Connect envelope holding `message`.
pub fn envelope(message: &Value) -> Vec<u8> {
    let payload = message.to_string().into_bytes();
    let mut out = vec![0u8];
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&payload);
    out
}
