//! The first bytes of a connection, read for the name it is meant for: the TLS
//! ClientHello's server name (SNI), or an HTTP request's `Host`. These parse bytes a
//! sandbox sent, so they are bounded, never panic, and are fuzzed.

use paddock_core::egress::normalize_name;

/// The most bytes read from a connection before its name must be known.
pub const MAX_SNIFF: usize = 16 * 1024;

/// What the first bytes of a connection say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniffed {
    /// Not enough bytes yet.
    NeedMore,
    /// A TLS ClientHello naming this server (lower case).
    Tls(String),
    /// A TLS ClientHello without a server name.
    TlsNoName,
    /// An HTTP request for this host (lower case, without a port).
    Http(String),
    /// An HTTP request without a usable `Host`.
    HttpNoHost,
    /// Neither TLS nor HTTP, or malformed.
    Unknown,
}

/// Reads `buf` (everything received so far) as the start of a TLS or HTTP
/// connection.
pub fn sniff(buf: &[u8]) -> Sniffed {
    match buf.first() {
        None => Sniffed::NeedMore,
        Some(0x16) => tls_server_name(buf),
        Some(b) if b.is_ascii_uppercase() => match http_host(buf) {
            HttpHead::NeedMore => Sniffed::NeedMore,
            HttpHead::Request { host: Some(h), .. } => Sniffed::Http(h),
            HttpHead::Request { host: None, .. } => Sniffed::HttpNoHost,
            HttpHead::Bad => Sniffed::Unknown,
        },
        Some(_) => Sniffed::Unknown,
    }
}

/// A cursor over untrusted bytes whose reads fail instead of panicking.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]))
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(n)
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(n)
    }
}

/// The server name of a TLS ClientHello in `buf`, which may span several handshake
/// records.
fn tls_server_name(buf: &[u8]) -> Sniffed {
    // Gather the handshake bytes from the records received so far.
    let mut handshake = Vec::new();
    let mut rest = buf;
    loop {
        if rest.len() < 5 {
            break;
        }
        if rest[0] != 0x16 || rest[1] != 3 {
            return Sniffed::Unknown;
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if len == 0 || len > 16 * 1024 + 2048 {
            return Sniffed::Unknown;
        }
        if rest.len() < 5 + len {
            handshake.extend_from_slice(&rest[5..]);
            break;
        }
        handshake.extend_from_slice(&rest[5..5 + len]);
        rest = &rest[5 + len..];
        // Once the message's whole length is in, stop at the record boundary.
        if handshake.len() >= 4 {
            let want = 4
                + ((usize::from(handshake[1]) << 16)
                    | (usize::from(handshake[2]) << 8)
                    | usize::from(handshake[3]));
            if handshake.len() >= want {
                break;
            }
        }
    }
    let mut r = Reader { buf: &handshake };
    let (Some(kind), Some(len)) = (r.u8(), r.u24()) else {
        return if buf.len() >= MAX_SNIFF {
            Sniffed::Unknown
        } else {
            Sniffed::NeedMore
        };
    };
    if kind != 1 || len > MAX_SNIFF {
        return Sniffed::Unknown;
    }
    let Some(body) = r.take(len) else {
        return Sniffed::NeedMore;
    };
    client_hello_name(body).unwrap_or(Sniffed::Unknown)
}

/// The server name in a ClientHello's body; `None` when it is malformed.
fn client_hello_name(body: &[u8]) -> Option<Sniffed> {
    let mut r = Reader { buf: body };
    r.take(2 + 32)?; // legacy version, random
    r.vec8()?; // session id
    r.vec16()?; // cipher suites
    r.vec8()?; // compression methods
    if r.buf.is_empty() {
        return Some(Sniffed::TlsNoName);
    }
    let mut exts = Reader { buf: r.vec16()? };
    while !exts.buf.is_empty() {
        let kind = exts.u16()?;
        let data = exts.vec16()?;
        if kind != 0 {
            continue;
        }
        let mut list = Reader { buf: data };
        let mut names = Reader { buf: list.vec16()? };
        while !names.buf.is_empty() {
            let name_type = names.u8()?;
            let name = names.vec16()?;
            if name_type == 0 {
                let name = std::str::from_utf8(name).ok()?;
                return Some(normalize_name(name).map_or(Sniffed::Unknown, Sniffed::Tls));
            }
        }
        return Some(Sniffed::TlsNoName);
    }
    Some(Sniffed::TlsNoName)
}

/// An HTTP request head, as far as the gateway needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpHead {
    /// Not enough bytes yet.
    NeedMore,
    /// A whole request head.
    Request {
        /// The method.
        method: String,
        /// The request target as sent (`/path`, `http://host/path`, `host:443`).
        target: String,
        /// The `Host` header's host, lower case and without its port.
        host: Option<String>,
        /// The head's length in bytes.
        head_len: usize,
    },
    /// Not an HTTP/1 request head, or longer than [`MAX_SNIFF`].
    Bad,
}

/// Parses the request head at the start of `buf`.
pub fn http_host(buf: &[u8]) -> HttpHead {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) if buf.len() < MAX_SNIFF => HttpHead::NeedMore,
        Ok(httparse::Status::Partial) | Err(_) => HttpHead::Bad,
        Ok(httparse::Status::Complete(head_len)) => {
            let host = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("host"))
                .and_then(|h| std::str::from_utf8(h.value).ok())
                .and_then(|v| split_host_port(v.trim()).map(|(h, _)| h));
            HttpHead::Request {
                method: req.method.unwrap_or_default().to_string(),
                target: req.path.unwrap_or_default().to_string(),
                host,
                head_len,
            }
        }
    }
}

/// Splits `host[:port]` (or `[v6]:port`), checking and lower-casing the host: a name
/// by [`normalize_name`], or an address literal.
pub fn split_host_port(authority: &str) -> Option<(String, Option<u16>)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        h.parse::<std::net::Ipv6Addr>().ok()?;
        (h.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    let port = match port {
        Some(p) if !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => {
            match p.parse::<u16>() {
                Ok(0) | Err(_) => return None,
                Ok(n) => Some(n),
            }
        }
        Some(_) => return None,
        None => None,
    };
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Some((host, port));
    }
    Some((normalize_name(&host)?, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello as rustls or curl sends it, naming `name` (or none).
    fn client_hello(name: Option<&str>) -> Vec<u8> {
        let mut exts = Vec::new();
        // supported_versions, to have an extension before SNI.
        exts.extend_from_slice(&[0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]);
        if let Some(name) = name {
            let n = name.as_bytes();
            let mut sni = Vec::new();
            sni.extend_from_slice(&((n.len() + 3) as u16).to_be_bytes());
            sni.push(0);
            sni.extend_from_slice(&(n.len() as u16).to_be_bytes());
            sni.extend_from_slice(n);
            exts.extend_from_slice(&[0x00, 0x00]);
            exts.extend_from_slice(&(sni.len() as u16).to_be_bytes());
            exts.extend_from_slice(&sni);
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0);
        body.extend_from_slice(&[0, 2, 0x13, 0x01]);
        body.extend_from_slice(&[1, 0]);
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let mut hs = vec![1];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn a_client_hello_names_its_server_even_when_it_arrives_in_pieces() {
        let hello = client_hello(Some("Allowed.Test"));
        assert_eq!(sniff(&hello), Sniffed::Tls("allowed.test".into()));
        for cut in 0..hello.len() {
            assert_eq!(sniff(&hello[..cut]), Sniffed::NeedMore, "cut at {cut}");
        }
        assert_eq!(sniff(&client_hello(None)), Sniffed::TlsNoName);
        // Split over two records.
        let hs = &hello[5..];
        let (a, b) = hs.split_at(20);
        let mut two = vec![0x16, 3, 1];
        two.extend_from_slice(&(a.len() as u16).to_be_bytes());
        two.extend_from_slice(a);
        two.extend_from_slice(&[0x16, 3, 1]);
        two.extend_from_slice(&(b.len() as u16).to_be_bytes());
        two.extend_from_slice(b);
        assert_eq!(sniff(&two), Sniffed::Tls("allowed.test".into()));
    }

    #[test]
    fn malformed_hellos_are_unknown_not_panics() {
        let hello = client_hello(Some("a.test"));
        let mut bad = hello.clone();
        bad[1] = 9;
        assert_eq!(sniff(&bad), Sniffed::Unknown);
        // Every single-byte corruption answers without a panic.
        for i in 0..hello.len() {
            for v in [0u8, 0xff, 0x7f] {
                let mut h = hello.clone();
                h[i] = v;
                let _ = sniff(&h);
            }
        }
        let mut weird = client_hello(Some("bad name.test"));
        assert_eq!(sniff(&weird), Sniffed::Unknown);
        weird.truncate(3);
        assert_eq!(sniff(&weird), Sniffed::NeedMore);
    }

    #[test]
    fn http_requests_name_their_host() {
        let req = b"GET / HTTP/1.1\r\nHost: Allowed.Test:8080\r\nUser-Agent: x\r\n\r\n";
        assert_eq!(sniff(req), Sniffed::Http("allowed.test".into()));
        assert_eq!(sniff(&req[..20]), Sniffed::NeedMore);
        assert_eq!(sniff(b"GET / HTTP/1.1\r\n\r\n"), Sniffed::HttpNoHost);
        assert_eq!(sniff(b"SSH-2.0-OpenSSH_9.2\r\n"), Sniffed::Unknown);
        assert_eq!(sniff(b"\x00\x01"), Sniffed::Unknown);
        let big = [b'A'; MAX_SNIFF + 1];
        assert_eq!(sniff(&big), Sniffed::Unknown);
        match http_host(b"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n") {
            HttpHead::Request {
                method,
                target,
                host,
                head_len,
            } => {
                assert_eq!(method, "CONNECT");
                assert_eq!(target, "allowed.test:443");
                assert_eq!(host.as_deref(), Some("allowed.test"));
                assert_eq!(head_len, 61);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn authorities_are_split_and_checked() {
        assert_eq!(
            split_host_port("A.test:443"),
            Some(("a.test".into(), Some(443)))
        );
        assert_eq!(split_host_port("a.test"), Some(("a.test".into(), None)));
        assert_eq!(split_host_port("[::1]:80"), Some(("::1".into(), Some(80))));
        assert_eq!(
            split_host_port("10.0.0.1:8080"),
            Some(("10.0.0.1".into(), Some(8080)))
        );
        for bad in [
            "a.test:",
            "a.test:0",
            "a.test:99999",
            "a.test:1x",
            "[zz]:1",
            "a b:1",
            ":80",
            "[::1]x",
        ] {
            assert_eq!(split_host_port(bad), None, "{bad}");
        }
    }
}
