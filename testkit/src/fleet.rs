//! The fleet's tests, shared by the fleet's own (`fleet/tests/all`, nodes in the test
//! process) and the binary's (`cli/tests/fleet`, nodes as `paddock serve`
//! processes, for what only a process shows: SIGKILL under load, SIGSTOP): an HTTP
//! client, a look at the fleet's state on NATS, the tenants' keys and the calls the
//! tests make through any node ([`FleetNode`]).

use std::io::BufRead;
use std::io::BufReader;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// The `nats-server` to run (`paddock_testkit::nats_server`: `PADDOCK_NATS_SERVER`,
/// else the pinned one it installs into the target directory on first use); the test
/// returns when `PADDOCK_SKIP` lists `fleet`, and fails when there is none.
#[macro_export]
macro_rules! need_nats {
    () => {
        match $crate::nats_server() {
            Some(p) => p,
            None => return,
        }
    };
}

/// A node of a fleet under test, however it runs.
pub trait FleetNode {
    /// Its id in the fleet.
    fn id(&self) -> &str;
    /// Its HTTP API's URL (`http://127.0.0.1:PORT`).
    fn url(&self) -> &str;
    /// The processes it runs for its executions and sandboxes (their pids).
    fn programs(&self) -> Vec<u32>;
}

static TURN: Mutex<()> = Mutex::new(());

/// The tests take turns (one cluster at a time on two cores).
pub fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Alice's API key.
pub const ALICE: &str = "alice-key-0123456789";
/// Bob's API key.
pub const BOB: &str = "bob-key-0123456789ab";
/// The operator's API key.
pub const ADMIN: &str = "admin-key-0123456789";

/// API keys for two tenants and an operator.
pub const KEYS: &str = r#"
[server]
allowed_levels = ["none", "context-isolated", "strict"]
[[server.api_keys]]
key = "alice-key-0123456789"
tenant = "alice"
[[server.api_keys]]
key = "bob-key-0123456789ab"
tenant = "bob"
[[server.api_keys]]
key = "admin-key-0123456789"
tenant = "ops"
admin = true
"#;

/// The `authorization` header of `key`.
pub fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

/// Short heartbeats and ack waits, so that node loss is seen in seconds.
pub const FAST: &str = "heartbeat_ms = 200\nack_wait_ms = 1500\n";

/// The header a forwarding node sets: a request carrying it is answered by the
/// node it reaches (the tests use it to open a sandbox on a chosen node, and to
/// ask one node about its own sandboxes).
pub const HERE: (&str, &str) = ("x-paddock-forwarded", "test");

/// Waits until `node` lists `n` nodes up.
pub fn wait_up(http: &Http, node: &impl FleetNode, n: usize, auth: &str) {
    eventually(
        &format!("{n} nodes up, seen from {}", node.id()),
        Duration::from_secs(30),
        || {
            let (status, body) = http.get(
                &format!("{}/v1/fleet", node.url()),
                &[("authorization", auth)],
            );
            status == 200
                && body["nodes"]
                    .as_array()
                    .is_some_and(|v| v.iter().filter(|n| n["health"] == "up").count() == n)
        },
    );
}

/// A Python program.
pub fn python(code: &str) -> Value {
    json!({"language": "python", "code": code})
}

/// The command line of process `pid`, its arguments joined by spaces.
fn command_line(pid: u32) -> Option<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
}

/// Which of `nodes` run a program whose command line contains `needle`.
pub fn runs_on<N: FleetNode>(nodes: &[&N], needle: &str) -> Vec<String> {
    nodes
        .iter()
        .filter(|n| {
            n.programs()
                .into_iter()
                .any(|p| command_line(p).is_some_and(|c| c.contains(needle)))
        })
        .map(|n| n.id().to_string())
        .collect()
}

/// How many programs whose command line is `needle` run on `nodes`.
pub fn count_running<N: FleetNode>(nodes: &[&N], needle: &str) -> usize {
    nodes
        .iter()
        .flat_map(|n| n.programs())
        .filter(|p| command_line(*p).is_some_and(|c| c.trim_end() == needle))
        .count()
}

/// Opens a sandbox of `key`'s tenant on `node` itself.
pub fn open_on(http: &Http, node: &impl FleetNode, key: &str) -> String {
    open_with(http, node, &bearer(key))
}

/// [`open_on`], with the `authorization` header `auth` (empty: none).
pub fn open_with(http: &Http, node: &impl FleetNode, auth: &str) -> String {
    let (s, r) = http.post(
        &format!("{}/v1/sandboxes", node.url()),
        &json!({"engine": "subprocess"}),
        &[("authorization", auth), HERE],
    );
    assert_eq!(s, 201, "{r}");
    r["id"].as_str().expect("a sandbox id").to_string()
}

/// Calls on sandbox `id`, whose node is gone, through each of `nodes` until they
/// answer `NODE_LOST`: every answer on the way is a typed error (`FLEET_UNAVAILABLE`
/// while the node is only late), given at once.
pub fn answer_lost<N: FleetNode>(http: &Http, nodes: &[&N], id: &str, auth: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut lost = 0;
    while lost < nodes.len() {
        lost = 0;
        for node in nodes {
            let asked = Instant::now();
            let (s, r) = http.post(
                &format!("{}/v1/sandboxes/{id}/exec", node.url()),
                &json!({"program": {"command": ["true"]}}),
                &[("authorization", auth)],
            );
            let took = asked.elapsed();
            let code = r["error"]["code"].as_str().unwrap_or("");
            assert!(
                matches!((s, code), (502, "NODE_LOST") | (503, "FLEET_UNAVAILABLE")),
                "sandbox {id} through {}: {s} {r}",
                node.id()
            );
            assert!(took < Duration::from_secs(15), "answered after {took:?}");
            if code == "NODE_LOST" {
                lost += 1;
            }
        }
        assert!(
            Instant::now() < deadline,
            "sandbox {id}: no NODE_LOST from every node within 30 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A WebSocket to a node (a terminal's or a process's attach, a TCP stream).
pub type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens the WebSocket at `path` of `url` as `key`'s tenant.
pub async fn connect(url: &str, path: &str, key: &str) -> Socket {
    let ws = url.replacen("http://", "ws://", 1);
    let mut req = format!("{ws}{path}").into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", bearer(key).parse().unwrap());
    let (socket, response) = tokio_tungstenite::connect_async(req)
        .await
        .unwrap_or_else(|e| panic!("upgrade of {path}: {e}"));
    assert_eq!(response.status().as_u16(), 101);
    socket
}

/// Reads binary messages until `done` holds for what came (attach messages carry a
/// stream tag first; `tagged` strips it), or the socket closes.
pub async fn read_until(socket: &mut Socket, tagged: bool, done: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut got = Vec::new();
    while !done(&String::from_utf8_lossy(&got)) {
        let next = tokio::time::timeout_at(deadline, socket.next())
            .await
            .unwrap_or_else(|_| panic!("waited 20 s; got {:?}", String::from_utf8_lossy(&got)));
        match next {
            Some(Ok(Message::Binary(b))) if tagged => got.extend_from_slice(&b[1..]),
            Some(Ok(Message::Binary(b))) => got.extend_from_slice(&b),
            Some(Ok(Message::Close(_))) | None => break,
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("socket error: {e}"),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// Every descendant of `pid` (by `/proc/*/stat` parent links).
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut parents = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
                continue;
            };
            // The parent is the second field after the `(comm)`.
            let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
                continue;
            };
            let ppid = rest
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse::<u32>().ok());
            if let Some(pp) = ppid {
                parents.push((p, pp));
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for (c, pp) in &parents {
            if *pp == p {
                out.push(*c);
                frontier.push(*c);
            }
        }
    }
    out
}

/// A small HTTP client over ureq: JSON in, status and JSON out.
#[derive(Debug)]
pub struct Http {
    agent: ureq::Agent,
}

impl Default for Http {
    fn default() -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .new_agent();
        Http { agent }
    }
}

/// An HTTP answer: the status and the body as JSON (`Null` if it is not JSON).
pub type Answer = (u16, Value);

impl Http {
    /// Any request with an optional JSON body: the status and the answer as JSON, or
    /// the transport's error.
    pub fn send(
        &self,
        method: &str,
        url: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Result<Answer, ureq::Error> {
        let mut req = ureq::http::Request::builder().method(method).uri(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let req = req.body(body).expect("a request");
        let mut resp = self.agent.run(req)?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    /// Any request with a raw body; the status and the raw answer.
    pub fn raw(
        &self,
        method: &str,
        url: &str,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> (u16, Vec<u8>) {
        let mut req = ureq::http::Request::builder().method(method).uri(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(body).expect("a request");
        let mut resp = self
            .agent
            .run(req)
            .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        let status = resp.status().as_u16();
        let bytes = resp
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_vec()
            .unwrap_or_default();
        (status, bytes)
    }

    /// `POST` with a JSON body; panics on a transport error.
    pub fn post(&self, url: &str, body: &Value, headers: &[(&str, &str)]) -> Answer {
        self.send("POST", url, Some(body), headers)
            .unwrap_or_else(|e| panic!("POST {url}: {e}"))
    }

    /// `GET`; panics on a transport error.
    pub fn get(&self, url: &str, headers: &[(&str, &str)]) -> Answer {
        self.send("GET", url, None, headers)
            .unwrap_or_else(|e| panic!("GET {url}: {e}"))
    }

    /// `DELETE`; panics on a transport error.
    pub fn delete(&self, url: &str, headers: &[(&str, &str)]) -> Answer {
        self.send("DELETE", url, None, headers)
            .unwrap_or_else(|e| panic!("DELETE {url}: {e}"))
    }

    /// A streamed execution (`?stream=true`): each NDJSON line as it arrives, with
    /// the time since the request was sent.
    pub fn stream(
        &self,
        url: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> Vec<(Duration, Value)> {
        self.stream_with(url, body, headers, |_| {})
    }

    /// [`stream`](Self::stream), handing each line to `seen` as it arrives.
    pub fn stream_with(
        &self,
        url: &str,
        body: &Value,
        headers: &[(&str, &str)],
        mut seen: impl FnMut(&Value),
    ) -> Vec<(Duration, Value)> {
        use std::io::Read;
        let mut req = ureq::http::Request::builder().method("POST").uri(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(body.to_string()).expect("a request");
        let started = Instant::now();
        let mut resp = self.agent.run(req).expect("a streamed answer");
        assert_eq!(resp.status().as_u16(), 200);
        let mut reader = BufReader::new(resp.body_mut().as_reader());
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if let Ok(v) = serde_json::from_str::<Value>(&line) {
                        seen(&v);
                        lines.push((started.elapsed(), v));
                    }
                }
            }
        }
        let _ = reader.read_to_end(&mut Vec::new());
        lines
    }
}

/// Waits until `check` holds, polling; panics with `what` after `limit`.
pub fn eventually(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for: {what}");
}

/// A look at the fleet's state on NATS, for assertions: the audit stream, the
/// execution records, the streams' leaders.
#[derive(Debug)]
pub struct Look {
    rt: tokio::runtime::Runtime,
    js: async_nats::jetstream::Context,
    prefix: String,
}

impl Look {
    /// Connects to the servers `urls`, for the fleet whose names start with `prefix`.
    pub fn new(urls: &[String], prefix: &str) -> Look {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let js = rt.block_on(async {
            let client = async_nats::connect(urls).await.expect("connecting to NATS");
            async_nats::jetstream::new(client)
        });
        Look {
            rt,
            js,
            prefix: prefix.to_string(),
        }
    }

    /// Every audit entry's id, with how many entries it has. Retried for a while:
    /// right after a server was killed and restarted, the JetStream API of the
    /// server this client talks to may not answer yet.
    pub fn audit_counts(&self) -> std::collections::HashMap<String, usize> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.try_audit_counts() {
                Ok(counts) => return counts,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("reading the audit stream: {e}; again");
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => panic!("reading the audit stream: {e}"),
            }
        }
    }

    fn try_audit_counts(&self) -> Result<std::collections::HashMap<String, usize>, String> {
        self.rt.block_on(async {
            let stream = self
                .js
                .get_stream(format!("{}_AUDIT", self.prefix))
                .await
                .map_err(|e| e.to_string())?;
            let expected = stream.cached_info().state.messages;
            let consumer = stream
                .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
                .await
                .map_err(|e| e.to_string())?;
            let mut messages = consumer.messages().await.map_err(|e| e.to_string())?;
            let mut counts = std::collections::HashMap::new();
            loop {
                let next = tokio::time::timeout(Duration::from_secs(2), messages.next()).await;
                let Ok(Some(Ok(m))) = next else { break };
                let v: Value = serde_json::from_slice(&m.payload).expect("an audit entry");
                *counts
                    .entry(v["id"].as_str().unwrap_or("").to_string())
                    .or_insert(0) += 1;
                if m.info().map(|i| i.pending).unwrap_or(0) == 0 {
                    break;
                }
            }
            let read: usize = counts.values().sum();
            if (read as u64) < expected {
                return Err(format!("read {read} of {expected} entries"));
            }
            Ok(counts)
        })
    }

    /// The record of execution `id` (retried for a while, as the audit is).
    pub fn record(&self, id: &str) -> Option<Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got: Result<Option<Value>, String> = self.rt.block_on(async {
                let kv = self
                    .js
                    .get_key_value(format!("{}_exec", self.prefix))
                    .await
                    .map_err(|e| e.to_string())?;
                let value = kv.get(id).await.map_err(|e| e.to_string())?;
                Ok(value.and_then(|b| serde_json::from_slice(&b).ok()))
            });
            match got {
                Ok(v) => return v,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("reading record {id}: {e}; again");
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => panic!("reading record {id}: {e}"),
            }
        }
    }

    /// Every key of bucket `P_<bucket>` with its value as JSON.
    pub fn values(&self, bucket: &str) -> std::collections::BTreeMap<String, Value> {
        self.rt.block_on(async {
            let kv = self
                .js
                .get_key_value(format!("{}_{bucket}", self.prefix))
                .await
                .expect("the bucket");
            let mut keys = kv.keys().await.expect("its keys");
            let mut out = std::collections::BTreeMap::new();
            while let Some(Ok(k)) = keys.next().await {
                if let Ok(Some(v)) = kv.get(&k).await {
                    out.insert(k, serde_json::from_slice(&v).unwrap_or(Value::Null));
                }
            }
            out
        })
    }

    /// Messages waiting in stream `name`.
    pub fn queued(&self, name: &str) -> Option<u64> {
        self.rt.block_on(async {
            let mut s = self.js.get_stream(name).await.ok()?;
            Some(s.info().await.ok()?.state.messages)
        })
    }

    /// The server leading stream `name`.
    pub fn leader(&self, name: &str) -> Option<String> {
        self.rt.block_on(async {
            let mut s = self.js.get_stream(name).await.ok()?;
            let info = s.info().await.ok()?;
            info.cluster.as_ref().and_then(|c| c.leader.clone())
        })
    }
}
