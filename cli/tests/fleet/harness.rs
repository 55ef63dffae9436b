//! The fleet under test: NATS servers clustered on loopback ports and `paddock serve`
//! nodes, all started here and all killed (and waited for) when the harness is
//! dropped, so that no process outlives a test, whether it passes or panics.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `nats-server` to run (`paddock_testkit::nats_server`: `PADDOCK_NATS_SERVER`,
/// else the pinned one it installs into the target directory on first use); the test
/// returns when `PADDOCK_SKIP` lists `fleet`, and fails when there is none.
macro_rules! need_nats {
    () => {
        match paddock_testkit::nats_server() {
            Some(p) => p,
            None => return,
        }
    };
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Three (or more) NATS servers clustered on loopback ports.
pub struct Cluster {
    inner: paddock_fleet::local::LocalCluster,
}

impl Cluster {
    pub fn start(binary: &Path, size: usize) -> Cluster {
        Cluster {
            inner: paddock_fleet::local::LocalCluster::start(binary, size).expect("a NATS cluster"),
        }
    }

    /// Three servers with JetStream and `plain` without (`p1`, …).
    pub fn start_with(binary: &Path, size: usize, plain: usize) -> Cluster {
        Cluster {
            inner: paddock_fleet::local::LocalCluster::start_with(binary, size, plain)
                .expect("a NATS cluster"),
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.inner.urls()
    }

    pub fn dir(&self) -> &Path {
        self.inner.dir()
    }

    pub fn server(&mut self, name: &str) -> &mut paddock_fleet::local::LocalServer {
        self.inner
            .server(name)
            .unwrap_or_else(|| panic!("no server {name}"))
    }
}

/// One `paddock serve` node.
pub struct Node {
    pub id: String,
    pub url: String,
    config: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl Node {
    /// Starts node `id` joined through `urls`, with `extra` TOML appended to its
    /// config (the `[fleet]` table is written here; give other tables).
    pub fn start(dir: &Path, id: &str, urls: &[String], fleet: &str, extra: &str) -> Node {
        let config = dir.join(format!("{id}.toml"));
        let urls_toml: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
        // One ready sandbox per pool unless the test sets its own `[pool]`: nodes
        // keeping the default eight would make dozens at start on two cores, which
        // these tests do not use.
        let pool = if extra.contains("[pool]") {
            ""
        } else {
            "[pool]\nmin_idle = 1\n"
        };
        let text = format!(
            "[fleet]\nurls = [{}]\nnode_id = \"{id}\"\n{fleet}\n{extra}\n{pool}",
            urls_toml.join(", ")
        );
        std::fs::write(&config, text).expect("writing a node config");
        let mut node = Node {
            id: id.to_string(),
            url: String::new(),
            config,
            args: Vec::new(),
            log: dir.join(format!("{id}.log")),
            child: None,
        };
        node.spawn();
        node
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("the node's log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_paddock"))
            .arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--config")
            .arg(&self.config)
            .args(&self.args)
            .env("RUST_LOG", "paddock_fleet=info")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("starting paddock serve");
        let stdout = child.stdout.take().expect("its stdout");
        let mut line = String::new();
        let read = BufReader::new(stdout).read_line(&mut line);
        if read.is_err() || !line.starts_with("http://") {
            kill(&mut child);
            panic!(
                "node {} did not start: {line:?}; its log:\n{}",
                self.id,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
        self.url = line.trim().to_string();
        self.child = Some(child);
    }

    /// `kill -9`.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill(&mut c);
        }
    }

    /// Starts it again with the same id and config (a new incarnation).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // A stopped process must run again to die of anything but SIGKILL; SIGKILL
        // works on it as it is.
        self.kill();
        // A failed test shows what each node said last.
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(30)..];
            eprintln!(
                "--- the end of node {}'s log ---\n{}",
                self.id,
                tail.join("\n")
            );
        }
    }
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

    pub fn post(&self, url: &str, body: &Value, headers: &[(&str, &str)]) -> Answer {
        self.send("POST", url, Some(body), headers)
            .unwrap_or_else(|e| panic!("POST {url}: {e}"))
    }

    pub fn get(&self, url: &str, headers: &[(&str, &str)]) -> Answer {
        self.send("GET", url, None, headers)
            .unwrap_or_else(|e| panic!("GET {url}: {e}"))
    }

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
pub struct Look {
    rt: tokio::runtime::Runtime,
    js: async_nats::jetstream::Context,
    prefix: String,
}

impl Look {
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
        use futures_util::StreamExt;
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
        use futures_util::StreamExt;
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
