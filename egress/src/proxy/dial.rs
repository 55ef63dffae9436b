//! Admitting a target and dialling it: the allowlist's check of a name and port,
//! the resolution, and the refusal of addresses no sandbox reaches.

use std::net::{IpAddr, SocketAddr};

use paddock_core::egress::{EgressRules, EgressVerdict};
use tokio::net::TcpStream;

use super::Gate;
use crate::dns::Resolved;

/// Why a target was not dialled.
pub(super) struct Refusal {
    pub(super) verdict: EgressVerdict,
    pub(super) reason: String,
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
pub(super) async fn admit(
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
pub(super) async fn dial(
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
