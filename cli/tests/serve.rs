//! `paddock serve` as a process: the URL on the first stdout line, executions over
//! HTTP, and a graceful drain on SIGTERM and SIGINT.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// A `paddock serve` child process on a free loopback port.
struct Serve {
    child: Child,
    addr: SocketAddr,
    stderr: Option<JoinHandle<String>>,
    _dir: tempfile::TempDir,
}

impl Serve {
    fn start(config: &str) -> Serve {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("paddock.toml");
        std::fs::write(&file, config).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_paddock"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&file)
            .env_remove("PADDOCK_LISTEN")
            .env_remove("PADDOCK_API_KEYS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("paddock serve starts");
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = tx.send(lines.next());
            // Keep the pipe drained.
            for _ in lines {}
        });
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = BufReader::new(stderr).read_to_string(&mut text);
            text
        });
        let first = rx.recv_timeout(Duration::from_secs(30));
        let line = match first {
            Ok(Some(Ok(line))) => line,
            other => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "no URL on stdout ({other:?}); stderr: {}",
                    stderr.join().unwrap()
                );
            }
        };
        let rest = line
            .strip_prefix("http://127.0.0.1:")
            .unwrap_or_else(|| panic!("the first line is the loopback URL: {line:?}"));
        let port: u16 = rest.parse().unwrap_or_else(|_| panic!("a port: {line:?}"));
        assert_ne!(port, 0);
        Serve {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            stderr: Some(stderr),
            _dir: dir,
        }
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success());
    }

    /// Waits for the process to exit; returns its status and stderr.
    fn wait(&mut self, within: Duration) -> (ExitStatus, String) {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let stderr = self.stderr.take().unwrap().join().unwrap();
                return (status, stderr);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let stderr = self.stderr.take().unwrap().join().unwrap();
                panic!("paddock serve did not exit within {within:?}; stderr: {stderr}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// An HTTP answer.
#[derive(Debug)]
struct Response {
    status: u16,
    body: Vec<u8>,
}

impl Response {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{}: not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

/// One request on its own connection (`Connection: close`); `Err` when the
/// connection is refused or cut.
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(40)))?;
    let body = body
        .map(|b| serde_json::to_vec(b).unwrap())
        .unwrap_or_default();
    let mut data = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    data.extend_from_slice(&body);
    stream.write_all(&data)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of head"))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line in {head:?}")))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let rest = &raw[split + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)?
    } else {
        let len = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(rest.len());
        if rest.len() < len {
            return Err(std::io::Error::other("body cut short"));
        }
        rest[..len].to_vec()
    };
    Ok(Response { status, body })
}

fn dechunk(mut data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let end = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| std::io::Error::other("chunk size line cut short"))?;
        let size_line = String::from_utf8_lossy(&data[..end]).into_owned();
        let size = usize::from_str_radix(size_line.split(';').next().unwrap().trim(), 16)
            .map_err(|_| std::io::Error::other(format!("bad chunk size {size_line:?}")))?;
        data = &data[end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if data.len() < size + 2 {
            return Err(std::io::Error::other("chunk cut short"));
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

fn sh(script: &str) -> Value {
    json!({"program": {"command": ["sh", "-c", script]}})
}

fn in_flight(addr: SocketAddr) -> u64 {
    let r = request(addr, "GET", "/v1/stats", None).expect("stats");
    assert_eq!(r.status, 200);
    r.json()["scheduler"]["in_flight"].as_u64().unwrap()
}

#[test]
fn serve_runs_executions_and_drains_on_sigterm() {
    let audit_dir = tempfile::tempdir().unwrap();
    let audit_file = audit_dir.path().join("audit.ndjson");
    let mut serve = Serve::start(&format!(
        "[server]\ndrain_ms = 500\n\n[audit]\nfile = {:?}\n",
        audit_file.to_str().unwrap()
    ));
    let addr = serve.addr;

    let health = request(addr, "GET", "/healthz", None).unwrap();
    assert_eq!(health.status, 200);
    let r = request(addr, "POST", "/v1/executions", Some(&sh("echo hi"))).unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["outcome"], "completed", "{v}");
    assert_eq!(v["stdout"], "hi\n");
    let first_id = v["id"].as_str().unwrap().to_string();

    // A long execution is running when SIGTERM arrives.
    let long = std::thread::spawn(move || {
        let started = Instant::now();
        let r = request(addr, "POST", "/v1/executions", Some(&sh("sleep 30")));
        (r, started.elapsed())
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while in_flight(addr) != 1 {
        assert!(
            Instant::now() < deadline,
            "the long execution never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let signalled = Instant::now();
    serve.signal("TERM");

    // While it drains: not ready, and nothing new is admitted (503), or the
    // listener is already closed.
    let mut saw_draining = false;
    while signalled.elapsed() < Duration::from_secs(5) {
        match request(addr, "GET", "/readyz", None) {
            Ok(r) if r.status == 200 => std::thread::sleep(Duration::from_millis(5)),
            Ok(r) => {
                assert_eq!(r.status, 503);
                assert_eq!(r.json()["status"], "draining");
                saw_draining = true;
                // (A refused connection means the listener closed meanwhile: not
                // admitted either.)
                if let Ok(r) = request(addr, "POST", "/v1/executions", Some(&sh("echo late"))) {
                    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
                    assert!(r.json()["error"]["code"].is_string());
                }
                break;
            }
            Err(_) => break,
        }
    }

    assert!(saw_draining, "/readyz answered 503 while draining");

    let (status, stderr) = serve.wait(Duration::from_secs(8));
    assert!(status.success(), "exit {status:?}; stderr: {stderr}");
    assert!(
        signalled.elapsed() < Duration::from_secs(8),
        "exited {:?} after SIGTERM",
        signalled.elapsed()
    );
    assert!(stderr.contains("draining (up to 500 ms)"), "{stderr}");
    // The long execution was accepted, so it was answered: cancelled at the end
    // of the drain, well before its 30 s.
    let (answer, took) = long.join().unwrap();
    let answer = answer.expect("the long request is answered before the exit");
    let v = answer.json();
    match answer.status {
        200 => assert_eq!(v["outcome"], "cancelled", "{v}"),
        503 => assert!(v["error"]["code"].is_string(), "{v}"),
        s => panic!("long request answered {s}: {v}"),
    }
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(
        stderr.contains("0 drained, 1 cancelled"),
        "the shutdown report counts it: {stderr}"
    );
    // Nothing accepted is lost: the flushed audit log holds exactly one entry per
    // accepted execution — the completed one and the one cancelled by the drain.
    let text = std::fs::read_to_string(&audit_file).expect("the audit log was flushed");
    let entries: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("an NDJSON line"))
        .collect();
    assert_eq!(entries.len(), 2, "{text}");
    assert_eq!(
        entries
            .iter()
            .filter(|e| e["id"] == first_id.as_str())
            .count(),
        1
    );
    assert_eq!(
        entries
            .iter()
            .filter(|e| e["outcome"] == "cancelled")
            .count(),
        1,
        "{text}"
    );
}

#[test]
fn serve_exits_0_on_sigint_when_idle() {
    let mut serve = Serve::start("");
    let r = request(serve.addr, "GET", "/readyz", None).unwrap();
    assert_eq!(r.status, 200);
    let signalled = Instant::now();
    serve.signal("INT");
    let (status, stderr) = serve.wait(Duration::from_secs(8));
    assert!(status.success(), "exit {status:?}; stderr: {stderr}");
    assert!(
        signalled.elapsed() < Duration::from_secs(5),
        "{:?}",
        signalled.elapsed()
    );
    assert!(stderr.contains("0 drained, 0 cancelled"), "{stderr}");
}

#[test]
fn serve_refuses_a_bad_config_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, "[server]\nworkers = 0\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&file)
        .env_remove("PADDOCK_LISTEN")
        .env_remove("PADDOCK_API_KEYS")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "no URL is printed");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("server.workers"), "{err}");
}

#[test]
fn run_detach_starts_a_background_process_on_the_server() {
    let serve = Serve::start("");
    let url = format!("http://{}", serve.addr);
    let out = Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args(["run", "--detach", "--json", "--server", &url, "--"])
        .args(["sh", "-c", "echo started; sleep 30"])
        .env_remove("PADDOCK_API_KEY")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let record: Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    let execution_id = record["execution_id"].as_str().expect("an execution id");
    let sandbox = record["sandbox"].as_str().expect("a sandbox");
    let process = record["process"].as_str().expect("a process");
    // The command returned; the process runs on in the server.
    let base = format!("/v1/sandboxes/{sandbox}/processes/{process}");
    let info = request(serve.addr, "GET", &base, None).unwrap().json();
    assert_eq!(info["execution_id"], execution_id, "{info}");
    assert!(info["exit"].is_null(), "still running: {info}");

    // Without --json: the execution id alone on stdout, into the same sandbox.
    let out = Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args([
            "run",
            "--detach",
            "--server",
            &url,
            "--sandbox",
            sandbox,
            "--",
            "true",
        ])
        .env_remove("PADDOCK_API_KEY")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(id.len(), 36, "a UUID: {id:?}");
    let list = request(
        serve.addr,
        "GET",
        &format!("/v1/sandboxes/{sandbox}/processes"),
        None,
    )
    .unwrap()
    .json();
    let ids: Vec<&str> = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["execution_id"].as_str())
        .collect();
    assert!(
        ids.contains(&id.as_str()) && ids.contains(&execution_id),
        "{list}"
    );

    // Destroying the sandbox ends it.
    let r = request(
        serve.addr,
        "DELETE",
        &format!("/v1/sandboxes/{sandbox}"),
        None,
    )
    .unwrap();
    assert_eq!(r.status, 204);
    let r = request(serve.addr, "GET", &base, None).unwrap();
    assert_eq!(r.status, 409, "{}", String::from_utf8_lossy(&r.body));

    // A server that is not there, and an unknown sandbox, are answered.
    let out = Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args([
            "run",
            "--detach",
            "--server",
            &url,
            "--sandbox",
            "nope",
            "--",
            "true",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("NOT_FOUND"),
        "{out:?}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args(["run", "--detach", "--", "true"])
        .env_remove("PADDOCK_SERVER")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--server"),
        "{out:?}"
    );
}
