//! The transparent TCP path: connections the namespace redirects here, screened by
//! their address and by what their first bytes name, then dialled to their original
//! destination.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use paddock_core::egress::{EgressVerdict, EgressVia};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::dial::dial;
use super::relay::pump;
use super::{screen, Gate};
use crate::log::{event, Counters};
use crate::sniff::{self, Sniffed};

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
pub(super) fn reset(stream: TcpStream) {
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
