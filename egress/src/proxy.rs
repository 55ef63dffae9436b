//! The gateway's servers: the HTTP proxy (`CONNECT` and plain requests), the
//! transparent TCP path, the DNS stub, and the reader of the connections the
//! namespace's firewall refused at connect. Each decision goes to the gateway's log.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use paddock_core::egress::{EgressEvent, EgressRules, EgressVerdict, EgressVia};
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::dns::{AddrBook, Upstream};
use crate::log::{event, Counters, EgressLog, Totals};

mod dial;
mod http;
mod relay;
mod stub;
mod transparent;

pub(crate) use dial::refusal;
pub(crate) use http::serve_proxy;
pub(crate) use stub::{serve_dns_tcp, serve_dns_udp};
pub(crate) use transparent::serve_transparent;

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
