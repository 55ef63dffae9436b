//! The DNS stub over UDP and TCP: each answer is recorded, and the addresses it
//! hands out for allowed names are admitted by the namespace's firewall first.

use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use paddock_core::egress::{EgressVerdict, EgressVia};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio_util::sync::CancellationToken;

use super::transparent::reset;
use super::Gate;
use crate::dns;
use crate::log::event;

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
