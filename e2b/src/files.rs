//! Files: `GET /files` and `POST /files` of E2B's agent, and the
//! `filesystem.Filesystem` service (Stat, ListDir, MakeDir, Move, Remove).
//!
//! Downloads and uploads go through the Paddock files API, so they reach the
//! sandbox's workdir: paths under its home (`/home/user`). The filesystem service
//! calls the sandbox's file operations (`SandboxHandle::stat`, `list_dir`,
//! `make_dir`, `rename`, `remove`): no program runs, so they take no execution
//! permit and write no execution audit entry. The engine decides which paths it
//! serves: the subprocess and isolate engines their workdir (and, for the
//! subprocess engine's `Stat`, what its programs see elsewhere, as an unprivileged
//! user), the container engine any path of the container (its agent does them). An
//! engine without the operations (feature `fileops`) answers `unimplemented`: no
//! command is run in its place.

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::StreamExt;
use paddock_core::{FileInfo, FileKind, FileMetadata};
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

pub(crate) use crate::errors::http_error;
use crate::errors::http_from;

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
    mut payload: web::Payload,
    max_file: u64,
) -> HttpResponse {
    let q = match web::Query::<FileQuery>::from_query(req.query_string()) {
        Ok(q) => q.into_inner(),
        Err(e) => {
            drain(&mut payload).await;
            return http_error(StatusCode::BAD_REQUEST, format!("query: {e}"));
        }
    };
    let meta = match upload_metadata(req) {
        Ok(m) => m,
        Err(refusal) => {
            drain(&mut payload).await;
            return *refusal;
        }
    };
    let ctype = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ctype.starts_with("application/octet-stream") {
        return match write_raw(&sbx, req, &q, &mut payload, max_file, &meta).await {
            Ok(written) => HttpResponse::Ok().json([written]),
            Err(refusal) => {
                drain(&mut payload).await;
                refusal
            }
        };
    }
    if !ctype.starts_with("multipart/form-data") {
        drain(&mut payload).await;
        return http_error(
            StatusCode::BAD_REQUEST,
            format!("Content-Type {ctype:?}: send multipart/form-data with a `file` field, or the file's bytes as application/octet-stream"),
        );
    }
    let mut multipart = actix_multipart::Multipart::new(req.headers(), payload);
    match write_parts(&sbx, &q, &mut multipart, max_file, &meta).await {
        Ok(written) => HttpResponse::Ok().json(written),
        Err(refusal) => {
            drain_parts(&mut multipart).await;
            refusal
        }
    }
}

/// The headers whose rest names a metadata key of the uploaded files (envd 0.6.2).
const METADATA_HEADER: &str = "x-metadata-";

/// The metadata an upload's `X-Metadata-<key>: <value>` headers give its files
/// (keys lowercased; of a key sent twice, the first value), checked before any
/// byte is written.
fn upload_metadata(req: &HttpRequest) -> Result<FileMetadata, Box<HttpResponse>> {
    let mut meta = FileMetadata::new();
    for (name, value) in req.headers().iter() {
        // Header names come lowercased.
        let Some(key) = name.as_str().strip_prefix(METADATA_HEADER) else {
            continue;
        };
        let Ok(value) = value.to_str() else {
            return Err(Box::new(http_error(
                StatusCode::BAD_REQUEST,
                format!("the value of metadata key `{key}` must be printable ASCII (0x20-0x7E)"),
            )));
        };
        meta.entry(key.to_string())
            .or_insert_with(|| value.to_string());
    }
    paddock_core::check_metadata("metadata", &meta)
        .map_err(|e| Box::new(http_error(StatusCode::BAD_REQUEST, e.message)))?;
    Ok(meta)
}

/// Replaces the metadata of a file an upload just wrote with the upload's (none
/// clears it). An engine that keeps no metadata is refused only when some is asked
/// for.
async fn replace_metadata(sbx: &Sbx, path: &str, meta: &FileMetadata) -> Result<(), HttpResponse> {
    match sbx.handle.set_metadata(path, meta.clone()).await {
        Ok(()) => Ok(()),
        Err(e) if meta.is_empty() && e.code == paddock_core::ErrorCode::CapabilityNotSupported => {
            Ok(())
        }
        Err(e) => Err(http_from(e)),
    }
}

/// What an upload answers for a file it wrote: `{name, type, path}`, and its
/// metadata when it has some.
fn written(path: &str, meta: &FileMetadata) -> Value {
    let name = path.rsplit('/').next().unwrap_or_default();
    let mut v = json!({ "name": name, "type": "file", "path": path });
    if !meta.is_empty() {
        v["metadata"] = json!(meta);
    }
    v
}

/// The most bytes one piece of a gzip upload's input may be: what it decodes to in
/// one step stays small (about a thousand times this at most).
const GZIP_PIECE: usize = 1024;

/// An `application/octet-stream` upload (envd 0.5.7): the body is the file at the
/// query's `path`, gzip-compressed when `Content-Encoding: gzip` says so.
async fn write_raw(
    sbx: &Sbx,
    req: &HttpRequest,
    q: &FileQuery,
    payload: &mut web::Payload,
    max_file: u64,
    meta: &FileMetadata,
) -> Result<Value, HttpResponse> {
    let Some(target) = &q.path else {
        return Err(http_error(
            StatusCode::BAD_REQUEST,
            "give `path`, the file to write, with an application/octet-stream upload",
        ));
    };
    let gzip = match req
        .headers()
        .get("content-encoding")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("") | Some("identity") => false,
        Some("gzip") => true,
        Some(other) => {
            return Err(http_error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("Content-Encoding {other:?}: send the bytes as they are, or gzip"),
            ))
        }
    };
    let path = in_home(sbx, target).map_err(|r| *r)?;
    let (feed, source) = paddock_pool::http::upload_source(4);
    let pump = async {
        use std::io::Write as _;
        let mut decoder = gzip.then(|| flate2::write::GzDecoder::new(Vec::new()));
        while let Some(chunk) = payload.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    return feed
                        .fail(std::io::Error::other(format!("the body: {e}")))
                        .await
                }
            };
            let Some(decoder) = decoder.as_mut() else {
                if !feed.send(chunk).await {
                    return;
                }
                continue;
            };
            for piece in chunk.chunks(GZIP_PIECE) {
                if let Err(e) = decoder.write_all(piece) {
                    return feed.fail(std::io::Error::other(format!("gzip: {e}"))).await;
                }
                let out = std::mem::take(decoder.get_mut());
                if !out.is_empty() && !feed.send(out.into()).await {
                    return;
                }
            }
        }
        if let Some(decoder) = decoder {
            match decoder.finish() {
                Ok(rest) if rest.is_empty() => {}
                Ok(rest) => {
                    if !feed.send(rest.into()).await {
                        return;
                    }
                }
                Err(e) => return feed.fail(std::io::Error::other(format!("gzip: {e}"))).await,
            }
        }
        feed.finish().await;
    };
    let (bytes, ()) = futures_util::join!(sbx.handle.write_from(&path, source, max_file), pump);
    bytes.map_err(http_from)?;
    // Replaced whether or not the upload names any: an overwritten file keeps no
    // stale metadata.
    replace_metadata(sbx, &path, meta).await?;
    Ok(written(&path, meta))
}

/// The most bytes of a refused upload read (and dropped) before the refusal is
/// answered: a client still sending its body then reads the answer rather than a
/// broken pipe. Beyond it, the connection closes with the answer.
const DRAIN_MAX: usize = 8 << 20;

/// Reads and drops the rest of a refused request's body, up to [`DRAIN_MAX`].
async fn drain(payload: &mut web::Payload) {
    let mut read = 0usize;
    while let Some(Ok(chunk)) = payload.next().await {
        read += chunk.len();
        if read > DRAIN_MAX {
            return;
        }
    }
}

/// [`drain`], for an upload's parts still unread.
async fn drain_parts(multipart: &mut actix_multipart::Multipart) {
    let mut read = 0usize;
    while let Some(Ok(mut field)) = multipart.next().await {
        while let Some(Ok(chunk)) = field.next().await {
            read += chunk.len();
            if read > DRAIN_MAX {
                return;
            }
        }
    }
}

/// Writes an upload's parts; answers what was written, or the refusal of the
/// first part that could not be.
async fn write_parts(
    sbx: &Sbx,
    q: &FileQuery,
    multipart: &mut actix_multipart::Multipart,
    max_file: u64,
    meta: &FileMetadata,
) -> Result<Vec<Value>, HttpResponse> {
    let mut answers = Vec::new();
    let mut parts = 0usize;
    while let Some(field) = multipart.next().await {
        let mut field =
            field.map_err(|e| http_error(StatusCode::BAD_REQUEST, format!("multipart: {e}")))?;
        parts += 1;
        if parts > MAX_PARTS {
            return Err(http_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("more than {MAX_PARTS} files in one upload; send them in several"),
            ));
        }
        let name = field
            .content_disposition()
            .and_then(|d| d.get_filename().map(String::from));
        let target = match (parts, &q.path, name) {
            (1, Some(p), _) => p.clone(),
            (_, _, Some(n)) if !n.is_empty() => n,
            _ => {
                return Err(http_error(
                    StatusCode::BAD_REQUEST,
                    "a part without a file name: name each file by its path",
                ))
            }
        };
        let path = in_home(sbx, &target).map_err(|r| *r)?;
        // Streamed into the file through a small bounded channel: an upload holds a
        // few chunks of memory, whatever its size.
        // Only a part read to its end is kept: a request dropped midway ends the
        // source with an error, not as a shorter file.
        let (feed, source) = paddock_pool::http::upload_source(4);
        let pump = async {
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
        written_bytes.map_err(http_from)?;
        replace_metadata(sbx, &path, meta).await?;
        answers.push(written(&path, meta));
    }
    if answers.is_empty() {
        return Err(http_error(StatusCode::BAD_REQUEST, "no file in the upload"));
    }
    Ok(answers)
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

/// A name for an owner or group id: `root` for 0, else the number.
fn id_name(id: u32) -> std::borrow::Cow<'static, str> {
    if id == 0 {
        "root".into()
    } else {
        id.to_string().into()
    }
}

/// `ls -l`'s symbolic mode of an entry (`drwxr-xr-x`).
fn symbolic(kind: FileKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        FileKind::Directory => 'd',
        FileKind::Symlink => 'l',
        FileKind::Other => 'p',
        FileKind::File => '-',
    });
    let special = [(0o4000, 's', 'S'), (0o2000, 's', 'S'), (0o1000, 't', 'T')];
    for (i, (bit, set, unset)) in special.iter().enumerate() {
        let shift = 6 - 3 * i as u32;
        let bits = (mode >> shift) & 0o7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(match (bits & 1 != 0, mode & bit != 0) {
            (true, true) => *set,
            (false, true) => *unset,
            (true, false) => 'x',
            (false, false) => '-',
        });
    }
    s
}

/// RFC 3339 in UTC of a time after the epoch, with the fraction of a second
/// trimmed of trailing zeros (`2023-11-14T22:13:20.5Z`); before the epoch, the
/// epoch.
fn rfc3339(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days to a civil date (Howard Hinnant's `civil_from_days`).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut out = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    );
    let nanos = d.subsec_nanos();
    if nanos != 0 {
        let fraction = format!("{nanos:09}");
        out.push('.');
        out.push_str(fraction.trim_end_matches('0'));
    }
    out.push('Z');
    out
}

/// The entry E2B's SDK reads (`EntryInfo`), serialized as it is (no JSON value
/// built in between: a listing of many entries is written straight out).
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Entry<'a> {
    name: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    path: &'a str,
    /// An `int64`, which Connect's JSON writes as a string.
    #[serde(serialize_with = "as_string")]
    size: u64,
    mode: u32,
    permissions: String,
    owner: std::borrow::Cow<'static, str>,
    group: std::borrow::Cow<'static, str>,
    modified_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    symlink_target: Option<&'a str>,
    /// User metadata (envd 0.6.2), when the entry has some.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    metadata: &'a FileMetadata,
}

fn as_string<S: serde::Serializer>(n: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(n)
}

impl<'a> Entry<'a> {
    /// The entry of a file's information.
    pub(crate) fn of(info: &'a FileInfo) -> Entry<'a> {
        Entry {
            name: info.name(),
            kind: match info.kind {
                FileKind::Directory => "FILE_TYPE_DIRECTORY",
                FileKind::Symlink => "FILE_TYPE_SYMLINK",
                FileKind::File | FileKind::Other => "FILE_TYPE_FILE",
            },
            path: &info.path,
            size: info.size,
            mode: info.mode,
            permissions: symbolic(info.kind, info.mode),
            owner: id_name(info.uid),
            group: id_name(info.gid),
            modified_time: rfc3339(info.modified),
            symlink_target: info.symlink_target.as_deref(),
            metadata: &info.metadata,
        }
    }
}

/// The entry E2B's SDK reads (`EntryInfo`) of a file's information, as a value.
pub(crate) fn entry(info: &FileInfo) -> Value {
    serde_json::to_value(Entry::of(info)).unwrap_or_default()
}

async fn stat(sbx: &Sbx, path: &str) -> Result<Value, ConnectError> {
    let mut info = sbx.handle.stat(path).await?;
    resolve_link(sbx, &mut info).await;
    Ok(entry(&info))
}

/// The entries below directory `path` (an absolute path of the sandbox), `depth`
/// levels down (1 to 32), at most 10 000, in the order of their paths.
pub(crate) async fn list(sbx: &Sbx, path: &str, depth: u32) -> Result<Vec<FileInfo>, ConnectError> {
    check_path("path", path)?;
    let mut infos = sbx.handle.list_dir(path, depth.clamp(1, MAX_DEPTH)).await?;
    infos.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    infos.truncate(MAX_ENTRIES);
    for info in &mut infos {
        resolve_link(sbx, info).await;
    }
    Ok(infos)
}

/// The most links followed to resolve one, as the kernel does.
const MAX_LINKS: usize = 40;

/// A symlink as E2B's agent reports it: with the kind of what it resolves to and
/// that absolute path as its target. A link that resolves to nothing the sandbox
/// may see (dangling, a loop, or outside what the engine serves) stays a symlink
/// with its target as written.
async fn resolve_link(sbx: &Sbx, info: &mut FileInfo) {
    if info.kind != FileKind::Symlink {
        return;
    }
    let Some(mut target) = info
        .symlink_target
        .as_deref()
        .map(|t| beside(&info.path, t))
    else {
        return;
    };
    for _ in 0..MAX_LINKS {
        match sbx.handle.stat(&target).await {
            Ok(t) if t.kind == FileKind::Symlink => match t.symlink_target.as_deref() {
                Some(next) => target = beside(&target, next),
                None => return,
            },
            Ok(t) => {
                info.kind = t.kind;
                info.symlink_target = Some(target);
                return;
            }
            Err(_) => return,
        }
    }
}

/// Where link `link`'s `target` points: an absolute target as it is, a relative
/// one from the link's directory, with `.` and `..` taken out.
fn beside(link: &str, target: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    let from = if target.starts_with('/') {
        ""
    } else {
        link.rsplit_once('/').map_or("", |(dir, _)| dir)
    };
    for part in from.split('/').chain(target.split('/')) {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
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

/// Dispatches a unary method of `filesystem.Filesystem`; answers its JSON.
pub(crate) async fn unary(
    sbx: &Arc<Sbx>,
    method: &str,
    body: &[u8],
) -> Result<String, ConnectError> {
    if method == "ListDir" {
        let r: PathRequest = connect::parse(body)?;
        check_path("path", &r.path)?;
        let path = sbx.path(&r.path);
        let infos = list(sbx, &path, r.depth.unwrap_or(1)).await?;
        #[derive(serde::Serialize)]
        struct Listing<'a> {
            entries: Vec<Entry<'a>>,
        }
        let entries = infos.iter().map(Entry::of).collect();
        return serde_json::to_string(&Listing { entries })
            .map_err(|e| ConnectError::new(Code::Internal, format!("the listing: {e}")));
    }
    unary_value(sbx, method, body).await.map(|v| v.to_string())
}

/// The unary methods answered as JSON values.
async fn unary_value(sbx: &Arc<Sbx>, method: &str, body: &[u8]) -> Result<Value, ConnectError> {
    match method {
        "Stat" => {
            let r: PathRequest = connect::parse(body)?;
            check_path("path", &r.path)?;
            let path = sbx.path(&r.path);
            Ok(json!({ "entry": stat(sbx, &path).await? }))
        }
        "CreateWatcher" | "GetWatcherEvents" | "RemoveWatcher" => {
            crate::watch::unary(sbx, method, body).await
        }
        "MakeDir" => {
            let r: PathRequest = connect::parse(body)?;
            check_path("path", &r.path)?;
            let path = sbx.path(&r.path);
            match sbx.handle.make_dir(&path).await {
                Ok(true) => Ok(json!({ "entry": stat(sbx, &path).await? })),
                Ok(false) => Err(ConnectError::new(
                    Code::AlreadyExists,
                    format!("directory '{path}' already exists"),
                )),
                Err(e) => Err(e.into()),
            }
        }
        "Move" => {
            let r: MoveRequest = connect::parse(body)?;
            check_path("source", &r.source)?;
            check_path("destination", &r.destination)?;
            let (from, to) = (sbx.path(&r.source), sbx.path(&r.destination));
            match sbx.handle.rename(&from, &to).await {
                Ok(()) => Ok(json!({ "entry": stat(sbx, &to).await? })),
                Err(e) => Err(e.into()),
            }
        }
        "Remove" => {
            let r: PathRequest = connect::parse(body)?;
            check_path("path", &r.path)?;
            let path = sbx.path(&r.path);
            // As E2B's agent (a recursive remove): a path that is not there is
            // already removed.
            match sbx.handle.remove(&path).await {
                Ok(()) => Ok(json!({})),
                Err(e) if e.code == paddock_core::ErrorCode::NotFound => Ok(json!({})),
                Err(e) => Err(e.into()),
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
    fn link_targets_resolve_from_the_links_directory() {
        assert_eq!(beside("/home/user/d/l", "t.txt"), "/home/user/d/t.txt");
        assert_eq!(beside("/home/user/d/l", "../x/./t"), "/home/user/x/t");
        assert_eq!(beside("/home/user/d/l", "/etc/hosts"), "/etc/hosts");
        assert_eq!(beside("/l", "../../.."), "/");
    }

    #[test]
    fn file_information_becomes_an_entry() {
        let info = FileInfo {
            path: "/home/user/a.txt".into(),
            kind: FileKind::File,
            size: 5,
            mode: 0o644,
            uid: 0,
            gid: 1000,
            modified: std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_500),
            symlink_target: None,
            metadata: Default::default(),
        };
        let v = entry(&info);
        assert_eq!(v["name"], "a.txt");
        assert_eq!(v["type"], "FILE_TYPE_FILE");
        assert_eq!(v["size"], "5");
        assert_eq!(v["mode"], 0o644);
        assert_eq!(v["permissions"], "-rw-r--r--");
        assert_eq!(
            (v["owner"].as_str(), v["group"].as_str()),
            (Some("root"), Some("1000"))
        );
        assert_eq!(v["modifiedTime"], "2023-11-14T22:13:20.5Z");
        assert!(v.get("symlinkTarget").is_none());
        assert!(v.get("metadata").is_none());
        let tagged = FileInfo {
            metadata: [("author".to_string(), "mish".to_string())].into(),
            ..info.clone()
        };
        assert_eq!(entry(&tagged)["metadata"], json!({ "author": "mish" }));
        let link = FileInfo {
            kind: FileKind::Symlink,
            mode: 0o777,
            symlink_target: Some("/etc".into()),
            ..info.clone()
        };
        let l = entry(&link);
        assert_eq!(l["type"], "FILE_TYPE_SYMLINK");
        assert_eq!(l["symlinkTarget"], "/etc");
        assert_eq!(l["permissions"], "lrwxrwxrwx");
        assert_eq!(symbolic(FileKind::Directory, 0o1755), "drwxr-xr-t");
        // The timestamps are RFC 3339 as the `time` crate writes them.
        for (secs, nanos) in [
            (0u64, 0u32),
            (951_782_400, 1),
            (1_700_000_000, 500_000_000),
            (4_102_444_799, 999_999_999),
            (1_709_164_800, 120_000),
        ] {
            let t = std::time::UNIX_EPOCH + std::time::Duration::new(secs, nanos);
            let expected = time::OffsetDateTime::from(t)
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap();
            assert_eq!(rfc3339(t), expected, "{secs}.{nanos:09}");
        }
        assert_eq!(symbolic(FileKind::File, 0o4644), "-rwSr--r--");
    }
}
