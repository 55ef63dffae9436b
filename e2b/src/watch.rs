//! Watching a directory: `filesystem.Filesystem/WatchDir` (a stream) and
//! `CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher` (polled, as E2B's sync Python
//! SDK does it).
//!
//! A watcher is the sandbox's own watch (`SandboxHandle::watch`: inotify on the
//! subprocess and isolate engines): changes arrive as they happen, and a watcher
//! that sees none costs nothing, with no execution, no limiter permit and no audit
//! entry. Events are `EVENT_TYPE_CREATE` (made, or moved in), `EVENT_TYPE_WRITE`,
//! `EVENT_TYPE_REMOVE`, `EVENT_TYPE_RENAME` (moved away) and `EVENT_TYPE_CHMOD`,
//! named relative to the watched directory.
//!
//! A polled watcher buffers what happens between two `GetWatcherEvents` and
//! answers it folded by name: a path created and then removed between two calls
//! is not reported, and each kind of change of a path is reported once.
//!
//! An engine without the watch (feature `fileops`) answers `unimplemented`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse};
use bytes::Bytes;
use paddock_core::{FileEvent, FileEventKind, FileWatch};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::connect::{self, Code, ConnectError};
use crate::registry::Sbx;

/// Most watchers (polled and streamed) of one sandbox.
const MAX_WATCHERS: usize = 16;
/// How long `GetWatcherEvents` waits for events still on their way (a change made
/// just before the call), after the last one it took.
const SETTLE: Duration = Duration::from_millis(25);
/// The longest `GetWatcherEvents` spends taking events.
const MAX_SETTLE: Duration = Duration::from_millis(250);

/// The polled watchers of one sandbox, and how many streams watch.
#[derive(Default)]
pub(crate) struct Watchers {
    by_id: BTreeMap<String, Watcher>,
    streams: usize,
}

struct Watcher {
    path: String,
    include_entry: bool,
    /// The sandbox's own watch (a call takes its events).
    watch: Arc<tokio::sync::Mutex<FileWatch>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default)]
    include_entry: bool,
    /// envd 0.6.4: whether a watch may be on a network file system (NFS, FUSE…).
    /// Accepted either way: no sandbox here has one.
    #[serde(default)]
    #[allow(dead_code)]
    allow_network_mounts: bool,
    #[serde(default)]
    watcher_id: String,
}

/// `p` relative to `root`.
fn name(root: &str, p: &str) -> String {
    p.strip_prefix(root)
        .map(|r| r.trim_start_matches('/'))
        .unwrap_or(p)
        .to_string()
}

fn kind_name(kind: FileEventKind) -> &'static str {
    match kind {
        FileEventKind::Create => "EVENT_TYPE_CREATE",
        FileEventKind::Write => "EVENT_TYPE_WRITE",
        FileEventKind::Remove => "EVENT_TYPE_REMOVE",
        FileEventKind::Rename => "EVENT_TYPE_RENAME",
        FileEventKind::Chmod => "EVENT_TYPE_CHMOD",
    }
}

/// An event as E2B's SDK reads it; with `include_entry`, the entry of what is
/// still there.
async fn event(sbx: &Sbx, root: &str, e: &FileEvent, include_entry: bool) -> Value {
    let mut v = json!({ "name": name(root, &e.path), "type": kind_name(e.kind) });
    if include_entry && !matches!(e.kind, FileEventKind::Remove | FileEventKind::Rename) {
        if let Ok(info) = sbx.handle.stat(&e.path).await {
            v["entry"] = crate::files::entry(&info);
        }
    }
    v
}

/// Folds the events a polled watcher saw between two calls, by path: a path
/// created and then removed (or moved away) in between is left out, and each kind
/// of change of a path is kept once, in the order first seen.
fn fold(events: Vec<FileEvent>) -> Vec<FileEvent> {
    let mut order: Vec<String> = Vec::new();
    let mut by_path: BTreeMap<String, Vec<FileEventKind>> = BTreeMap::new();
    for e in events {
        let kinds = by_path.entry(e.path.clone()).or_insert_with(|| {
            order.push(e.path.clone());
            Vec::new()
        });
        kinds.push(e.kind);
    }
    let mut out = Vec::new();
    for path in order {
        let kinds = &by_path[&path];
        let gone = matches!(
            kinds.last(),
            Some(FileEventKind::Remove | FileEventKind::Rename)
        );
        if kinds.first() == Some(&FileEventKind::Create) && gone {
            continue;
        }
        let mut kept: Vec<FileEventKind> = Vec::new();
        for k in kinds {
            if !kept.contains(k) {
                kept.push(*k);
            }
        }
        out.extend(kept.into_iter().map(|kind| FileEvent {
            path: path.clone(),
            kind,
        }));
    }
    out
}

/// The events a live watcher holds, with those still on their way (see
/// [`SETTLE`]).
async fn take(watch: &mut FileWatch) -> Vec<FileEvent> {
    let mut got = Vec::new();
    let until = tokio::time::Instant::now() + MAX_SETTLE;
    loop {
        while let Some(e) = watch.try_next() {
            got.push(e);
        }
        let wait = SETTLE.min(until.saturating_duration_since(tokio::time::Instant::now()));
        if wait.is_zero() {
            return got;
        }
        match tokio::time::timeout(wait, watch.next()).await {
            Ok(Some(e)) => got.push(e),
            Ok(None) | Err(_) => return got,
        }
    }
}

/// `CreateWatcher`, `GetWatcherEvents` and `RemoveWatcher`.
pub(crate) async fn unary(
    sbx: &Arc<Sbx>,
    method: &str,
    body: &[u8],
) -> Result<Value, ConnectError> {
    let r: WatchRequest = connect::parse(body)?;
    match method {
        "CreateWatcher" => {
            let path = sbx.path(&r.path);
            if sbx.watchers.lock().by_id.len() >= MAX_WATCHERS {
                return Err(too_many());
            }
            let watch = Arc::new(tokio::sync::Mutex::new(
                sbx.handle.watch(&path, r.recursive).await?,
            ));
            let id = uuid::Uuid::new_v4().to_string();
            let mut w = sbx.watchers.lock();
            if w.by_id.len() + w.streams >= MAX_WATCHERS {
                return Err(too_many());
            }
            w.by_id.insert(
                id.clone(),
                Watcher {
                    path,
                    include_entry: r.include_entry,
                    watch,
                },
            );
            Ok(json!({ "watcherId": id }))
        }
        "GetWatcherEvents" => {
            let (path, include_entry, watch) = {
                let w = sbx.watchers.lock();
                let watcher = w
                    .by_id
                    .get(&r.watcher_id)
                    .ok_or_else(|| unknown(&r.watcher_id))?;
                (
                    watcher.path.clone(),
                    watcher.include_entry,
                    watcher.watch.clone(),
                )
            };
            let taken = take(&mut *watch.lock().await).await;
            let mut found = Vec::new();
            for e in fold(taken) {
                found.push(event(sbx, &path, &e, include_entry).await);
            }
            Ok(json!({ "events": found }))
        }
        "RemoveWatcher" => {
            sbx.watchers
                .lock()
                .by_id
                .remove(&r.watcher_id)
                .ok_or_else(|| unknown(&r.watcher_id))?;
            Ok(json!({}))
        }
        _ => Err(ConnectError::new(
            Code::Unimplemented,
            format!("filesystem.Filesystem/{method} is not offered"),
        )),
    }
}

fn too_many() -> ConnectError {
    ConnectError::new(
        Code::ResourceExhausted,
        format!("{MAX_WATCHERS} watchers are open in this sandbox; stop one first"),
    )
}

fn unknown(id: &str) -> ConnectError {
    ConnectError::not_found(format!("watcher {id} not found"))
}

/// Counts a streamed watcher while it lives.
struct Streaming(Arc<Sbx>);

impl Drop for Streaming {
    fn drop(&mut self) {
        self.0.watchers.lock().streams -= 1;
    }
}

/// `WatchDir`: `start`, then the events as they happen, with keepalives, until the
/// caller goes, its deadline passes or the watch ends (the directory or the
/// sandbox went).
pub(crate) async fn watch_dir(
    sbx: Arc<Sbx>,
    req: &HttpRequest,
    message: &[u8],
) -> Result<HttpResponse, ConnectError> {
    let r: WatchRequest = connect::parse(message)?;
    let path = sbx.path(&r.path);
    {
        let mut w = sbx.watchers.lock();
        if w.by_id.len() + w.streams >= MAX_WATCHERS {
            return Err(too_many());
        }
        w.streams += 1;
    }
    let held = Streaming(sbx.clone());
    let mut watch = match sbx.handle.watch(&path, r.recursive).await {
        Ok(w) => w,
        Err(e) => {
            drop(held);
            return Err(e.into());
        }
    };
    let timing = crate::process::timing(req);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    actix_web::rt::spawn(async move {
        let _held = held;
        let frame = |v: Value| connect::envelope(0, &v);
        let deadline = timing.deadline.map(tokio::time::Instant::from_std);
        let run = async {
            if tx.send(frame(json!({ "start": {} }))).await.is_err() {
                return None;
            }
            loop {
                let next = tokio::time::timeout(timing.keepalive, watch.next()).await;
                let v = match next {
                    Err(_) => json!({ "keepalive": {} }),
                    Ok(None) => return None,
                    Ok(Some(e)) => {
                        json!({ "filesystem": event(&sbx, &path, &e, r.include_entry).await })
                    }
                };
                if tx.send(frame(v)).await.is_err() {
                    return None;
                }
            }
        };
        let expired = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let ended = tokio::select! {
            e = run => e,
            () = tx.closed() => None,
            () = expired => Some(ConnectError::new(Code::DeadlineExceeded, "the call's Connect-Timeout-Ms passed")),
        };
        let _ = tx.send(connect::end_of_stream(ended.as_ref())).await;
    });
    Ok(crate::process::streaming(rx))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(path: &str, kind: FileEventKind) -> FileEvent {
        FileEvent {
            path: path.into(),
            kind,
        }
    }

    #[test]
    fn polled_events_are_folded_by_path() {
        use FileEventKind::*;
        let got = fold(vec![
            ev("/w/new", Create),
            ev("/w/old", Write),
            ev("/w/new", Write),
            ev("/w/old", Write),
            ev("/w/sub", Create),
            ev("/w/sub/deep", Create),
            ev("/w/sub/deep", Write),
            ev("/w/new", Remove),
            ev("/w/old", Chmod),
            ev("/w/moved", Create),
            ev("/w/moved", Rename),
        ]);
        let names: Vec<(String, &str)> = got
            .iter()
            .map(|e| (name("/w", &e.path), kind_name(e.kind)))
            .collect();
        assert_eq!(
            names,
            [
                ("old".to_string(), "EVENT_TYPE_WRITE"),
                ("old".to_string(), "EVENT_TYPE_CHMOD"),
                ("sub".to_string(), "EVENT_TYPE_CREATE"),
                ("sub/deep".to_string(), "EVENT_TYPE_CREATE"),
                ("sub/deep".to_string(), "EVENT_TYPE_WRITE"),
            ]
        );
        assert!(fold(Vec::new()).is_empty());
    }
}
