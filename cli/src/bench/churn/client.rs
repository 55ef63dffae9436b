//! One churn client: open a sandbox, run its first command, destroy it — through the
//! `Paddock` facade in this process, or through the HTTP API (`paddock serve`'s,
//! started in this process on a loopback port) over one keep-alive connection.

use std::net::SocketAddr;

use paddock_core::{EngineName, ExecRequest, Language, Program, SandboxSpec};
use paddock_pool::{Paddock, SandboxHandle};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// How the clients reach the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Via {
    /// The `Paddock` facade, in this process.
    Facade,
    /// The HTTP API, served by this process on a loopback port.
    Http,
}

impl Via {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Via::Facade => "facade",
            Via::Http => "http",
        }
    }
}

/// What each cycle's first command is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub(crate) enum First {
    /// The command `true`.
    #[default]
    Command,
    /// The Python snippet `print(1)` (on a warm runner where the engine has one).
    Python,
}

impl First {
    pub(crate) fn name(self) -> &'static str {
        match self {
            First::Command => "command",
            First::Python => "python",
        }
    }
}

/// The first command: `true` or `print(1)`, or on the isolate engine (which runs
/// JavaScript only) the snippet `0`.
pub(super) fn first_program(engine: &EngineName, first: First) -> Program {
    if *engine == EngineName::ISOLATE {
        Program::code(Language::Javascript, "0")
    } else if first == First::Python {
        Program::code(Language::Python, "print(1)")
    } else {
        Program::command(["true"])
    }
}

fn first_body(engine: &EngineName, first: First) -> &'static str {
    if *engine == EngineName::ISOLATE {
        r#"{"program":{"language":"javascript","code":"0"}}"#
    } else if first == First::Python {
        r#"{"program":{"language":"python","code":"print(1)"}}"#
    } else {
        r#"{"program":{"command":["true"]}}"#
    }
}

/// An open sandbox, as the client holds it.
pub(super) enum Opened {
    Handle(Box<SandboxHandle>),
    Id(String),
}

/// A step's failure: what went wrong, and how long to wait before the next try.
pub(super) struct Failed {
    pub(super) message: String,
    pub(super) retry_after_ms: Option<u64>,
}

impl Failed {
    fn new(message: String) -> Failed {
        Failed {
            message,
            retry_after_ms: None,
        }
    }
}

impl From<paddock_core::Error> for Failed {
    fn from(e: paddock_core::Error) -> Failed {
        Failed {
            retry_after_ms: e.retry_after_ms,
            message: e.to_string(),
        }
    }
}

/// A client of one engine.
pub(super) enum Client {
    Facade {
        paddock: Paddock,
        engine: EngineName,
        first: First,
    },
    Http {
        conn: BufReader<TcpStream>,
        host: String,
        engine: EngineName,
        first: First,
    },
}

impl Client {
    pub(super) async fn connect(
        via: Via,
        paddock: &Paddock,
        server: Option<SocketAddr>,
        engine: &EngineName,
        first: First,
    ) -> Result<Client, String> {
        match (via, server) {
            (Via::Http, Some(addr)) => {
                let stream = TcpStream::connect(addr)
                    .await
                    .map_err(|e| format!("connecting to {addr}: {e}"))?;
                let _ = stream.set_nodelay(true);
                Ok(Client::Http {
                    conn: BufReader::new(stream),
                    host: addr.to_string(),
                    engine: engine.clone(),
                    first,
                })
            }
            _ => Ok(Client::Facade {
                paddock: paddock.clone(),
                engine: engine.clone(),
                first,
            }),
        }
    }

    pub(super) async fn open(&mut self) -> Result<Opened, Failed> {
        match self {
            Client::Facade {
                paddock, engine, ..
            } => Ok(Opened::Handle(Box::new(
                paddock
                    .open_sandbox(SandboxSpec::default(), Some(engine.clone()))
                    .await?,
            ))),
            Client::Http {
                conn, host, engine, ..
            } => {
                let body = format!(r#"{{"engine":"{}"}}"#, engine.as_str());
                let (status, body) = request(conn, host, "POST", "/v1/sandboxes", &body).await?;
                let v = answer(status, &body, &[200, 201])?;
                match v["id"].as_str() {
                    Some(id) => Ok(Opened::Id(id.to_string())),
                    None => Err(Failed::new(format!("no sandbox id in {v}"))),
                }
            }
        }
    }

    pub(super) async fn first(&mut self, sandbox: &Opened) -> Result<(), Failed> {
        match (self, sandbox) {
            (Client::Facade { engine, first, .. }, Opened::Handle(h)) => {
                let r = h
                    .exec(ExecRequest::new(first_program(engine, *first)))
                    .await?;
                if r.is_success() {
                    Ok(())
                } else {
                    Err(Failed::new(format!(
                        "the first command gave {:?}",
                        r.outcome
                    )))
                }
            }
            (
                Client::Http {
                    conn,
                    host,
                    engine,
                    first,
                },
                Opened::Id(id),
            ) => {
                let path = format!("/v1/sandboxes/{id}/exec");
                let body = first_body(engine, *first);
                let (status, body) = request(conn, host, "POST", &path, body).await?;
                let v = answer(status, &body, &[200])?;
                if v["outcome"] == "completed" && v["exit_code"].as_i64().unwrap_or(0) == 0 {
                    Ok(())
                } else {
                    Err(Failed::new(format!("the first command gave {v}")))
                }
            }
            _ => Err(Failed::new("a sandbox of another kind of client".into())),
        }
    }

    pub(super) async fn destroy(&mut self, sandbox: Opened) -> Result<(), Failed> {
        match (self, sandbox) {
            (Client::Facade { .. }, Opened::Handle(h)) => Ok(h.destroy().await?),
            (Client::Http { conn, host, .. }, Opened::Id(id)) => {
                let path = format!("/v1/sandboxes/{id}");
                let (status, body) = request(conn, host, "DELETE", &path, "").await?;
                answer(status, &body, &[204]).map(drop)
            }
            _ => Err(Failed::new("a sandbox of another kind of client".into())),
        }
    }
}

/// The answer's JSON when its status is one of `ok`, else the failure it reports.
fn answer(status: u16, body: &[u8], ok: &[u16]) -> Result<serde_json::Value, Failed> {
    let v: serde_json::Value = if body.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(body)
            .map_err(|e| Failed::new(format!("HTTP {status}: not JSON ({e})")))?
    };
    if ok.contains(&status) {
        return Ok(v);
    }
    Err(Failed {
        message: format!("HTTP {status}: {v}"),
        retry_after_ms: v["error"]["retry_after_ms"].as_u64(),
    })
}

impl From<std::io::Error> for Failed {
    fn from(e: std::io::Error) -> Failed {
        Failed::new(format!("HTTP: {e}"))
    }
}

/// One request on a keep-alive connection: the status and the body (by
/// `Content-Length`; the API answers these routes with one).
async fn request(
    conn: &mut BufReader<TcpStream>,
    host: &str,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, Vec<u8>)> {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.get_mut().write_all(req.as_bytes()).await?;
    let mut line = String::new();
    conn.read_line(&mut line).await?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line `{line}`")))?;
    let mut length = 0usize;
    loop {
        line.clear();
        if conn.read_line(&mut line).await? == 0 {
            return Err(std::io::Error::other("the server closed the connection"));
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((_, v)) = l
            .split_once(':')
            .filter(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body).await?;
    Ok((status, body))
}
