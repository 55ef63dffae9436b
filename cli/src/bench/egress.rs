//! `paddock bench egress`: a sandbox's connections through its egress gateway (an
//! `allowlist` network, through the proxy's `CONNECT`) vs. the same connections made
//! directly from a sandbox with network `unrestricted`, in one run, to one server in
//! this process on the loopback.
//!
//! - `egress_connect`: connection setup, measured inside the sandbox from the
//!   socket's creation to the first byte of the server's answer to a small request
//!   (through the proxy: connect to it, `CONNECT`, its `200`, then the request).
//! - `egress_throughput`: one download of `--mib` MiB (256 by default), read to its
//!   end inside the sandbox, through the tunnel vs. direct; the median of three.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;

use paddock_core::{
    CancelToken, DiscardSink, Engine, ExecRequest, NetworkPolicy, Program, Sandbox, SandboxSpec,
    SubprocessConfig,
};
use paddock_engines::subprocess::SubprocessEngine;
use serde_json::json;

use crate::run::UsageError;

/// The measuring program, run inside each sandbox: `MODE PORT SAMPLES BYTES`.
const PROBE: &str = r#"
import json, socket, sys, time
mode, port, samples, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def open_conn():
    if mode == "direct":
        return socket.create_connection(("127.0.0.1", port))
    s = socket.create_connection(("127.0.0.1", 3128))
    s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % (port, port))
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

/// Serves `GET /bytes/N` (N bytes after a small head) on a loopback port, a thread
/// per connection, until the process ends.
fn serve() -> std::io::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::Builder::new()
        .name("bench-egress-server".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                std::thread::spawn(move || answer(conn));
            }
        })?;
    Ok(port)
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
    port: u16,
    samples: usize,
    bytes: u64,
) -> Result<Measured, String> {
    let mut req = ExecRequest::new(Program::Command {
        argv: vec![
            "python3".into(),
            "-c".into(),
            PROBE.into(),
            mode.into(),
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

/// Runs the scenario; the exit code is 1 when it could not run here.
pub(crate) async fn egress(samples: usize, mib: u64, json: bool) -> Result<i32, UsageError> {
    let fail = |why: String| {
        eprintln!("paddock bench egress: {why}");
        Ok(1)
    };
    let engine = match SubprocessEngine::new(&SubprocessConfig::default()) {
        Ok(e) => e,
        Err(e) => return fail(format!("the subprocess engine did not start: {e}")),
    };
    if let Err(why) = &engine.host_support().egress {
        return fail(format!("allowlists cannot be enforced here: {why}"));
    }
    let port = match serve() {
        Ok(p) => p,
        Err(e) => return fail(format!("the bench's server did not start: {e}")),
    };
    let direct: Arc<dyn Sandbox> = match engine
        .create(&SandboxSpec {
            network: NetworkPolicy::Unrestricted,
            ..SandboxSpec::default()
        })
        .await
    {
        Ok(s) => s,
        Err(e) => return fail(format!("opening the direct sandbox: {e}")),
    };
    let proxied: Arc<dyn Sandbox> = match engine
        .create(&SandboxSpec {
            network: NetworkPolicy::Allowlist {
                hosts: vec!["127.0.0.1".into()],
                ports: vec![port],
            },
            ..SandboxSpec::default()
        })
        .await
    {
        Ok(s) => s,
        Err(e) => return fail(format!("opening the allowlist sandbox: {e}")),
    };
    let bytes = mib << 20;
    // Interleaved, twice each, so that drift on a shared machine falls on both.
    let mut d = Measured {
        setup_us: Vec::new(),
        mib_s: Vec::new(),
    };
    let mut p = Measured {
        setup_us: Vec::new(),
        mib_s: Vec::new(),
    };
    for _ in 0..2 {
        for (mode, sb, into) in [("direct", &direct, &mut d), ("proxy", &proxied, &mut p)] {
            match measure(sb, mode, port, samples.div_ceil(2), bytes).await {
                Ok(m) => {
                    into.setup_us.extend(m.setup_us);
                    into.mib_s.extend(m.mib_s);
                }
                Err(e) => return fail(e),
            }
        }
    }
    let _ = direct.destroy().await;
    let _ = proxied.destroy().await;
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
    Ok(0)
}
