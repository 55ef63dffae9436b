//! A small HTTP/1.1 client over tokio's `TcpStream`: one request per connection
//! (`Connection: close`), `Content-Length`, chunked and read-to-close bodies, and a
//! reader that yields NDJSON lines as they arrive, each with its arrival `Instant`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// No single read or write of a test may take longer than this.
pub const IO_TIMEOUT: Duration = Duration::from_secs(40);

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(IO_TIMEOUT, f)
        .await
        .unwrap_or_else(|_| panic!("{what} took longer than {IO_TIMEOUT:?}"))
}

/// A request to send.
#[derive(Debug, Clone)]
pub struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    pub fn new(method: &str, path: &str) -> Request {
        Request {
            method: method.into(),
            path: path.into(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    pub fn get(path: &str) -> Request {
        Request::new("GET", path)
    }

    pub fn post(path: &str) -> Request {
        Request::new("POST", path)
    }

    pub fn delete(path: &str) -> Request {
        Request::new("DELETE", path)
    }

    pub fn put(path: &str) -> Request {
        Request::new("PUT", path)
    }

    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = body.into();
        self
    }

    pub fn json(self, v: &Value) -> Request {
        self.header("Content-Type", "application/json")
            .body(serde_json::to_vec(v).unwrap())
    }

    /// Connects and writes the request. A write the server cut short (it may answer
    /// and close before reading a body it refuses) is not an error: the answer is
    /// read next.
    async fn write(&self, addr: SocketAddr) -> TcpStream {
        self.write_with_length(addr, self.body.len()).await
    }

    /// Connects and writes the head, announcing `length` body bytes, and the body.
    async fn write_with_length(&self, addr: SocketAddr, length: usize) -> TcpStream {
        let mut stream = within("connecting", TcpStream::connect(addr))
            .await
            .expect("connect to the test server");
        let mut head = format!(
            "{} {} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.method, self.path, length
        );
        for (k, v) in &self.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let mut data = head.into_bytes();
        data.extend_from_slice(&self.body);
        let _ = within("writing the request", stream.write_all(&data)).await;
        let _ = stream.flush().await;
        stream
    }

    /// Sends the head and the first `split` bytes of the body; the rest goes with
    /// [`Partial::finish`].
    pub async fn send_partial(&self, addr: SocketAddr, split: usize) -> Partial {
        let first = Request {
            body: self.body[..split].to_vec(),
            ..self.clone()
        };
        let stream = first.write_with_length(addr, self.body.len()).await;
        Partial {
            request: self.clone(),
            split,
            stream,
        }
    }

    /// Sends the request and reads the whole answer.
    pub async fn send(&self, addr: SocketAddr) -> Response {
        self.stream(addr).await.into_response().await
    }

    /// Sends the request and returns once the status line and headers are read; the
    /// body is read piece by piece from the result.
    pub async fn stream(&self, addr: SocketAddr) -> Streaming {
        let stream = self.write(addr).await;
        self.read_answer(stream).await
    }

    /// Reads the status line and headers of the answer to this request.
    async fn read_answer(&self, stream: TcpStream) -> Streaming {
        let mut reader = BufReader::new(stream);
        let status_line = read_crlf_line(&mut reader).await;
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        assert!(
            version.starts_with("HTTP/1."),
            "bad status line {status_line:?}"
        );
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        let mut headers = Vec::new();
        loop {
            let line = read_crlf_line(&mut reader).await;
            if line.is_empty() {
                break;
            }
            let (k, v) = line
                .split_once(':')
                .unwrap_or_else(|| panic!("bad header line {line:?}"));
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        let find = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let framing = if find("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            Framing::Chunked
        } else if let Some(n) = find("content-length") {
            Framing::Length(n.parse().expect("numeric Content-Length"))
        } else if status == 204 || status == 304 || self.method == "HEAD" {
            Framing::Length(0)
        } else {
            Framing::UntilClose
        };
        Streaming {
            status,
            headers,
            reader,
            framing,
            pending: Vec::new(),
            done: false,
        }
    }
}

async fn read_crlf_line(reader: &mut BufReader<TcpStream>) -> String {
    let mut line = Vec::new();
    let n = within("reading a line", reader.read_until(b'\n', &mut line))
        .await
        .expect("read from the test server");
    assert!(n > 0, "the server closed the connection mid-head");
    assert!(line.ends_with(b"\r\n"), "line without CRLF: {line:?}");
    line.truncate(line.len() - 2);
    String::from_utf8(line).expect("ASCII head")
}

#[derive(Debug)]
enum Framing {
    Chunked,
    Length(usize),
    UntilClose,
}

/// An answer whose body is read as it arrives.
#[derive(Debug)]
pub struct Streaming {
    pub status: u16,
    /// Lower-case names.
    pub headers: Vec<(String, String)>,
    reader: BufReader<TcpStream>,
    framing: Framing,
    pending: Vec<u8>,
    done: bool,
}

impl Streaming {
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// The next piece of the body as it arrives, `None` at its end.
    pub async fn next_bytes(&mut self) -> Option<Vec<u8>> {
        self.next_piece().await
    }

    /// The next piece of the body (a chunk when chunked), `None` at its end.
    async fn next_piece(&mut self) -> Option<Vec<u8>> {
        if self.done {
            return None;
        }
        match &mut self.framing {
            Framing::Chunked => {
                let size_line = read_crlf_line(&mut self.reader).await;
                let hex = size_line.split(';').next().unwrap_or_default().trim();
                let size = usize::from_str_radix(hex, 16)
                    .unwrap_or_else(|_| panic!("bad chunk size line {size_line:?}"));
                if size == 0 {
                    // Trailers, then the empty line.
                    while !read_crlf_line(&mut self.reader).await.is_empty() {}
                    self.done = true;
                    return None;
                }
                let mut data = vec![0; size];
                within("reading a chunk", self.reader.read_exact(&mut data))
                    .await
                    .expect("a whole chunk");
                let end = read_crlf_line(&mut self.reader).await;
                assert!(end.is_empty(), "chunk not followed by CRLF: {end:?}");
                Some(data)
            }
            Framing::Length(left) => {
                if *left == 0 {
                    self.done = true;
                    return None;
                }
                let mut buf = vec![0; (*left).min(64 << 10)];
                let n = within("reading the body", self.reader.read(&mut buf))
                    .await
                    .expect("read the body");
                assert!(n > 0, "the server closed with {left} body bytes missing");
                *left -= n;
                buf.truncate(n);
                Some(buf)
            }
            Framing::UntilClose => {
                let mut buf = vec![0; 64 << 10];
                let n = within("reading the body", self.reader.read(&mut buf))
                    .await
                    .expect("read the body");
                if n == 0 {
                    self.done = true;
                    return None;
                }
                buf.truncate(n);
                Some(buf)
            }
        }
    }

    /// The whole answer.
    pub async fn into_response(self) -> Response {
        let status = self.status;
        let headers = self.headers.clone();
        let body = self.read_to_end().await;
        Response {
            status,
            headers,
            body,
        }
    }

    /// The rest of the body.
    pub async fn read_to_end(mut self) -> Vec<u8> {
        let mut body = std::mem::take(&mut self.pending);
        while let Some(piece) = self.next_piece().await {
            body.extend_from_slice(&piece);
        }
        body
    }

    /// The next NDJSON line and when its last byte arrived; `None` at the end of the
    /// body. Panics on a line that is not JSON or a body that ends mid-line.
    pub async fn next_line(&mut self) -> Option<(Instant, Value)> {
        let mut arrived = Instant::now();
        loop {
            if let Some(pos) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=pos).collect();
                let v = serde_json::from_slice(&line).unwrap_or_else(|e| {
                    panic!("not a JSON line ({e}): {}", String::from_utf8_lossy(&line))
                });
                return Some((arrived, v));
            }
            match self.next_piece().await {
                Some(piece) => {
                    arrived = Instant::now();
                    self.pending.extend_from_slice(&piece);
                }
                None => {
                    assert!(
                        self.pending.is_empty(),
                        "the body ended mid-line: {}",
                        String::from_utf8_lossy(&self.pending)
                    );
                    return None;
                }
            }
        }
    }

    /// Every remaining NDJSON line.
    pub async fn lines(mut self) -> Vec<(Instant, Value)> {
        let mut out = Vec::new();
        while let Some(line) = self.next_line().await {
            out.push(line);
        }
        out
    }
}

/// A request whose body is only partly sent.
#[derive(Debug)]
pub struct Partial {
    request: Request,
    split: usize,
    stream: TcpStream,
}

impl Partial {
    /// Reads the whole answer without sending the rest of the body.
    pub async fn answer(self) -> Response {
        self.request
            .read_answer(self.stream)
            .await
            .into_response()
            .await
    }

    /// Sends the rest of the body and reads the whole answer.
    pub async fn finish(mut self) -> Response {
        let rest = &self.request.body[self.split..];
        within("writing the rest", self.stream.write_all(rest))
            .await
            .expect("write the rest of the body");
        self.request
            .read_answer(self.stream)
            .await
            .into_response()
            .await
    }
}

/// A whole answer.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Lower-case names.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    let name = name.to_ascii_lowercase();
    headers
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.as_str())
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (panics with the body when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {}: body is not JSON ({e}): {}",
                self.status,
                self.text()
            )
        })
    }

    /// Asserts the status and returns the JSON body.
    #[track_caller]
    pub fn expect(&self, status: u16) -> Value {
        assert_eq!(
            self.status,
            status,
            "unexpected status; body: {}",
            self.text()
        );
        self.json()
    }

    /// Asserts an error answer (`{"error":{"code","message"}}`) with this status and
    /// code; returns the message.
    #[track_caller]
    pub fn expect_error(&self, status: u16, code: &str) -> String {
        let v = self.expect(status);
        let err = &v["error"];
        assert_eq!(err["code"], code, "body: {v}");
        let message = err["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no message: {v}"));
        assert!(!message.is_empty(), "empty message: {v}");
        message.to_string()
    }
}

/// `GET path`.
pub async fn get(addr: SocketAddr, path: &str) -> Response {
    Request::get(path).send(addr).await
}

/// `POST path` with a JSON body.
pub async fn post_json(addr: SocketAddr, path: &str, body: &Value) -> Response {
    Request::post(path).json(body).send(addr).await
}

/// `DELETE path`.
pub async fn delete(addr: SocketAddr, path: &str) -> Response {
    Request::delete(path).send(addr).await
}
