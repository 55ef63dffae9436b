//! The HTTP proxy: `CONNECT` tunnels and absolute-form plain requests, each
//! admitted by the allowlist before it is dialled.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use paddock_core::egress::{EgressVerdict, EgressVia};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::dial::admit;
use super::relay::pump;
use super::Gate;
use crate::log::{event, Counters};
use crate::sniff::{self, HttpHead};

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
