//! # paddock-egress
//!
//! The egress gateway of sandboxes under network policy `allowlist`: each sandbox
//! gets a network namespace of its own whose only device is its loopback, and whose
//! only ways out are sockets Paddock holds in it:
//!
//! - an HTTP proxy (`CONNECT`, and plain requests in absolute form) at
//!   `127.0.0.1:3128`, which programs reach through `HTTP_PROXY` and `HTTPS_PROXY`;
//! - a transparent path at `127.0.0.1:15001`, to which the namespace's firewall
//!   redirects every other outbound TCP connection it admits; it reads the TLS
//!   server name or the HTTP `Host` before it dials;
//! - a DNS stub at `127.0.0.1:53` (UDP and TCP), to which every DNS packet is
//!   redirected, answering only names the allowlist admits.
//!
//! The firewall (`nftables`, see the `firewall` module) admits a TCP connection
//! only to a port of the allowlist and an address the stub handed out for an
//! admitted name or an address rule covers; it refuses every other one at connect
//! (a reset: `ECONNREFUSED` at once) and logs it, and the gateway records the
//! refusal as a denial. Everything else (UDP, ICMP, IPv6) is dropped, so it fails at
//! once too. Nothing links the namespace to the host: no veth, no route,
//! no address of the host's. A program that rewrote the rules (it would need
//! `CAP_NET_ADMIN` over the namespace) would still find no way out but the
//! gateway's sockets. The gateway dials from Paddock's own network namespace, after
//! checking the name, the port and every address the name resolves to.
//!
//! Every decision is logged ([`Gateway::events_since`]): the audit entry of the
//! execution during which it was made lists it.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
// `unsafe` only in `sys` (the system calls, each behind a safe function).
#![deny(unsafe_code)]

pub mod dns;
mod firewall;
pub mod host;
pub mod log;
mod netlink;
mod proxy;
pub mod sniff;
mod sys;

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use paddock_core::egress::{EgressEvent, EgressRules};
use tokio::sync::Semaphore;

pub use proxy::{GateLimits, Observer};

/// The ports of the gateway inside every sandbox's namespace (on `127.0.0.1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    /// The HTTP proxy.
    pub proxy: u16,
    /// The transparent path.
    pub transparent: u16,
    /// The DNS stub.
    pub dns: u16,
}

/// The ports Paddock uses.
pub const PORTS: Ports = Ports {
    proxy: 3128,
    transparent: 15001,
    dns: 53,
};

/// The most decisions one gateway keeps for its executions to take.
pub const DEFAULT_MAX_EVENTS: usize = 1024;

/// How the gateways of an engine are made.
#[derive(Clone)]
pub struct GatewayConfig {
    /// The resolvers asked for admitted names (default: `/etc/resolv.conf`'s).
    pub resolvers: Vec<SocketAddr>,
    /// How long one resolver may take to answer.
    pub resolve_timeout: Duration,
    /// Bounds and waits.
    pub limits: GateLimits,
    /// Decisions kept per gateway.
    pub max_events: usize,
    /// The `nft` program.
    pub nft: PathBuf,
    /// Told of every decision (telemetry).
    pub observer: Option<Observer>,
    /// Whether network `unrestricted` reaches private and shared ranges (an
    /// allowlist reaches them only through an address rule that covers them).
    pub allow_private: bool,
}

impl std::fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayConfig")
            .field("resolvers", &self.resolvers)
            .field("limits", &self.limits)
            .field("max_events", &self.max_events)
            .field("nft", &self.nft)
            .field("allow_private", &self.allow_private)
            .finish_non_exhaustive()
    }
}

impl GatewayConfig {
    /// The defaults on this host, or why allowlists cannot be enforced here: no `nft`
    /// program, or no resolver.
    pub fn detect() -> Result<GatewayConfig, String> {
        let nft = find_nft().ok_or_else(|| {
            "no `nft` program (Debian's package `nftables`) was found on PATH or in /usr/sbin"
                .to_string()
        })?;
        let resolvers = dns::Upstream::system_servers();
        Ok(GatewayConfig {
            resolvers,
            resolve_timeout: Duration::from_secs(3),
            limits: GateLimits::default(),
            max_events: DEFAULT_MAX_EVENTS,
            nft,
            observer: None,
            allow_private: true,
        })
    }

    /// Checks, once, that a gateway can be made here: a namespace with the rules
    /// loaded, its firewall's log bound, and addresses admitted to its set.
    pub fn probe(&self) -> Result<(), String> {
        let hosts = ["probe.invalid".to_string(), "192.0.2.0/24".to_string()];
        let rules =
            EgressRules::compile("network.allowlist", &hosts, &[]).map_err(|e| e.to_string())?;
        let ruleset = firewall::ruleset(&rules, PORTS, &firewall::own_v4());
        let ns = sys::make_namespace(&self.nft, &ruleset, PORTS)
            .map_err(|e| format!("a sandbox's egress namespace could not be made: {e}"))?;
        let fw = firewall::Firewall::new(ns.control, ns.log)
            .map_err(|e| format!("a sandbox's egress firewall could not be bound: {e}"))?;
        let addr = [Ipv4Addr::new(203, 0, 113, 1)];
        fw.admit(&addr, &[], Duration::from_secs(1))
            .and_then(|()| fw.admit(&addr, &addr, Duration::from_secs(1)))
            .map_err(|e| format!("a sandbox's egress firewall did not take an address: {e}"))
    }
}

/// Brings `lo` up in the calling thread's network namespace: for a thread that has
/// just made an empty namespace of its own (network `none`).
pub fn loopback_up() -> io::Result<()> {
    sys::set_flags_up(&sys::datagram_socket()?, b"lo")
}

/// An fd of the calling thread's network namespace, which keeps it alive.
pub fn thread_netns() -> io::Result<OwnedFd> {
    sys::thread_netns()
}

/// `nft` on PATH, or in the system directories PATH often lacks.
pub fn find_nft() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d: PathBuf| d.join("nft"))
        .find(|p| p.is_file())
}

/// Starts the runtime the gateways' servers run on now, rather than when the first
/// gateway opens: for a caller that counts its threads or descriptors before and
/// after.
pub fn start_runtime() {
    let _ = runtime();
}

/// The runtime the gateways' servers run on: two threads of their own, so that
/// neither the actors nor a busy engine delay a sandbox's connections.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("paddock-egress")
            .enable_all()
            .build()
            .expect("the egress runtime starts")
    })
}

/// One sandbox's gateway: its namespace and the servers in it. Dropping it stops the
/// servers and ends their connections; the namespace goes when its last process
/// does.
pub struct Gateway {
    netns: OwnedFd,
    gate: Arc<proxy::Gate>,
    stop: tokio_util::sync::CancellationToken,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("netns", &self.netns)
            .field("rules", &self.gate.rules)
            .finish()
    }
}

impl Gateway {
    /// Makes a namespace for `rules` and starts its servers. Blocking (a thread and
    /// an `nft` run): call it off the async threads.
    pub fn open(rules: EgressRules, cfg: &GatewayConfig) -> io::Result<Gateway> {
        let ruleset = firewall::ruleset(&rules, PORTS, &firewall::own_v4());
        let ns = sys::make_namespace(&cfg.nft, &ruleset, PORTS)?;
        let firewall = firewall::Firewall::new(ns.control, ns.log)?;
        let log_fd = firewall.log_fd()?;
        let lo = |port| SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
        let gate = Arc::new(proxy::Gate {
            rules,
            upstream: dns::Upstream::new(cfg.resolvers.clone(), cfg.resolve_timeout),
            book: Default::default(),
            log: log::EgressLog::new(cfg.max_events),
            totals: Default::default(),
            conns: Arc::new(Semaphore::new(cfg.limits.max_connections)),
            dns_inflight: Arc::new(Semaphore::new(32)),
            limits: cfg.limits.clone(),
            own: vec![lo(PORTS.proxy), lo(PORTS.transparent), lo(PORTS.dns)],
            observer: cfg.observer.clone(),
            firewall,
        });
        let stop = tokio_util::sync::CancellationToken::new();
        let rt = runtime();
        let _enter = rt.enter();
        let proxy_l = tokio::net::TcpListener::from_std(ns.proxy)?;
        let transparent_l = tokio::net::TcpListener::from_std(ns.transparent)?;
        let dns_udp = tokio::net::UdpSocket::from_std(ns.dns_udp)?;
        let dns_tcp = tokio::net::TcpListener::from_std(ns.dns_tcp)?;
        let refusals = sys::watch_readable(log_fd)?;
        let spawn = |f: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>| {
            let stop = stop.clone();
            rt.spawn(async move {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = f => {}
                }
            });
        };
        spawn(Box::pin(proxy::serve_proxy(
            proxy_l,
            gate.clone(),
            stop.clone(),
        )));
        spawn(Box::pin(proxy::serve_transparent(
            transparent_l,
            gate.clone(),
            stop.clone(),
        )));
        spawn(Box::pin(proxy::serve_dns_udp(dns_udp, gate.clone())));
        spawn(Box::pin(proxy::serve_refusals(refusals, gate.clone())));
        spawn(Box::pin(proxy::serve_dns_tcp(
            dns_tcp,
            gate.clone(),
            stop.clone(),
        )));
        Ok(Gateway {
            netns: ns.netns,
            gate,
            stop,
        })
    }

    /// The sandbox's network namespace, for its programs to enter.
    pub fn netns(&self) -> BorrowedFd<'_> {
        self.netns.as_fd()
    }

    /// The variables that point programs at the proxy (both cases, as programs read
    /// either), and keep loopback off it.
    pub fn proxy_env() -> Vec<(String, String)> {
        let url = format!("http://127.0.0.1:{}", PORTS.proxy);
        let mut env = Vec::new();
        for key in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            env.push((key.to_string(), url.clone()));
        }
        for key in ["NO_PROXY", "no_proxy"] {
            env.push((key.to_string(), "localhost,127.0.0.1,::1".to_string()));
        }
        env
    }

    /// The allowlist enforced.
    pub fn rules(&self) -> &EgressRules {
        &self.gate.rules
    }

    /// A mark: [`Gateway::events_since`] gives the decisions made after it.
    pub fn mark(&self) -> u64 {
        self.gate.log.mark()
    }

    /// The decisions made since `mark`, and how many of them the bounded log lost.
    /// Waits up to 200 ms for the connections among them to end, so that their last
    /// bytes are counted. Every connection refused at connect before the call is
    /// among them.
    pub async fn events_since(&self, mark: u64) -> (Vec<EgressEvent>, u64) {
        // The refusals the reader task has not taken yet.
        let _ = self.gate.take_refusals();
        self.gate.log.since(mark, Duration::from_millis(200)).await
    }

    /// Runs `work` (an execution), then sets its result's `egress` to the decisions
    /// made while it ran. The caller makes sure that nothing else runs in the
    /// sandbox meanwhile (a background process's decisions fall to it too).
    pub async fn recording<F>(
        gateway: Option<Arc<Gateway>>,
        work: F,
    ) -> paddock_core::Result<paddock_core::ExecResult>
    where
        F: std::future::Future<Output = paddock_core::Result<paddock_core::ExecResult>>,
    {
        let Some(g) = gateway else {
            return work.await;
        };
        let mark = g.mark();
        let mut result = work.await?;
        let (events, lost) = g.events_since(mark).await;
        result.egress = Some(paddock_core::egress::EgressReport::of(events, lost));
        Ok(result)
    }

    /// Decisions since the gateway opened: allowed, denied, failed.
    pub fn totals(&self) -> (u64, u64, u64) {
        let t = &self.gate.totals;
        (
            t.allowed.load(Ordering::Relaxed),
            t.denied.load(Ordering::Relaxed),
            t.failed.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
