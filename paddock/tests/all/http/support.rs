//! A Paddock with its HTTP server on a free loopback port, one per test.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use paddock::{PaddockBuilder, PaddockConfig};
use paddock_pool::http::{HttpServerHandle, ServerConfig};
use paddock_pool::Paddock;
use serde_json::{json, Value};

use crate::http::client::{Request, Streaming};

/// The server settings every test starts from: loopback, a free port.
pub fn server_config() -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".into(),
        ..ServerConfig::default()
    }
}

/// A running Paddock and its HTTP server.
pub struct TestServer {
    pub paddock: Paddock,
    pub addr: SocketAddr,
    server: Option<HttpServerHandle>,
}

impl TestServer {
    /// Defaults everywhere.
    pub fn start() -> TestServer {
        // One ready sandbox per pool: the default eight of every engine, made at
        // each test server's start, would crowd two cores for tests that do not
        // use them.
        let mut config = PaddockConfig::default();
        config.pool.min_idle = 1;
        TestServer::start_with(paddock::builder().config(config), server_config())
    }

    /// A Paddock built from `builder`, served with `server`.
    pub fn start_with(builder: PaddockBuilder, server: ServerConfig) -> TestServer {
        assert!(
            server.listen.starts_with("127.0.0.1:"),
            "tests listen on loopback only"
        );
        let paddock = builder
            .access(server.access_rules())
            .start()
            .expect("Paddock starts");
        let handle = paddock_pool::http::start(paddock.clone(), server).expect("server starts");
        let addr = handle.local_addr();
        assert!(addr.ip().is_loopback(), "{addr}");
        assert_ne!(addr.port(), 0);
        TestServer {
            paddock,
            addr,
            server: Some(handle),
        }
    }

    /// A Paddock with this config, served with `server`.
    pub fn start_config(config: PaddockConfig, server: ServerConfig) -> TestServer {
        TestServer::start_with(paddock::builder().config(config), server)
    }

    /// A Paddock with this whole config (its `[server]` section, and the access
    /// rules it implies with `[egress]`), served with its `[server]`.
    pub fn start_whole(config: PaddockConfig) -> TestServer {
        let server = config.server.clone();
        let paddock = paddock::builder()
            .config(config)
            .start()
            .expect("Paddock starts");
        let handle = paddock_pool::http::start(paddock.clone(), server).expect("server starts");
        let addr = handle.local_addr();
        assert!(addr.ip().is_loopback(), "{addr}");
        TestServer {
            paddock,
            addr,
            server: Some(handle),
        }
    }

    /// Where `/metrics` is served when `server.metrics` gives it an address of its own.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.server.as_ref().and_then(|s| s.metrics_addr())
    }

    pub fn begin_drain(&self) {
        self.server.as_ref().expect("running").begin_drain();
    }

    /// Drains for up to 5 s, shuts Paddock down and stops the server.
    pub async fn stop(mut self) {
        let server = self.server.take().expect("running");
        server.begin_drain();
        self.paddock
            .shutdown(Duration::from_secs(5))
            .await
            .expect("Paddock shuts down");
        server.stop().await;
    }

    /// Stops the server of a Paddock the test has already shut down.
    pub async fn stop_server(mut self) {
        self.server.take().expect("running").stop().await;
    }
}

/// `{"program":{"command":["sh","-c",script]}}`.
pub fn sh(script: &str) -> Value {
    json!({"program": {"command": ["sh", "-c", script]}})
}

/// Opens `POST path?stream=true` with `body`, checks the NDJSON answer and its
/// `started` line, and returns the stream positioned after it, with the id.
pub async fn open_stream(addr: SocketAddr, path: &str, body: &Value) -> (Streaming, String) {
    open_stream_with(
        addr,
        Request::post(&format!("{path}?stream=true")).json(body),
    )
    .await
}

/// [`open_stream`] for a prepared request.
pub async fn open_stream_with(addr: SocketAddr, req: Request) -> (Streaming, String) {
    let mut s = req.stream(addr).await;
    assert_eq!(s.status, 200);
    assert_eq!(s.header("content-type"), Some("application/x-ndjson"));
    let (_, first) = s.next_line().await.expect("a started line");
    assert_eq!(first["type"], "started", "{first}");
    let id = first["id"].as_str().expect("started has an id").to_string();
    (s, id)
}

/// Reads stream lines until a stdout line containing `needle` (panics if the stream
/// ends first). Returns the lines read, that one included.
pub async fn wait_for_stdout(s: &mut Streaming, needle: &str) -> Vec<Value> {
    let mut seen = Vec::new();
    let mut out = String::new();
    while let Some((_, line)) = s.next_line().await {
        seen.push(line.clone());
        if line["type"] == "stdout" {
            out.push_str(line["data"].as_str().unwrap());
            if out.contains(needle) {
                return seen;
            }
        }
    }
    panic!("the stream ended before stdout had {needle:?}: {seen:?}");
}

/// Reads the rest of a stream; returns the concatenated stdout, the concatenated
/// stderr and the final line (`result` or `error`), checking nothing follows it.
pub async fn finish_stream(s: Streaming) -> (String, String, Value) {
    let lines = s.lines().await;
    let (last, rest) = lines.split_last().expect("a final line");
    let (mut out, mut err) = (String::new(), String::new());
    for (_, l) in rest {
        match l["type"].as_str() {
            Some("stdout") => out.push_str(l["data"].as_str().unwrap()),
            Some("stderr") => err.push_str(l["data"].as_str().unwrap()),
            _ => panic!("unexpected line before the end: {l}"),
        }
    }
    let last = last.1.clone();
    assert!(
        last["type"] == "result" || last["type"] == "error",
        "the stream ends with result or error: {last}"
    );
    (out, err, last)
}

/// Polls `cond` every 10 ms for up to `within`.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if cond().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A result with its `type` field removed (stream result lines carry one).
pub fn without_type(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("type");
    }
    v
}
