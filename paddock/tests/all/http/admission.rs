//! What a client must show before the server spends on it, and how long a body may
//! take: idle connections without a credential are capped in total and per client
//! address (the oldest closed first), and a body that stalls is answered 408. Real
//! sockets on loopback; the idle clients connect from 127.0.0.2 and up, so that the
//! authenticated client on 127.0.0.1 is another address.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use paddock::PaddockConfig;
use paddock_pool::http::{ApiKey, ServerConfig};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio_tungstenite::tungstenite::Message;

use crate::http::client::{post_json, Request};
use crate::http::support::{server_config, sh, TestServer};

const KEY: &str = "key-admission-0123456789";

/// Raises this process's open-files soft limit to its hard limit, and returns it:
/// these tests hold thousands of sockets, at both ends.
fn raise_open_files() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let lim = getrlimit(Resource::Nofile);
    // `None` is no limit at all.
    let raised = Rlimit {
        current: lim.maximum,
        maximum: lim.maximum,
    };
    // The soft limit is never above the hard one: below it unless equal.
    let lim = if lim.current != lim.maximum && setrlimit(Resource::Nofile, raised).is_ok() {
        raised
    } else {
        lim
    };
    lim.current.unwrap_or(u64::MAX)
}

/// A server with API keys, a head timeout longer than any test (so that what
/// closes an idle connection is the caps, not the timer), and these caps.
fn server_with_caps(total: u32, per_address: u32, workers: usize) -> TestServer {
    let mut server = server_config();
    server.api_keys = vec![ApiKey::new(KEY, "alpha")];
    server.header_read_timeout_ms = 120_000;
    server.max_unauthenticated_connections = total;
    server.max_unauthenticated_connections_per_address = per_address;
    server.workers = workers;
    let mut config = PaddockConfig::default();
    config.pool.min_idle = 1;
    TestServer::start_config(config, server)
}

/// `n` connections to `server` from `from` that send nothing, in the order they
/// were made (non-blocking sockets).
async fn idle_connections(
    server: SocketAddr,
    from: Ipv4Addr,
    n: usize,
) -> Vec<std::net::TcpStream> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket
            .bind(SocketAddr::new(from.into(), 0))
            .unwrap_or_else(|e| panic!("bind to {from}: {e}"));
        let stream = tokio::time::timeout(Duration::from_secs(20), socket.connect(server))
            .await
            .unwrap_or_else(|_| panic!("connecting from {from} took over 20 s"))
            .unwrap_or_else(|e| panic!("connect from {from}: {e}"));
        out.push(stream.into_std().expect("a std socket"));
    }
    out
}

/// Whether the server has closed `s` (end of stream, or a reset).
fn closed(s: &std::net::TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match s.peek(&mut byte) {
        Ok(n) => n == 0,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// Waits (up to 30 s) until exactly `want` of `sockets` are closed; returns how
/// many are.
async fn settle(sockets: &[&std::net::TcpStream], want: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = sockets.iter().filter(|s| closed(s)).count();
        if n >= want || Instant::now() > deadline {
            // A little longer, to see that no more go.
            tokio::time::sleep(Duration::from_millis(300)).await;
            return sockets.iter().filter(|s| closed(s)).count();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends `GET path` with `auth` on a kept-alive connection and returns the status
/// (the body, of `Content-Length` bytes, read and dropped).
async fn keep_alive_get(
    conn: &mut BufReader<tokio::net::TcpStream>,
    path: &str,
    auth: &str,
) -> u16 {
    let head =
        format!("GET {path} HTTP/1.1\r\nHost: paddock\r\nAuthorization: Bearer {auth}\r\n\r\n");
    conn.get_mut().write_all(head.as_bytes()).await.unwrap();
    let mut status = 0;
    let mut length = 0usize;
    let mut first = true;
    loop {
        let mut line = String::new();
        let n = tokio::time::timeout(Duration::from_secs(20), conn.read_line(&mut line))
            .await
            .expect("an answer within 20 s")
            .expect("read the answer");
        assert!(
            n > 0,
            "the server closed a kept-alive connection mid-answer"
        );
        let line = line.trim_end();
        if first {
            status = line
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            first = false;
        } else if line.is_empty() {
            break;
        } else if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap();
            }
        }
    }
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body).await.unwrap();
    status
}

async fn connect_from(server: SocketAddr, from: Ipv4Addr) -> BufReader<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from.into(), 0)).unwrap();
    BufReader::new(socket.connect(server).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_idle_unauthenticated_connections_leave_an_authenticated_client_its_answer() {
    // Each held connection costs three descriptors here (the client's, the server's
    // and the server's copy); one closed by a cap, one.
    let limit = raise_open_files();
    let budget = (limit.saturating_sub(2048) / 3) as usize;
    let per_address_opened = (budget / 8).min(320);
    assert!(
        per_address_opened >= 64,
        "this process may open {limit} files: too few for the test"
    );
    // Caps below what is opened: the per-address cap, then the total one, bind.
    let per_address = (per_address_opened * 15 / 16) as u32;
    let total = (per_address_opened * 8 * 25 / 32) as u32;
    let t = server_with_caps(total, per_address, 2);
    let addresses: Vec<Ipv4Addr> = (2..=9).map(|i| Ipv4Addr::new(127, 0, 0, i)).collect();
    let opening: Vec<_> = addresses
        .iter()
        .map(|&from| tokio::spawn(idle_connections(t.addr, from, per_address_opened)))
        .collect();
    let mut by_address = Vec::new();
    for o in opening {
        by_address.push(o.await.expect("connections opened"));
    }
    let all: Vec<&std::net::TcpStream> = by_address.iter().flatten().collect();
    let opened = all.len();
    assert_eq!(opened, per_address_opened * 8);
    let want_closed = opened - total as usize;
    let closed_now = settle(&all, want_closed).await;
    assert_eq!(
        closed_now, want_closed,
        "{opened} opened, at most {total} held: the rest closed, oldest first"
    );
    for (from, sockets) in addresses.iter().zip(&by_address) {
        let open = sockets.iter().filter(|s| !closed(s)).count();
        assert!(
            open <= per_address as usize,
            "{from} holds {open} connections, over its cap {per_address}"
        );
    }

    // The server still answers: at once, from another address, with the key. (And
    // a client without it gets its 401.)
    let started = Instant::now();
    let r = Request::get("/v1/engines")
        .header("Authorization", &format!("Bearer {KEY}"))
        .send(t.addr)
        .await;
    r.expect(200);
    Request::get("/v1/engines")
        .send(t.addr)
        .await
        .expect_error(401, "UNAUTHORIZED");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "with {total} idle connections held, two requests took {took:?}"
    );
    // The idle connections are still held (but for the ones that made room for the
    // two requests').
    let still = all.iter().filter(|s| !closed(s)).count();
    assert!(
        still + 2 >= total as usize && still <= total as usize,
        "{still} of {total} held"
    );
    drop(by_address);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_per_address_cap_are_closed_oldest_first_and_keys_exempt_theirs() {
    raise_open_files();
    // One worker: connections are counted in the order they were accepted.
    let t = server_with_caps(1000, 4, 1);
    let here = Ipv4Addr::new(127, 0, 0, 5);
    let there = Ipv4Addr::new(127, 0, 0, 6);
    // One connection presents the key, another a wrong one; both stay open.
    let mut authed = connect_from(t.addr, here).await;
    assert_eq!(keep_alive_get(&mut authed, "/v1/engines", KEY).await, 200);
    let mut wrong = connect_from(t.addr, here).await;
    assert_eq!(
        keep_alive_get(&mut wrong, "/v1/engines", "wrong-key-0123456789").await,
        401
    );
    // Six idle ones from the same address: with the wrong-key one, seven without a
    // credential for a cap of four.
    let idle = idle_connections(t.addr, here, 6).await;
    let others = idle_connections(t.addr, there, 3).await;
    let wrong_std = wrong.into_inner().into_std().unwrap();
    let mut counted: Vec<&std::net::TcpStream> = vec![&wrong_std];
    counted.extend(idle.iter());
    assert_eq!(settle(&counted, 3).await, 3);
    assert!(
        closed(&wrong_std),
        "the oldest, the wrong key's, was closed"
    );
    assert!(
        closed(&idle[0]) && closed(&idle[1]),
        "then the oldest idle ones"
    );
    assert!(idle[2..].iter().all(|s| !closed(s)), "the newest four stay");
    assert!(
        others.iter().all(|s| !closed(s)),
        "another address keeps its own"
    );
    // The connection that presented a key was not counted, and still works.
    assert_eq!(keep_alive_get(&mut authed, "/v1/engines", KEY).await, 200);
    drop((idle, others, wrong_std));
    t.stop().await;
}

/// A server without keys whose bodies may pause 300 ms at most.
fn quick_bodies() -> TestServer {
    let server = ServerConfig {
        body_read_timeout_ms: 300,
        ..server_config()
    };
    let mut config = PaddockConfig::default();
    config.pool.min_idle = 1;
    TestServer::start_config(config, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_is_answered_408_and_a_slow_steady_one_is_not() {
    let t = quick_bodies();
    let body = serde_json::to_vec(&sh("echo steady")).unwrap();

    // Ten bytes of the body, then nothing.
    let started = Instant::now();
    let r = Request::post("/v1/executions")
        .header("Content-Type", "application/json")
        .body(body.clone())
        .send_partial(t.addr, 10)
        .await
        .answer()
        .await;
    let message = r.expect_error(408, "TIMEOUT");
    assert!(message.contains("server.body_read_timeout_ms"), "{message}");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "answered after {:?}",
        started.elapsed()
    );

    // The same body in pieces 100 ms apart, 1.2 s in all: each pause is short.
    let mut stream = tokio::net::TcpStream::connect(t.addr).await.unwrap();
    let head = format!(
        "POST /v1/executions HTTP/1.1\r\nHost: paddock\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let pieces: Vec<&[u8]> = body.chunks(body.len().div_ceil(12)).collect();
    for piece in pieces {
        tokio::time::sleep(Duration::from_millis(100)).await;
        stream.write_all(piece).await.unwrap();
    }
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_string(&mut answer))
        .await
        .expect("an answer within 30 s")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("steady"), "{answer}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_is_408_and_a_quiet_websocket_stays_open() {
    let t = quick_bodies();
    let sandbox = post_json(t.addr, "/v1/sandboxes", &json!({"engine": "subprocess"}))
        .await
        .expect(201);
    let id = sandbox["id"].as_str().unwrap();

    // An upload that stops midway: 408, and no file is left.
    let r = Request::put(&format!("/v1/sandboxes/{id}/files/stalled.bin"))
        .body(vec![b'x'; 4096])
        .send_partial(t.addr, 100)
        .await
        .answer()
        .await;
    r.expect_error(408, "TIMEOUT");
    let r = Request::get(&format!("/v1/sandboxes/{id}/files/stalled.bin"))
        .send(t.addr)
        .await;
    assert_eq!(r.status, 404, "{}", r.text());

    // A WebSocket is the connection itself: silent for ten times the body timeout, it
    // still carries input and output.
    let started = post_json(
        t.addr,
        &format!("/v1/sandboxes/{id}/processes"),
        &json!({"argv": ["cat"], "stdin": true}),
    )
    .await
    .expect(201);
    let process = started["id"].as_str().unwrap();
    let (mut socket, response) = tokio_tungstenite::connect_async(format!(
        "ws://{}/v1/sandboxes/{id}/processes/{process}/attach",
        t.addr
    ))
    .await
    .expect("the upgrade");
    assert_eq!(response.status().as_u16(), 101);
    tokio::time::sleep(Duration::from_millis(3000)).await;
    socket
        .send(Message::Binary(b"still here\n".to_vec().into()))
        .await
        .expect("the socket is open");
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !String::from_utf8_lossy(&out).contains("still here") {
        match tokio::time::timeout_at(deadline, socket.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) if b.first() == Some(&1) => {
                out.extend_from_slice(&b[1..])
            }
            Ok(Some(Ok(_))) => {}
            other => panic!("no echo from the quiet socket: {other:?}"),
        }
    }
    let _ = socket.close(None).await;
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_key_is_answered_401_before_its_body_is_sent() {
    let t = server_with_caps(1000, 100, 2);
    for path in ["/v1/executions", "/v1/sandboxes"] {
        let started = Instant::now();
        // A body is announced and never sent.
        let r = Request::post(path)
            .header("Content-Type", "application/json")
            .body(vec![b' '; 1000])
            .send_partial(t.addr, 0)
            .await
            .answer()
            .await;
        r.expect_error(401, "UNAUTHORIZED");
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(3),
            "{path}: answered after {took:?}"
        );
    }
    t.stop().await;
}
