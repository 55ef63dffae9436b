//! Files: `GET /files` and `POST /files` of E2B's agent, and the
//! `filesystem.Filesystem` service (Stat, ListDir, MakeDir, Move, Remove).
//!
//! Downloads and uploads go through the Paddock files API, so they reach the
//! sandbox's workdir: paths under its home (`/home/user`). The filesystem service
//! works on the whole file system as the sandbox's programs see it: it runs `find`,
//! `mkdir`, `mv` and `rm` inside the sandbox, with the paths passed as arguments
//! (never spliced into a script), checked and audited as the sandbox's own commands.

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::StreamExt;
use paddock_core::{ExecRequest, Program};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::connect::{self, Code, ConnectError};
use crate::registry::Sbx;

/// The deepest `ListDir` walks.
const MAX_DEPTH: u32 = 32;
/// Most entries one `ListDir` answers.
const MAX_ENTRIES: usize = 10_000;
/// Most files one upload may hold.
const MAX_PARTS: usize = 1000;
/// How long a filesystem command may take.
const FS_TIMEOUT_MS: u64 = 30_000;

/// An error of the agent's plain HTTP routes: a status and `{"code", "message"}`.
pub(crate) fn http_error(status: StatusCode, message: impl Into<String>) -> HttpResponse {
    HttpResponse::build(status).json(json!({ "code": status.as_u16(), "message": message.into() }))
}

fn http_from(e: paddock_core::Error) -> HttpResponse {
    use paddock_core::ErrorCode as C;
    let status = match e.code {
        C::NotFound => StatusCode::NOT_FOUND,
        C::InvalidOptions | C::PathEscape => StatusCode::BAD_REQUEST,
        C::LimitsExceeded => StatusCode::PAYLOAD_TOO_LARGE,
        C::RateLimited | C::PoolExhausted => StatusCode::TOO_MANY_REQUESTS,
        C::EngineDisposed => StatusCode::NOT_FOUND,
        C::SandboxPaused => StatusCode::CONFLICT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    http_error(status, format!("{}: {}", e.code.as_str(), e.message))
}

#[derive(Debug, Default, Deserialize)]
struct FileQuery {
    path: Option<String>,
}

/// The workdir path of an E2B path, or an answer for one outside it.
fn in_home(sbx: &Sbx, path: &str) -> Result<String, Box<HttpResponse>> {
    let full = sbx.path(path);
    let home = sbx.home.as_str();
    if full == home || full.starts_with(&format!("{home}/")) {
        Ok(full)
    } else {
        Err(Box::new(http_error(
            StatusCode::BAD_REQUEST,
            format!(
                "`{full}` is outside {home}: this server reads and writes files under {home} only (the sandbox's workdir)"
            ),
        )))
    }
}

/// `GET /files?path=`: the file's bytes.
pub(crate) async fn download(sbx: Arc<Sbx>, req: &HttpRequest) -> HttpResponse {
    let q = match web::Query::<FileQuery>::from_query(req.query_string()) {
        Ok(q) => q.into_inner(),
        Err(e) => return http_error(StatusCode::BAD_REQUEST, format!("query: {e}")),
    };
    let Some(path) = q.path else {
        return http_error(StatusCode::BAD_REQUEST, "give `path`, the file to read");
    };
    let path = match in_home(&sbx, &path) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    match sbx.handle.open_read(&path).await {
        Ok(reader) => HttpResponse::Ok()
            .content_type("application/octet-stream")
            .no_chunking(reader.size)
            .streaming(tokio_util::io::ReaderStream::with_capacity(
                reader.reader,
                64 << 10,
            )),
        Err(e) => http_from(e),
    }
}

/// `POST /files?path=`: multipart uploads, field `file`, each part's file name its
/// path (the query's `path` for a single part). Answers what was written, as
/// `[{name, type, path}]`.
pub(crate) async fn upload(
    sbx: Arc<Sbx>,
    req: &HttpRequest,
    payload: web::Payload,
    max_file: u64,
) -> HttpResponse {
    let q = match web::Query::<FileQuery>::from_query(req.query_string()) {
        Ok(q) => q.into_inner(),
        Err(e) => return http_error(StatusCode::BAD_REQUEST, format!("query: {e}")),
    };
    let ctype = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !ctype.starts_with("multipart/form-data") {
        return http_error(
            StatusCode::BAD_REQUEST,
            format!("Content-Type {ctype:?}: send multipart/form-data with a `file` field"),
        );
    }
    let mut multipart = actix_multipart::Multipart::new(req.headers(), payload);
    let mut written = Vec::new();
    let mut parts = 0usize;
    while let Some(field) = multipart.next().await {
        let mut field = match field {
            Ok(f) => f,
            Err(e) => return http_error(StatusCode::BAD_REQUEST, format!("multipart: {e}")),
        };
        parts += 1;
        if parts > MAX_PARTS {
            return http_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("more than {MAX_PARTS} files in one upload; send them in several"),
            );
        }
        let name = field
            .content_disposition()
            .and_then(|d| d.get_filename().map(String::from));
        let target = match (parts, &q.path, name) {
            (1, Some(p), _) => p.clone(),
            (_, _, Some(n)) if !n.is_empty() => n,
            _ => {
                return http_error(
                    StatusCode::BAD_REQUEST,
                    "a part without a file name: name each file by its path",
                )
            }
        };
        let path = match in_home(&sbx, &target) {
            Ok(p) => p,
            Err(r) => return *r,
        };
        // Streamed into the file through a small bounded channel: an upload holds a
        // few chunks of memory, whatever its size.
        // Only a part read to its end is kept: a request dropped midway ends the
        // source with an error, not as a shorter file.
        let (feed, source) = paddock_pool::http::upload_source(4);
        let pump = async move {
            while let Some(chunk) = field.next().await {
                match chunk {
                    Ok(c) => {
                        if !feed.send(c).await {
                            return;
                        }
                    }
                    Err(e) => {
                        return feed
                            .fail(std::io::Error::other(format!("multipart: {e}")))
                            .await
                    }
                }
            }
            feed.finish().await;
        };
        let (written_bytes, ()) =
            futures_util::join!(sbx.handle.write_from(&path, source, max_file), pump);
        if let Err(e) = written_bytes {
            return http_from(e);
        }
        let name = path.rsplit('/').next().unwrap_or_default().to_string();
        written.push(json!({ "name": name, "type": "file", "path": path }));
    }
    if written.is_empty() {
        return http_error(StatusCode::BAD_REQUEST, "no file in the upload");
    }
    HttpResponse::Ok().json(written)
}

/// The `find -printf` format of an entry: type, size, permission bits, symbolic
/// mode, owner, group, mtime, symlink target, path; NUL-terminated.
const FORMAT: &str = "%y\\t%s\\t%m\\t%M\\t%u\\t%g\\t%T@\\t%l\\t%p\\0";

/// Exit codes the scripts use for a missing path and an existing one.
const MISSING: i32 = 3;
const EXISTS: i32 = 4;

/// Runs `script` in the sandbox with `args` as `$1`, `$2`, …
async fn sh(sbx: &Sbx, script: &str, args: &[&str]) -> Result<(i32, String, String), ConnectError> {
    let mut argv = vec![
        "/bin/sh".to_string(),
        "-c".into(),
        script.into(),
        "sh".into(),
    ];
    argv.extend(args.iter().map(|a| a.to_string()));
    let request = ExecRequest::new(Program::Command { argv }).with_timeout_ms(FS_TIMEOUT_MS);
    let r = sbx.handle.exec(request).await?;
    let code = r.exit_code().unwrap_or(-1);
    if r.outcome == paddock_core::Outcome::TimedOut {
        return Err(ConnectError::new(
            Code::DeadlineExceeded,
            format!(
                "the filesystem call took longer than {} s",
                FS_TIMEOUT_MS / 1000
            ),
        ));
    }
    if r.stdout_truncated {
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            "the listing is larger than the sandbox's output limit; list a smaller directory or a lower depth",
        ));
    }
    Ok((code, r.stdout, r.stderr))
}

fn check_path(field: &str, p: &str) -> Result<(), ConnectError> {
    if p.contains('\0') {
        return Err(ConnectError::invalid(format!(
            "{field}: remove the NUL byte"
        )));
    }
    if p.len() > 4096 {
        return Err(ConnectError::invalid(format!(
            "{field}: longer than 4096 bytes"
        )));
    }
    Ok(())
}

fn entry(record: &str) -> Option<Value> {
    let mut f = record.splitn(9, '\t');
    let kind = f.next()?;
    let size: i64 = f.next()?.parse().ok()?;
    let mode = u32::from_str_radix(f.next()?, 8).ok()?;
    let permissions = f.next()?;
    let owner = f.next()?;
    let group = f.next()?;
    let mtime: f64 = f.next()?.parse().ok()?;
    let target = f.next()?;
    let path = f.next()?;
    let kind = match kind {
        "d" => "FILE_TYPE_DIRECTORY",
        "l" => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_FILE",
    };
    let secs = mtime.floor();
    let when = time::OffsetDateTime::from_unix_timestamp(secs as i64)
        .ok()
        .map(|t| t + time::Duration::nanoseconds(((mtime - secs) * 1e9) as i64))
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default();
    let name = if path == "/" {
        "/".to_string()
    } else {
        path.trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string()
    };
    let mut v = json!({
        "name": name,
        "type": kind,
        "path": path,
        "size": size.to_string(),
        "mode": mode,
        "permissions": permissions,
        "owner": owner,
        "group": group,
        "modifiedTime": when,
    });
    if !target.is_empty() {
        v["symlinkTarget"] = json!(target);
    }
    Some(v)
}

async fn stat(sbx: &Sbx, path: &str) -> Result<Value, ConnectError> {
    let script = format!(
        "[ -e \"$1\" ] || [ -L \"$1\" ] || exit {MISSING}; exec find \"$1\" -maxdepth 0 -printf '{FORMAT}'"
    );
    let (code, out, err) = sh(sbx, &script, &[path]).await?;
    match code {
        0 => out
            .split('\0')
            .find(|r| !r.is_empty())
            .and_then(entry)
            .ok_or_else(|| ConnectError::new(Code::Internal, "an entry could not be read")),
        MISSING => Err(ConnectError::not_found(format!(
            "path '{path}' does not exist"
        ))),
        _ => Err(ConnectError::new(
            Code::Internal,
            format!("stat `{path}`: {}", err.trim()),
        )),
    }
}

/// The entries below directory `path` (an absolute path of the sandbox), `depth`
/// levels down (1 to 32), at most 10 000.
pub(crate) async fn list(sbx: &Sbx, path: &str, depth: u32) -> Result<Vec<Value>, ConnectError> {
    check_path("path", path)?;
    let path = path.to_string();
    let depth = depth.clamp(1, MAX_DEPTH).to_string();
    let script = format!(
        "[ -e \"$1\" ] || exit {MISSING}; [ -d \"$1\" ] || exit {EXISTS}; exec find -H \"$1\" -mindepth 1 -maxdepth \"$2\" -printf '{FORMAT}'"
    );
    let (code, out, err) = sh(sbx, &script, &[&path, &depth]).await?;
    match code {
        0 => {}
        MISSING => {
            return Err(ConnectError::not_found(format!(
                "directory '{path}' does not exist"
            )))
        }
        EXISTS => {
            return Err(ConnectError::invalid(format!(
                "path '{path}' is not a directory"
            )))
        }
        // A listing that met unreadable parts still lists the rest.
        _ if !out.is_empty() => {}
        _ => {
            return Err(ConnectError::new(
                Code::Internal,
                format!("listing `{path}`: {}", err.trim()),
            ))
        }
    }
    let entries: Vec<Value> = out
        .split('\0')
        .filter(|r| !r.is_empty())
        .filter_map(entry)
        .take(MAX_ENTRIES)
        .collect();
    Ok(entries)
}

#[derive(Debug, Default, Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    depth: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
struct MoveRequest {
    #[serde(default)]
    source: String,
    #[serde(default)]
    destination: String,
}

/// Dispatches a unary method of `filesystem.Filesystem`.
pub(crate) async fn unary(
    sbx: &Arc<Sbx>,
    method: &str,
    body: &[u8],
) -> Result<Value, ConnectError> {
    match method {
        "Stat" => {
            let r: PathRequest = connect::parse(body)?;
            check_path("path", &r.path)?;
            let path = sbx.path(&r.path);
            Ok(json!({ "entry": stat(sbx, &path).await? }))
        }
        "ListDir" => {
            let r: PathRequest = connect::parse(body)?;
            check_path("path", &r.path)?;
            let path = sbx.path(&r.path);
            let entries = list(sbx, &path, r.depth.unwrap_or(1)).await?;
            Ok(json!({ "entries": entries }))
        }
        "CreateWatcher" | "GetWatcherEvents" | "RemoveWatcher" => {
            crate::watch::unary(sbx, method, body).await
        }
        "MakeDir" => {
            let r: PathRequest = connect::parse(body)?;
            check_path("path", &r.path)?;
            let path = sbx.path(&r.path);
            let script = format!("[ -e \"$1\" ] && exit {EXISTS}; mkdir -p -- \"$1\"");
            let (code, _, err) = sh(sbx, &script, &[&path]).await?;
            match code {
                0 => Ok(json!({ "entry": stat(sbx, &path).await? })),
                EXISTS => Err(ConnectError::new(
                    Code::AlreadyExists,
                    format!("directory '{path}' already exists"),
                )),
                _ => Err(ConnectError::invalid(format!(
                    "making `{path}`: {}",
                    err.trim()
                ))),
            }
        }
        "Move" => {
            let r: MoveRequest = connect::parse(body)?;
            check_path("source", &r.source)?;
            check_path("destination", &r.destination)?;
            let (from, to) = (sbx.path(&r.source), sbx.path(&r.destination));
            let script = format!(
                "[ -e \"$1\" ] || [ -L \"$1\" ] || exit {MISSING}; mkdir -p -- \"$(dirname -- \"$2\")\" && mv -f -T -- \"$1\" \"$2\""
            );
            let (code, _, err) = sh(sbx, &script, &[&from, &to]).await?;
            match code {
                0 => Ok(json!({ "entry": stat(sbx, &to).await? })),
                MISSING => Err(ConnectError::not_found(format!(
                    "path '{from}' does not exist"
                ))),
                _ => Err(ConnectError::invalid(format!(
                    "moving `{from}` to `{to}`: {}",
                    err.trim()
                ))),
            }
        }
        "Remove" => {
            let r: PathRequest = connect::parse(body)?;
            check_path("path", &r.path)?;
            let path = sbx.path(&r.path);
            let script =
                format!("[ -e \"$1\" ] || [ -L \"$1\" ] || exit {MISSING}; rm -rf -- \"$1\"");
            let (code, _, err) = sh(sbx, &script, &[&path]).await?;
            match code {
                0 => Ok(json!({})),
                MISSING => Err(ConnectError::not_found(format!(
                    "path '{path}' does not exist"
                ))),
                _ => Err(ConnectError::invalid(format!(
                    "removing `{path}`: {}",
                    err.trim()
                ))),
            }
        }
        _ => Err(ConnectError::new(
            Code::Unimplemented,
            format!("filesystem.Filesystem/{method} is not offered by this server yet"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_records_become_entries() {
        let v =
            entry("f\t5\t644\t-rw-r--r--\troot\troot\t1700000000.5\t\t/home/user/a.txt").unwrap();
        assert_eq!(v["name"], "a.txt");
        assert_eq!(v["type"], "FILE_TYPE_FILE");
        assert_eq!(v["size"], "5");
        assert_eq!(v["mode"], 0o644);
        assert_eq!(v["modifiedTime"], "2023-11-14T22:13:20.5Z");
        assert!(v.get("symlinkTarget").is_none());
        let l = entry("l\t1\t777\tlrwxrwxrwx\tu\tg\t0\t/etc\t/home/user/link").unwrap();
        assert_eq!(l["type"], "FILE_TYPE_SYMLINK");
        assert_eq!(l["symlinkTarget"], "/etc");
        // A path with a tab in it keeps it.
        let t = entry("d\t0\t755\tdrwxr-xr-x\tu\tg\t0\t\t/home/user/a\tb").unwrap();
        assert_eq!(t["name"], "a\tb");
        assert!(entry("garbage").is_none());
    }
}
