//! The gateway's servers: the HTTP proxy (`CONNECT` and plain requests), the
//! transparent TCP path, the DNS stub, and the reader of the connections the
//! namespace's firewall refused at connect. Each decision goes to the gateway's log.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use paddock_core::egress::{EgressEvent, EgressRules, EgressVerdict, EgressVia};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::dns::{self, AddrBook, Resolved, Upstream};
use crate::log::{event, Counters, EgressLog, Totals};
use crate::sniff::{self, HttpHead, Sniffed};

/// The bounds and waits of one gateway.
#[derive(Debug, Clone)]
pub struct GateLimits {
    /// The most connections (proxied, transparent and DNS over TCP) open at once.
    pub max_connections: usize,
    /// How long a dial of an admitted target may take.
    pub connect_timeout: Duration,
    /// How long the transparent path waits for a TLS ClientHello or an HTTP request.
    pub sniff_timeout: Duration,
    /// How long the proxy waits for a request head.
    pub head_timeout: Duration,
}

impl Default for GateLimits {
    fn default() -> Self {
        GateLimits {
            max_connections: 64,
            connect_timeout: Duration::from_secs(5),
            sniff_timeout: Duration::from_secs(1),
            head_timeout: Duration::from_secs(10),
        }
    }
}

/// Called with every decision (for telemetry).
pub type Observer = Arc<dyn Fn(&EgressEvent) + Send + Sync>;

/// What the servers of one gateway share.
pub(crate) struct Gate {
    pub(crate) rules: EgressRules,
    pub(crate) upstream: Upstream,
    pub(crate) book: Mutex<AddrBook>,
    pub(crate) log: EgressLog,
    pub(crate) totals: Totals,
    pub(crate) conns: Arc<Semaphore>,
    pub(crate) dns_inflight: Arc<Semaphore>,
    pub(crate) limits: GateLimits,
    /// The gateway's own listening addresses inside the namespace.
    pub(crate) own: Vec<SocketAddr>,
    pub(crate) observer: Option<Observer>,
    /// The namespace's firewall: the addresses the stub hands out go to it, the
    /// connections it refuses come from it.
    pub(crate) firewall: crate::firewall::Firewall,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("rules", &self.rules)
            .finish_non_exhaustive()
    }
}

impl Gate {
    fn record(&self, ev: EgressEvent, counters: Option<Arc<Counters>>) {
        match ev.verdict {
            EgressVerdict::Allowed => &self.totals.allowed,
            EgressVerdict::Denied => &self.totals.denied,
            EgressVerdict::Failed => &self.totals.failed,
        }
        .fetch_add(1, Ordering::Relaxed);
        if let Some(o) = &self.observer {
            o(&ev);
        }
        tracing::debug!(host = %ev.host, port = ev.port, verdict = ?ev.verdict, reason = %ev.reason, "egress");
        self.log.push(ev, counters);
    }

    fn permit(&self) -> Option<OwnedSemaphorePermit> {
        self.conns.clone().try_acquire_owned().ok()
    }

    fn ports_text(&self) -> String {
        let p: Vec<String> = self.rules.ports().iter().map(u16::to_string).collect();
        p.join(", ")
    }

    /// Records the connections the firewall refused since the last call, as the
    /// transparent path records a denial. The kernel queues each before the refused
    /// `connect` returns, so a caller that runs this after a program ended sees
    /// every refusal the program saw. Ends with `WouldBlock` once none is left.
    pub(crate) fn take_refusals(&self) -> io::Result<()> {
        self.firewall.read_log(|logged| match logged {
            crate::firewall::Logged::Refused(to) => self.refused_at_connect(SocketAddr::V4(to)),
            crate::firewall::Logged::Lost(n) => self.record(
                event(
                    EgressVia::Transparent,
                    "",
                    0,
                    None,
                    EgressVerdict::Denied,
                    format!("{n} more connections were refused at connect but not recorded one by one (the firewall's log overflowed)"),
                ),
                None,
            ),
        })
    }

    /// Records the refusal at connect of a connection to `orig`, with the reason the
    /// transparent path would have given.
    fn refused_at_connect(&self, orig: SocketAddr) {
        let reason = match screen(self, orig) {
            Err(reason) => reason,
            // Admitted by the rules, so refused for its address: the host's own, or
            // one the firewall did not hold (its set full).
            Ok(_) => refusal(&self.rules, orig.ip()).unwrap_or_else(|| {
                format!(
                    "{} was not among the addresses the sandbox's firewall admitted",
                    orig.ip()
                )
            }),
        };
        self.record(
            event(
                EgressVia::Transparent,
                &orig.ip().to_string(),
                orig.port(),
                Some(orig.to_string()),
                EgressVerdict::Denied,
                reason,
            ),
            None,
        );
    }
}

/// Reads the firewall's log of refused connections until the task is aborted.
pub(crate) async fn serve_refusals(
    log: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
    gate: Arc<Gate>,
) {
    loop {
        let Ok(mut ready) = log.readable().await else {
            return;
        };
        if let Ok(Err(e)) = ready.try_io(|_| gate.take_refusals()) {
            tracing::warn!(error = %e, "reading the firewall's log failed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// What the transparent path knows of a connection to `orig` before it reads a
/// byte: the address rule that covers it and the name the stub handed its address
/// out for, or why it is refused. The namespace's firewall refuses at connect what
/// this refuses ([`crate::firewall`]), and the gateway records it with this reason.
fn screen(gate: &Gate, orig: SocketAddr) -> Result<(Option<String>, Option<String>), String> {
    if !gate.rules.port_allowed(orig.port()) {
        return Err(format!(
            "port {} is not among the allowlist's ports ({})",
            orig.port(),
            gate.ports_text()
        ));
    }
    let by_range = gate.rules.rule_for_addr(orig.ip()).map(|r| r.to_string());
    let given_for = gate.book.lock().name_of(orig.ip()).map(str::to_string);
    if gate.rules.is_unrestricted() {
        if by_range.is_none() {
            return Err(refusal(&gate.rules, orig.ip())
                .unwrap_or_else(|| format!("{} is admitted by no rule", orig.ip())));
        }
    } else if by_range.is_none() && given_for.is_none() {
        return Err(format!(
            "{} was not given out by this sandbox's resolver for an allowed name, and no address rule covers it",
            orig.ip()
        ));
    }
    Ok((by_range, given_for))
}

/// Why a target was not dialled.
struct Refusal {
    verdict: EgressVerdict,
    reason: String,
}

impl Refusal {
    fn denied(reason: String) -> Refusal {
        Refusal {
            verdict: EgressVerdict::Denied,
            reason,
        }
    }
    fn failed(reason: String) -> Refusal {
        Refusal {
            verdict: EgressVerdict::Failed,
            reason,
        }
    }
}

/// Checks `host:port` against the allowlist, resolves it, and dials the first
/// address that is not refused.
async fn admit(
    gate: &Gate,
    host: &str,
    port: u16,
) -> Result<(TcpStream, SocketAddr, String), Refusal> {
    if !gate.rules.port_allowed(port) {
        return Err(Refusal::denied(format!(
            "port {port} is not among the allowlist's ports ({})",
            gate.ports_text()
        )));
    }
    let Some(rule) = gate.rules.rule_for_name(host).map(|r| r.to_string()) else {
        return Err(Refusal::denied(format!(
            "host `{host}` matches no rule of the allowlist"
        )));
    };
    let addrs: Vec<IpAddr> = match paddock_core::egress::parse_addr(host) {
        Some(ip) => vec![ip],
        None => match gate.upstream.resolve(host).await {
            Ok(Resolved::Addrs(a, _)) => a.into_iter().map(IpAddr::V4).collect(),
            Ok(Resolved::NoSuchName) => {
                return Err(Refusal::failed(format!("`{host}` does not resolve")))
            }
            Err(e) => return Err(Refusal::failed(format!("resolving `{host}` failed: {e}"))),
        },
    };
    dial(gate, addrs, port, rule).await
}

/// Why `ip` may not be dialled under `rules`, if it may not: a closed range, a
/// private one the rules do not open, or an address of the host itself.
pub(crate) fn refusal(rules: &EgressRules, ip: IpAddr) -> Option<String> {
    let policy = if rules.is_unrestricted() {
        "network `unrestricted` does not reach"
    } else {
        "no address rule of the allowlist covers"
    };
    match rules.check_resolved(ip) {
        Err(range) if range.is_closed() => Some(format!(
            "{ip} is a {} address, which no sandbox reaches",
            range.as_str()
        )),
        Err(range) => Some(format!(
            "{ip} is a {} address, which {policy}",
            range.as_str()
        )),
        Ok(()) if crate::host::is_own(ip) => Some(format!(
            "{ip} is an address of this host, which no sandbox reaches"
        )),
        Ok(()) => None,
    }
}

/// Dials the first of `addrs` that [`refusal`] lets through.
async fn dial(
    gate: &Gate,
    addrs: Vec<IpAddr>,
    port: u16,
    rule: String,
) -> Result<(TcpStream, SocketAddr, String), Refusal> {
    let mut refused = None;
    let mut failed = None;
    for ip in addrs {
        if let Some(why) = refusal(&gate.rules, ip) {
            refused = Some(why);
            continue;
        }
        let to = SocketAddr::new(ip, port);
        match tokio::time::timeout(gate.limits.connect_timeout, TcpStream::connect(to)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok((s, to, rule));
            }
            Ok(Err(e)) => failed = Some(format!("connecting to {to} failed: {e}")),
            Err(_) => {
                failed = Some(format!(
                    "connecting to {to} took longer than {:?}",
                    gate.limits.connect_timeout
                ))
            }
        }
    }
    if let Some(f) = failed {
        return Err(Refusal::failed(f));
    }
    match refused {
        Some(why) => Err(Refusal::denied(why)),
        None => Err(Refusal::failed("the name has no address".to_string())),
    }
}

/// Copies both ways between the sandbox's `client` and `upstream`, counting bytes;
/// `first` (bytes already read from the client) goes first. The bytes move in the
/// kernel (`splice` through a pipe per direction), never through a buffer here.
async fn pump(client: TcpStream, upstream: TcpStream, first: Vec<u8>, counters: Arc<Counters>) {
    let up = async {
        if write_all(&upstream, &first).await.is_ok() {
            counters
                .out
                .fetch_add(first.len() as u64, Ordering::Relaxed);
            let _ = relay(&client, &upstream, &counters.out).await;
        }
        crate::sys::shutdown_write(upstream.as_raw_fd());
    };
    let down = async {
        let _ = relay(&upstream, &client, &counters.r#in).await;
        crate::sys::shutdown_write(client.as_raw_fd());
    };
    tokio::join!(up, down);
    counters.closed.store(true, Ordering::Release);
}

/// Writes all of `bytes` to `to`.
async fn write_all(to: &TcpStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        to.writable().await?;
        match to.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Moves everything `from` sends to `to` until `from` ends (or either fails),
/// adding the bytes to `count`.
async fn relay(from: &TcpStream, to: &TcpStream, count: &AtomicU64) -> std::io::Result<()> {
    use tokio::io::Interest;
    let (pipe_r, pipe_w) = crate::sys::splice_pipe()?;
    loop {
        let n = loop {
            from.readable().await?;
            match from.try_io(Interest::READABLE, || {
                crate::sys::splice(from.as_raw_fd(), pipe_w.as_raw_fd(), 1 << 20)
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            return Ok(());
        }
        let mut left = n;
        while left > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || {
                crate::sys::splice(pipe_r.as_raw_fd(), to.as_raw_fd(), left)
            }) {
                Ok(m) => left -= m,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        count.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Serves the HTTP proxy on `listener` until the task is aborted.
pub(crate) async fn serve_proxy(listener: TcpListener, gate: Arc<Gate>, stop: CancellationToken) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let (gate, stop) = (gate.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = proxy_one(stream, &gate) => {}
            }
        });
    }
}

async fn respond(stream: &mut TcpStream, status: &str, body: &str) -> io::Result<()> {
    let msg = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nX-Paddock-Egress: refused\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(msg.as_bytes()).await?;
    stream.shutdown().await
}

async fn proxy_one(mut stream: TcpStream, gate: &Gate) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    let Some(permit) = gate.permit() else {
        let reason = format!(
            "more than {} connections are open from this sandbox",
            gate.limits.max_connections
        );
        gate.record(
            event(
                EgressVia::Connect,
                "",
                0,
                None,
                EgressVerdict::Denied,
                &reason,
            ),
            None,
        );
        return respond(
            &mut stream,
            "503 Service Unavailable",
            &format!("paddock egress: {reason}\n"),
        )
        .await;
    };
    let mut buf = Vec::with_capacity(4096);
    let head = tokio::time::timeout(gate.limits.head_timeout, async {
        loop {
            match sniff::http_host(&buf) {
                HttpHead::NeedMore => {}
                other => return Ok(other),
            }
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await;
    let (method, target, head_len) = match head {
        Ok(Ok(HttpHead::Request {
            method,
            target,
            head_len,
            ..
        })) => (method, target, head_len),
        Ok(Ok(_)) => {
            return respond(
                &mut stream,
                "400 Bad Request",
                "paddock egress: not an HTTP/1 request head\n",
            )
            .await
        }
        Ok(Err(e)) => return Err(e),
        Err(_) => return Ok(()),
    };
    let (via, host, port, origin_path) = if method == "CONNECT" {
        match sniff::split_host_port(&target) {
            Some((h, Some(p))) => (EgressVia::Connect, h, p, None),
            _ => {
                return respond(
                    &mut stream,
                    "400 Bad Request",
                    &format!(
                        "paddock egress: CONNECT needs host:port, not `{}`\n",
                        target.escape_debug()
                    ),
                )
                .await
            }
        }
    } else if let Some(rest) = target.strip_prefix("http://") {
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        match sniff::split_host_port(authority) {
            Some((h, p)) => (EgressVia::Http, h, p.unwrap_or(80), Some(path.to_string())),
            None => {
                return respond(
                    &mut stream,
                    "400 Bad Request",
                    &format!(
                        "paddock egress: `{}` has no usable host\n",
                        authority.escape_debug()
                    ),
                )
                .await
            }
        }
    } else {
        return respond(
            &mut stream,
            "400 Bad Request",
            "paddock egress: send CONNECT host:port, or an absolute-form request (GET http://host/path)\n",
        )
        .await;
    };
    let (upstream, addr, rule) = match admit(gate, &host, port).await {
        Ok(ok) => ok,
        Err(r) => {
            gate.record(event(via, &host, port, None, r.verdict, &r.reason), None);
            let status = match r.verdict {
                EgressVerdict::Denied => "403 Forbidden",
                _ => "502 Bad Gateway",
            };
            return respond(
                &mut stream,
                status,
                &format!("paddock egress: {}\n", r.reason),
            )
            .await;
        }
    };
    let counters = Arc::new(Counters::default());
    gate.record(
        event(
            via,
            &host,
            port,
            Some(addr.to_string()),
            EgressVerdict::Allowed,
            rule,
        ),
        Some(counters.clone()),
    );
    let first = match origin_path {
        None => {
            stream
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await?;
            buf[head_len..].to_vec()
        }
        Some(path) => {
            let mut head = rewrite_head(&buf[..head_len], &method, &path);
            head.extend_from_slice(&buf[head_len..]);
            head
        }
    };
    pump(stream, upstream, first, counters).await;
    drop(permit);
    Ok(())
}

/// A proxied request's head made an origin server's: the request line in origin
/// form, hop-by-hop and proxy headers dropped, and `Connection: close` (a kept-alive
/// connection would carry later requests past the check).
fn rewrite_head(head: &[u8], method: &str, path: &str) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let version = lines
        .next()
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or("HTTP/1.1");
    let mut out = format!("{method} {path} {version}\r\n");
    for line in lines {
        if line.is_empty() {
            continue;
        }
        let name = line.split(':').next().unwrap_or("").trim();
        if [
            "proxy-connection",
            "proxy-authorization",
            "connection",
            "keep-alive",
        ]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h))
        {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    out.into_bytes()
}

/// Serves the transparent path on `listener` until the task is aborted.
pub(crate) async fn serve_transparent(
    listener: TcpListener,
    gate: Arc<Gate>,
    stop: CancellationToken,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let (gate, stop) = (gate.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = transparent_one(stream, &gate) => {}
            }
        });
    }
}

/// Ends `stream` with a reset, so the program sees a refused connection at once.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

async fn transparent_one(mut stream: TcpStream, gate: &Gate) {
    let Some(orig) = crate::sys::original_dst(&stream) else {
        return reset(stream);
    };
    let host_of = orig.ip().to_string();
    let deny = |stream: TcpStream, host: &str, reason: String| {
        gate.record(
            event(
                EgressVia::Transparent,
                host,
                orig.port(),
                Some(orig.to_string()),
                EgressVerdict::Denied,
                reason,
            ),
            None,
        );
        reset(stream);
    };
    if gate.own.contains(&orig) {
        return reset(stream);
    }
    let Some(permit) = gate.permit() else {
        let reason = format!(
            "more than {} connections are open from this sandbox",
            gate.limits.max_connections
        );
        return deny(stream, &host_of, reason);
    };
    // The firewall refused at connect what this refuses; checked again here, as the
    // book may have let an address go since.
    let (by_range, given_for) = match screen(gate, orig) {
        Ok(known) => known,
        Err(reason) => return deny(stream, &host_of, reason),
    };
    if gate.rules.is_unrestricted() {
        // Any address but the special ranges the rules keep closed, dialled at once
        // (a protocol in which the server speaks first must not wait for a sniff),
        // named in the record by the resolver's answer where there was one.
        let rule = by_range.unwrap_or_default();
        let host = given_for.unwrap_or(host_of);
        return connect_and_pump(gate, stream, orig, host, rule, Vec::new(), permit).await;
    }
    // What the connection's first bytes say it is for.
    let mut buf = Vec::with_capacity(2048);
    let sniffed = tokio::time::timeout(gate.limits.sniff_timeout, async {
        let mut chunk = [0u8; 4096];
        loop {
            match sniff::sniff(&buf) {
                Sniffed::NeedMore => {}
                other => return other,
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return Sniffed::Unknown,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await
    .unwrap_or(Sniffed::NeedMore);
    let (host, rule) = match sniffed {
        Sniffed::Tls(name) | Sniffed::Http(name) => {
            match gate.rules.rule_for_name(&name) {
                Some(rule) => {
                    let rule = rule.to_string();
                    (name, rule)
                }
                None => {
                    let reason = format!("host `{name}` (as the connection names it) matches no rule of the allowlist");
                    return deny(stream, &name, reason);
                }
            }
        }
        Sniffed::TlsNoName | Sniffed::HttpNoHost => match &by_range {
            Some(rule) => (host_of.clone(), rule.clone()),
            None => {
                let reason = "the connection names no host (a TLS ClientHello without SNI, or HTTP without Host) and no address rule covers its address".to_string();
                return deny(stream, &host_of, reason);
            }
        },
        Sniffed::Unknown | Sniffed::NeedMore => match (by_range, given_for) {
            (Some(rule), _) => (host_of.clone(), rule),
            (None, Some(name)) => {
                let rule = gate
                    .rules
                    .rule_for_name(&name)
                    .map(|r| r.to_string())
                    .unwrap_or_default();
                let rule = format!("{rule} (the address the resolver gave for `{name}`)");
                (name, rule)
            }
            (None, None) => {
                // Refused above; kept as a denial should that check ever move.
                let reason = format!("{} is admitted by no rule", orig.ip());
                return deny(stream, &host_of, reason);
            }
        },
    };
    connect_and_pump(gate, stream, orig, host, rule, buf, permit).await;
}

/// Dials a transparent connection's original destination `orig` for `host` under
/// `rule`, records the decision, and relays until either side ends (`first`: the
/// client's bytes read while sniffing).
async fn connect_and_pump(
    gate: &Gate,
    stream: TcpStream,
    orig: SocketAddr,
    host: String,
    rule: String,
    first: Vec<u8>,
    permit: OwnedSemaphorePermit,
) {
    let dialled = dial(gate, vec![orig.ip()], orig.port(), rule).await;
    let (upstream, addr, rule) = match dialled {
        Ok(ok) => ok,
        Err(r) => {
            gate.record(
                event(
                    EgressVia::Transparent,
                    &host,
                    orig.port(),
                    Some(orig.to_string()),
                    r.verdict,
                    r.reason,
                ),
                None,
            );
            return reset(stream);
        }
    };
    let counters = Arc::new(Counters::default());
    gate.record(
        event(
            EgressVia::Transparent,
            &host,
            orig.port(),
            Some(addr.to_string()),
            EgressVerdict::Allowed,
            rule,
        ),
        Some(counters.clone()),
    );
    pump(stream, upstream, first, counters).await;
    drop(permit);
}

async fn answer_and_record(gate: &Gate, query: &[u8]) -> Option<Vec<u8>> {
    match dns::answer(query, &gate.rules, &gate.upstream).await {
        dns::Decision::Drop => None,
        dns::Decision::Answer {
            reply,
            name,
            allowed,
            addrs,
            reason,
        } => {
            if allowed && !addrs.is_empty() {
                let mut held = Vec::new();
                {
                    let mut book = gate.book.lock();
                    for a in &addrs {
                        let noted = book.note(IpAddr::V4(*a), name.as_deref().unwrap_or_default());
                        if noted.renewed {
                            held.push(*a);
                        }
                        if let Some(IpAddr::V4(gone)) = noted.evicted {
                            held.push(gone);
                        }
                    }
                }
                // Admitted at connect before the answer leaves. Under `unrestricted`
                // the firewall admits every address the rules do.
                if !gate.rules.is_unrestricted() {
                    if let Err(e) = gate.firewall.admit(&addrs, &held, dns::BOOK_KEEP) {
                        tracing::warn!(error = %e, name = name.as_deref().unwrap_or_default(), "the sandbox's firewall did not take the addresses handed out; connections to them will be refused");
                    }
                }
            }
            let verdict = if allowed {
                EgressVerdict::Allowed
            } else {
                EgressVerdict::Denied
            };
            gate.record(
                event(
                    EgressVia::Dns,
                    name.as_deref().unwrap_or_default(),
                    53,
                    addrs.first().map(|a| a.to_string()),
                    verdict,
                    reason,
                ),
                None,
            );
            Some(reply)
        }
    }
}

/// Serves DNS over UDP on `sock` until the task is aborted.
pub(crate) async fn serve_dns_udp(sock: UdpSocket, gate: Arc<Gate>) {
    let sock = Arc::new(sock);
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, from)) = sock.recv_from(&mut buf).await else {
            continue;
        };
        // Questions in flight are bounded; one beyond is dropped (the client retries).
        let Ok(permit) = gate.dns_inflight.clone().try_acquire_owned() else {
            continue;
        };
        let query = buf[..n].to_vec();
        let (gate, sock) = (gate.clone(), sock.clone());
        tokio::spawn(async move {
            if let Some(mut reply) = answer_and_record(&gate, &query).await {
                if reply.len() > dns::MAX_UDP {
                    // Too long for UDP: the header alone, truncated, so the client
                    // asks again over TCP.
                    reply.truncate(12);
                    reply[2] |= 0x02;
                    reply[4..12].fill(0);
                }
                let _ = sock.send_to(&reply, from).await;
            }
            drop(permit);
        });
    }
}

/// Serves DNS over TCP on `listener` until the task is aborted.
pub(crate) async fn serve_dns_tcp(listener: TcpListener, gate: Arc<Gate>, stop: CancellationToken) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Some(permit) = gate.permit() else {
            reset(stream);
            continue;
        };
        let (gate, stop) = (gate.clone(), stop.clone());
        tokio::spawn(async move {
            let _held = permit;
            let served = async {
                loop {
                    let read = tokio::time::timeout(Duration::from_secs(10), async {
                        let len = stream.read_u16().await?;
                        let mut q = vec![0u8; usize::from(len)];
                        stream.read_exact(&mut q).await?;
                        io::Result::Ok(q)
                    })
                    .await;
                    let Ok(Ok(q)) = read else { break };
                    let Some(reply) = answer_and_record(&gate, &q).await else {
                        break;
                    };
                    let mut framed = (reply.len() as u16).to_be_bytes().to_vec();
                    framed.extend_from_slice(&reply);
                    if stream.write_all(&framed).await.is_err() {
                        break;
                    }
                }
            };
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = served => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxied_head_loses_its_proxy_headers_and_keeps_the_rest() {
        let head = b"GET http://a.test/x?y=1 HTTP/1.1\r\nHost: a.test\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\n";
        let out = String::from_utf8(rewrite_head(head, "GET", "/x?y=1")).unwrap();
        assert_eq!(
            out,
            "GET /x?y=1 HTTP/1.1\r\nHost: a.test\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
    }
}
