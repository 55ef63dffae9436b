//! A tenant's cap on requests in progress (`server.max_requests_per_tenant`) is one
//! cap across the native API and the E2B-compatible one served on the same listener:
//! a tenant holding its cap on either API is refused on the other, and another
//! tenant is not.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use paddock_pool::http::{ApiKey, ServerConfig};
use tokio::io::BufReader;
use tokio::net::TcpStream;

use crate::admission::{answer, send, Answer, Server};

const ALPHA: &str = "key-caps-alpha-0123456789";
const BETA: &str = "key-caps-beta-0123456789";
/// Requests in progress one tenant may have.
const CAP: u32 = 2;

/// Two tenants' keys, `CAP` requests each; a request whose body is announced and
/// not sent stays in progress.
fn start() -> Server {
    Server::start_with(ServerConfig {
        api_keys: vec![ApiKey::new(ALPHA, "alpha"), ApiKey::new(BETA, "beta")],
        max_requests_per_tenant: CAP,
        // Longer than `until` waits: a held request is not answered 408 meanwhile.
        body_read_timeout_ms: 120_000,
        ..ServerConfig::default()
    })
}

/// E2B's list of sandboxes, with `key` in `X-API-Key`.
async fn e2b_list(addr: SocketAddr, key: &str) -> Answer {
    let head = format!("GET /sandboxes HTTP/1.1\r\nX-API-Key: {key}");
    answer(&mut send(addr, &head, 0, b"").await).await
}

/// The native statistics, with `header` carrying the key.
async fn native_stats(addr: SocketAddr, header: &str) -> Answer {
    let head = format!("GET /v1/stats HTTP/1.1\r\n{header}");
    answer(&mut send(addr, &head, 0, b"").await).await
}

/// `CAP` requests of `head` whose bodies are announced and never sent: each holds
/// its place while its connection is open.
async fn hold(addr: SocketAddr, head: &str) -> Vec<BufReader<TcpStream>> {
    let mut held = Vec::new();
    for _ in 0..CAP {
        held.push(send(addr, head, 1000, b"{").await);
    }
    held
}

/// Holds `CAP` requests of `head` and asks `ask` until it answers `status` (within
/// 90 s: the held requests reach the server in their own time on a loaded
/// machine): the held requests and that answer. A probe let in holds a place of
/// the tenant's while it runs, so a held request that arrives meanwhile may be
/// refused: one answered so is sent again.
async fn hold_until<F, Fut>(
    addr: SocketAddr,
    head: &str,
    status: u16,
    mut ask: F,
) -> (Vec<BufReader<TcpStream>>, Answer)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Answer>,
{
    use tokio::io::AsyncBufReadExt;
    let mut held = hold(addr, head).await;
    let start = Instant::now();
    loop {
        let a = ask().await;
        if a.status == status {
            return (held, a);
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "still {} (not {status}) after 90 s: {}",
            a.status,
            a.body
        );
        for conn in held.iter_mut() {
            // Answered (or closed): its place is gone; hold another.
            let answered = tokio::time::timeout(Duration::from_millis(5), conn.fill_buf())
                .await
                .is_ok();
            if answered {
                *conn = send(addr, head, 1000, b"{").await;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asks `ask` until it answers `status` (within 90 s: the held requests reach the
/// server in their own time on a loaded machine), and returns that answer.
async fn until<F, Fut>(status: u16, mut ask: F) -> Answer
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Answer>,
{
    let start = Instant::now();
    loop {
        let a = ask().await;
        if a.status == status {
            return a;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "still {} (not {status}) after 90 s: {}",
            a.status,
            a.body
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_at_its_cap_on_the_native_api_is_refused_on_the_e2b_api() {
    let s = start();
    let addr = s.addr();
    assert_eq!(e2b_list(addr, ALPHA).await.status, 200);

    // Once the native API counts both, alpha's E2B requests are refused, in E2B's
    // format, with the setting to change.
    let (held, refused) = hold_until(
        addr,
        &format!("POST /v1/executions HTTP/1.1\r\nAuthorization: Bearer {ALPHA}"),
        429,
        || e2b_list(addr, ALPHA),
    )
    .await;
    assert_eq!(refused.body["code"], 429, "{}", refused.body);
    let message = refused.body["message"].as_str().unwrap();
    assert!(
        message.contains("server.max_requests_per_tenant"),
        "{message}"
    );
    assert!(
        refused.headers.iter().any(|(k, _)| k == "retry-after"),
        "{:?}",
        refused.headers
    );
    // Its native requests too, whichever header carries its key.
    for header in [
        format!("Authorization: Bearer {ALPHA}"),
        format!("X-API-Key: {ALPHA}"),
    ] {
        let a = native_stats(addr, &header).await;
        assert_eq!(a.status, 429, "{header}: {}", a.body);
        assert_eq!(a.body["error"]["code"], "RATE_LIMITED", "{}", a.body);
    }
    // Another tenant is not affected, on either API.
    assert_eq!(e2b_list(addr, BETA).await.status, 200);
    let b = native_stats(addr, &format!("Authorization: Bearer {BETA}")).await;
    assert_eq!(b.status, 200, "{}", b.body);

    // Places come back when the held requests end.
    drop(held);
    until(200, || e2b_list(addr, ALPHA)).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_at_its_cap_on_the_e2b_api_is_refused_on_the_native_api() {
    let s = start();
    let addr = s.addr();
    let bearer = format!("Authorization: Bearer {ALPHA}");
    assert_eq!(native_stats(addr, &bearer).await.status, 200);

    let (held, refused) = hold_until(
        addr,
        &format!("POST /sandboxes HTTP/1.1\r\nX-API-Key: {ALPHA}"),
        429,
        || native_stats(addr, &bearer),
    )
    .await;
    assert_eq!(
        refused.body["error"]["code"], "RATE_LIMITED",
        "{}",
        refused.body
    );
    let message = refused.body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("server.max_requests_per_tenant = 2"),
        "{message}"
    );
    assert_eq!(e2b_list(addr, ALPHA).await.status, 429);
    assert_eq!(
        native_stats(addr, &format!("Authorization: Bearer {BETA}"))
            .await
            .status,
        200
    );
    assert_eq!(e2b_list(addr, BETA).await.status, 200);

    drop(held);
    until(200, || native_stats(addr, &bearer)).await;
    s.stop().await;
}
