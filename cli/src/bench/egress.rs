//! `paddock bench egress`: a sandbox's connections through its egress gateway (an
//! `allowlist` network, through the proxy's `CONNECT`) vs. the same connections made
//! directly from a sandbox with network `unrestricted`, in one run, to one server of
//! this process's own. No gateway dials the host's own addresses, so the server
//! listens in a network namespace the bench makes ([`super::netns`]), on a private
//! address the allowlist names (the bench's engine allows private ranges).
//!
//! - `egress_connect`: connection setup, measured inside the sandbox from the
//!   socket's creation to the first byte of the server's answer to a small request
//!   (through the proxy: connect to it, `CONNECT`, its `200`, then the request).
//! - `egress_throughput`: one download of `--mib` MiB (256 by default), read to its
//!   end inside the sandbox, through the tunnel vs. direct; the median of three.
//! - `egress_denied_connect`: in an allowlist sandbox, `connect` to an address its
//!   resolver never handed out (the bench's own namespace's), timed until it fails: the
//!   sandbox's firewall refuses it (`ECONNREFUSED`), and nothing leaves the
//!   sandbox's namespace.
//!
//! A scenario the host cannot run (no `nft`, not root, no `ip`) prints a line with
//! `skipped` and why.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use paddock_core::{
    CancelToken, DiscardSink, Engine, ExecRequest, NetworkPolicy, Program, Sandbox, SandboxSpec,
};
use paddock_engines::subprocess::SubprocessEngine;
use paddock_engines::SubprocessConfig;
use serde_json::json;

use super::netns::{self, Netns};
use crate::run::UsageError;

/// The measuring program, run inside each sandbox: `MODE HOST PORT SAMPLES BYTES`.
const PROBE: &str = r#"
import json, socket, sys, time
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
samples, size = int(sys.argv[4]), int(sys.argv[5])

def open_conn():
    if mode == "direct":
        return socket.create_connection((host, port))
    s = socket.create_connection(("127.0.0.1", 3128))
    target = ("%s:%d" % (host, port)).encode()
    s.sendall(b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target))
    head = b""
    while b"\r\n\r\n" not in head:
        b = s.recv(4096)
        if not b:
            raise SystemExit("the proxy closed the tunnel")
        head += b
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit("the proxy refused: " + head.decode(errors="replace"))
    return s

setup = []
for _ in range(samples):
    t = time.perf_counter_ns()
    s = open_conn()
    s.sendall(b"GET /bytes/1 HTTP/1.1\r\nHost: bench\r\n\r\n")
    if not s.recv(1):
        raise SystemExit("no answer")
    setup.append((time.perf_counter_ns() - t) / 1000)
    s.close()

rates = []
buf = bytearray(1 << 20)
view = memoryview(buf)
for _ in range(3):
    s = open_conn()
    t = time.perf_counter_ns()
    s.sendall(b"GET /bytes/%d HTTP/1.1\r\nHost: bench\r\n\r\n" % size)
    got = 0
    while True:
        n = s.recv_into(view)
        if n == 0:
            break
        got += n
    took = (time.perf_counter_ns() - t) / 1e9
    s.close()
    if got < size:
        raise SystemExit("short download: %d of %d bytes" % (got, size))
    rates.append(size / (1 << 20) / took)
print(json.dumps({"setup_us": setup, "mib_s": rates}))
"#;

/// The denied-connect probe, run inside an allowlist sandbox: `HOST PORT SAMPLES`.
const DENIED_PROBE: &str = r#"
import json, socket, sys, time
host, port, samples = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
took, refused = [], 0
for _ in range(samples):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    t = time.perf_counter_ns()
    try:
        s.connect((host, port))
    except ConnectionRefusedError:
        refused += 1
    except OSError:
        pass
    took.append((time.perf_counter_ns() - t) / 1000)
    s.close()
print(json.dumps({"setup_us": took, "refused": refused}))
"#;

/// `samples` connects from an allowlist sandbox to an address it was never given
/// (`net`'s, on this machine):
/// how long each took to fail, and how many were refused.
async fn denied(
    engine: &SubprocessEngine,
    net: &Netns,
    samples: usize,
) -> Result<(Vec<f64>, u64), String> {
    let sb: Arc<dyn Sandbox> = engine
        .create(&SandboxSpec {
            network: NetworkPolicy::Allowlist {
                hosts: vec!["bench.invalid".into()],
                ports: vec![],
            },
            ..SandboxSpec::default()
        })
        .await
        .map_err(|e| format!("opening the denied sandbox: {e}"))?;
    let mut req = ExecRequest::new(Program::Command {
        argv: vec![
            "python3".into(),
            "-c".into(),
            DENIED_PROBE.into(),
            // The bench's own namespace, which the allowlist does not name: the
            // traffic would stay on this machine even if it got out.
            net.addr().to_string(),
            "9".into(),
            samples.to_string(),
        ],
    });
    req.limits.timeout_ms = Some(120_000);
    let r = sb.exec(req, &DiscardSink, CancelToken::new()).await;
    let _ = sb.destroy().await;
    let r = r.map_err(|e| format!("denied: {e}"))?;
    if r.exit_code() != Some(0) {
        return Err(format!(
            "denied: the probe failed: {} {}",
            r.stdout, r.stderr
        ));
    }
    let v: serde_json::Value =
        serde_json::from_str(r.stdout.trim()).map_err(|e| format!("denied: {e}: {}", r.stdout))?;
    let took = v["setup_us"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
        .unwrap_or_default();
    Ok((took, v["refused"].as_u64().unwrap_or(0)))
}

/// Serves `GET /bytes/N` (N bytes after a small head), a thread per connection, on
/// a port of the bench's namespace's address, until dropped.
struct Server {
    listener: Arc<TcpListener>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    addr: Ipv4Addr,
    port: u16,
}

impl Server {
    fn start(net: &Netns) -> std::io::Result<Server> {
        let addr = net.addr();
        let listener = Arc::new(net.run_in(move || TcpListener::bind((addr, 0)))??);
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let (l, halt) = (listener.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("bench-egress-server".into())
            .spawn(move || loop {
                match l.accept() {
                    Ok((conn, _)) => {
                        std::thread::spawn(move || answer(conn));
                    }
                    Err(_) if halt.load(Ordering::Acquire) => return,
                    Err(_) => {}
                }
            })?;
        Ok(Server {
            listener,
            stop,
            thread: Some(thread),
            addr,
            port,
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Shutting a listening socket down wakes the `accept` blocked on it, with an
        // error.
        let _ = rustix::net::shutdown(&self.listener, rustix::net::Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn answer(mut conn: TcpStream) {
    let _ = conn.set_nodelay(true);
    let mut head = Vec::new();
    let mut byte = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut byte) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&byte[..n]),
        }
        if head.len() > 16 * 1024 {
            return;
        }
    }
    let text = String::from_utf8_lossy(&head);
    let size: u64 = text
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.strip_prefix("/bytes/"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let _ = write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n"
    );
    let chunk = vec![b'x'; 256 * 1024];
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        if conn.write_all(&chunk[..n]).is_err() {
            return;
        }
        left -= n as u64;
    }
}

struct Measured {
    setup_us: Vec<f64>,
    mib_s: Vec<f64>,
}

async fn measure(
    sb: &Arc<dyn Sandbox>,
    mode: &str,
    (host, port): (Ipv4Addr, u16),
    samples: usize,
    bytes: u64,
) -> Result<Measured, String> {
    let mut req = ExecRequest::new(Program::Command {
        argv: vec![
            "python3".into(),
            "-c".into(),
            PROBE.into(),
            mode.into(),
            host.to_string(),
            port.to_string(),
            samples.to_string(),
            bytes.to_string(),
        ],
    });
    req.limits.timeout_ms = Some(120_000);
    let r = sb
        .exec(req, &DiscardSink, CancelToken::new())
        .await
        .map_err(|e| format!("{mode}: {e}"))?;
    if r.exit_code() != Some(0) {
        return Err(format!(
            "{mode}: the probe failed: {} {}",
            r.stdout, r.stderr
        ));
    }
    let v: serde_json::Value =
        serde_json::from_str(r.stdout.trim()).map_err(|e| format!("{mode}: {e}: {}", r.stdout))?;
    let nums = |k: &str| -> Vec<f64> {
        v[k].as_array()
            .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
            .unwrap_or_default()
    };
    Ok(Measured {
        setup_us: nums("setup_us"),
        mib_s: nums("mib_s"),
    })
}

fn percentile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    if values.is_empty() {
        return 0.0;
    }
    values[((values.len() as f64 - 1.0) * q).round() as usize]
}

/// Runs the scenario; the exit code is 1 when it failed, 130 when interrupted.
pub(crate) async fn egress(samples: usize, mib: u64, json: bool) -> Result<i32, UsageError> {
    let fail = |why: String| {
        eprintln!("paddock bench egress: {why}");
        Ok(1)
    };
    let skip = |scenarios: &[&str], why: &str| {
        eprintln!("paddock bench egress: skipped: {why}");
        for scenario in scenarios {
            super::report(&json!({"scenario": scenario, "skipped": why}), json);
        }
        Ok(0)
    };
    let mut config = SubprocessConfig::default();
    // The server's address is a private one.
    config.egress.allow_private = Some(true);
    let engine = match SubprocessEngine::new(&config) {
        Ok(e) => e,
        Err(e) => return fail(format!("the subprocess engine did not start: {e}")),
    };
    if let Err(why) = &engine.host_support().egress {
        return skip(
            &[
                "egress_denied_connect",
                "egress_connect",
                "egress_throughput",
            ],
            &format!("allowlists cannot be enforced here: {why}"),
        );
    }
    if let Some(why) = netns::unavailable() {
        return skip(
            &[
                "egress_denied_connect",
                "egress_connect",
                "egress_throughput",
            ],
            &format!("the server's network namespace cannot be made: {why}"),
        );
    }
    let net = match Netns::create() {
        Ok(n) => n,
        Err(e) => return fail(format!("the bench's network namespace: {e}")),
    };
    let (mut took, refused) = match denied(&engine, &net, samples).await {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let n = took.len();
    super::report(
        &json!({
            "scenario": "egress_denied_connect",
            "samples": n,
            "refused": refused,
            "p50_us": super::round(percentile(&mut took, 0.5)),
            "p99_us": super::round(percentile(&mut took, 0.99)),
            "goal_p50_us": 10_000,
        }),
        json,
    );
    if refused != n as u64 {
        return fail(format!(
            "{} of {n} connects to an address the allowlist does not admit were not refused at connect",
            n as u64 - refused
        ));
    }
    let server = match Server::start(&net) {
        Ok(s) => s,
        Err(e) => return fail(format!("the bench's server did not start: {e}")),
    };
    // Interrupted, the sandboxes, the server and the namespace are still removed.
    let outcome = tokio::select! {
        r = connect_and_throughput(&engine, (server.addr, server.port), samples, mib, json) => {
            r.map_or_else(fail, |()| Ok(0))
        }
        _ = tokio::signal::ctrl_c() => {
            eprintln!("paddock bench egress: interrupted");
            Ok(130)
        }
    };
    drop(server);
    drop(net);
    outcome
}

/// `egress_connect` and `egress_throughput`, against the server at `target`.
async fn connect_and_throughput(
    engine: &SubprocessEngine,
    target: (Ipv4Addr, u16),
    samples: usize,
    mib: u64,
    json: bool,
) -> Result<(), String> {
    let direct: Arc<dyn Sandbox> = engine
        .create(&SandboxSpec {
            network: NetworkPolicy::Unrestricted,
            ..SandboxSpec::default()
        })
        .await
        .map_err(|e| format!("opening the direct sandbox: {e}"))?;
    let proxied: Arc<dyn Sandbox> = match engine
        .create(&SandboxSpec {
            network: NetworkPolicy::Allowlist {
                hosts: vec![target.0.to_string()],
                ports: vec![target.1],
            },
            ..SandboxSpec::default()
        })
        .await
    {
        Ok(s) => s,
        Err(e) => {
            let _ = direct.destroy().await;
            return Err(format!("opening the allowlist sandbox: {e}"));
        }
    };
    let measured = both(&direct, &proxied, target, samples, mib << 20).await;
    let _ = direct.destroy().await;
    let _ = proxied.destroy().await;
    let (mut d, mut p) = measured?;
    let (d50, d99) = (
        percentile(&mut d.setup_us, 0.5),
        percentile(&mut d.setup_us, 0.99),
    );
    let (p50, p99) = (
        percentile(&mut p.setup_us, 0.5),
        percentile(&mut p.setup_us, 0.99),
    );
    super::report(
        &json!({
            "scenario": "egress_connect",
            "samples": d.setup_us.len(),
            "direct_p50_us": super::round(d50),
            "direct_p99_us": super::round(d99),
            "proxy_p50_us": super::round(p50),
            "proxy_p99_us": super::round(p99),
            "added_p50_us": super::round(p50 - d50),
            "goal_added_p50_us": 1000,
        }),
        json,
    );
    let (dm, pm) = (percentile(&mut d.mib_s, 0.5), percentile(&mut p.mib_s, 0.5));
    super::report(
        &json!({
            "scenario": "egress_throughput",
            "mib": mib,
            "runs": d.mib_s.len(),
            "direct_mib_s": super::round(dm),
            "proxy_mib_s": super::round(pm),
            "ratio": super::round3(if dm > 0.0 { pm / dm } else { 0.0 }),
            "goal_ratio": 0.5,
        }),
        json,
    );
    Ok(())
}

/// Both paths, interleaved, twice each, so that drift on a shared machine falls on
/// both: (direct, through the gateway).
async fn both(
    direct: &Arc<dyn Sandbox>,
    proxied: &Arc<dyn Sandbox>,
    target: (Ipv4Addr, u16),
    samples: usize,
    bytes: u64,
) -> Result<(Measured, Measured), String> {
    let empty = || Measured {
        setup_us: Vec::new(),
        mib_s: Vec::new(),
    };
    let (mut d, mut p) = (empty(), empty());
    for _ in 0..2 {
        for (mode, sb, into) in [("direct", direct, &mut d), ("proxy", proxied, &mut p)] {
            let m = measure(sb, mode, target, samples.div_ceil(2), bytes).await?;
            into.setup_us.extend(m.setup_us);
            into.mib_s.extend(m.mib_s);
        }
    }
    Ok((d, p))
}
