//! A minimal HTTP/1.1 client for talking to a running `paddock serve`: JSON requests,
//! one connection each (`Connection: close`), `Content-Length` or chunked answers.
//! Plain `http://` only: put a TLS proxy in front of a server on another machine.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use serde_json::Value;

/// How long connecting, and each read or write, may take.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// A server base URL, parsed.
#[derive(Debug, Clone)]
pub(crate) struct Server {
    host: String,
    port: u16,
    api_key: Option<String>,
}

impl Server {
    /// Parses `http://HOST[:PORT]` (a trailing `/` is fine).
    pub(crate) fn parse(url: &str, api_key: Option<String>) -> Result<Server, String> {
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            format!("`{url}` is not an http:// URL (the server speaks plain HTTP; put TLS in front of it)")
        })?;
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') {
            return Err(format!("`{url}` must be just http://HOST:PORT"));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
                let port = p
                    .parse::<u16>()
                    .map_err(|_| format!("`{p}` in `{url}` is not a port"))?;
                (h.to_string(), port)
            }
            _ => (authority.to_string(), 80),
        };
        Ok(Server {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port,
            api_key,
        })
    }

    /// `host:port` as written in URLs.
    pub(crate) fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Sends `method path` with an optional JSON body; the status and the JSON answer.
    pub(crate) fn json(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), String> {
        let addr = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| format!("resolving {}: {e}", self.authority()))?
            .next()
            .ok_or_else(|| format!("{} resolves to nothing", self.authority()))?;
        let mut stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT).map_err(|e| {
            format!(
                "connecting to {}: {e} (is `paddock serve` running?)",
                self.authority()
            )
        })?;
        stream
            .set_read_timeout(Some(IO_TIMEOUT))
            .and_then(|_| stream.set_write_timeout(Some(IO_TIMEOUT)))
            .map_err(|e| e.to_string())?;
        let payload = body.map(|b| b.to_string()).unwrap_or_default();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAccept: application/json\r\n",
            self.authority()
        );
        if let Some(key) = &self.api_key {
            head.push_str(&format!("Authorization: Bearer {key}\r\n"));
        }
        if body.is_some() {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                payload.len()
            ));
        }
        head.push_str("\r\n");
        stream
            .write_all(head.as_bytes())
            .and_then(|_| stream.write_all(payload.as_bytes()))
            .map_err(|e| format!("sending to {}: {e}", self.authority()))?;
        let mut raw = Vec::new();
        stream
            .take(16 << 20)
            .read_to_end(&mut raw)
            .map_err(|e| format!("reading from {}: {e}", self.authority()))?;
        parse_response(&raw)
    }
}

fn parse_response(raw: &[u8]) -> Result<(u16, Value), String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the server's answer has no header end")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let mut body = &raw[split + 4..];
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {:?}", head.lines().next()))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let mut dechunked = Vec::new();
    if chunked {
        loop {
            let end = body
                .windows(2)
                .position(|w| w == b"\r\n")
                .ok_or("a chunk size line has no end")?;
            let size = usize::from_str_radix(
                String::from_utf8_lossy(&body[..end])
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .trim(),
                16,
            )
            .map_err(|_| "a chunk size is not hexadecimal")?;
            body = &body[end + 2..];
            if size == 0 {
                break;
            }
            if body.len() < size.saturating_add(2) {
                return Err("a chunk was cut short".into());
            }
            dechunked.extend_from_slice(&body[..size]);
            body = &body[size + 2..];
        }
        body = &dechunked;
    }
    let value = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(body).map_err(|e| {
            format!("the server answered {status} with something that is not JSON ({e})")
        })?
    };
    Ok((status, value))
}

/// The error message of an error answer (`{"error": {"code", "message"}}`).
pub(crate) fn error_text(status: u16, body: &Value) -> String {
    match (
        body["error"]["code"].as_str(),
        body["error"]["message"].as_str(),
    ) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        _ => format!("the server answered {status}: {body}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_or_say_what_is_wrong() {
        let s = Server::parse("http://127.0.0.1:7878/", None).unwrap();
        assert_eq!((s.host.as_str(), s.port), ("127.0.0.1", 7878));
        let s = Server::parse("http://[::1]:9000", None).unwrap();
        assert_eq!(
            (s.host.as_str(), s.port, s.authority()),
            ("::1", 9000, "[::1]:9000".to_string())
        );
        assert_eq!(Server::parse("http://localhost", None).unwrap().port, 80);
        assert!(Server::parse("https://x:1", None)
            .unwrap_err()
            .contains("http://"));
        assert!(Server::parse("http://x:port", None)
            .unwrap_err()
            .contains("not a port"));
        assert!(Server::parse("http://x:1/v1", None).is_err());
    }

    #[test]
    fn answers_parse_with_length_or_chunks() {
        let (s, v) =
            parse_response(b"HTTP/1.1 201 Created\r\nContent-Length: 8\r\n\r\n{\"a\":1}\n")
                .unwrap();
        assert_eq!((s, v["a"].as_i64()), (201, Some(1)));
        let (s, v) = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"b\"\r\n3\r\n:2}\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((s, v["b"].as_i64()), (200, Some(2)));
        assert_eq!(
            parse_response(b"HTTP/1.1 204 No Content\r\n\r\n")
                .unwrap()
                .1,
            Value::Null
        );
        assert!(parse_response(b"garbage").is_err());
        let e = error_text(
            404,
            &serde_json::json!({"error": {"code": "NOT_FOUND", "message": "no"}}),
        );
        assert_eq!(e, "NOT_FOUND: no");
    }
}
