//! Watching a directory: `filesystem.Filesystem/WatchDir` (a stream) and
//! `CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher` (polled, as E2B's sync Python
//! SDK does it).
//!
//! A watcher compares listings of the directory taken inside the sandbox (as the
//! filesystem service's `ListDir`): an entry that appeared is `EVENT_TYPE_CREATE`,
//! one that went `EVENT_TYPE_REMOVE`, one whose size or time changed
//! `EVENT_TYPE_WRITE`, one whose mode changed `EVENT_TYPE_CHMOD`. A rename shows as
//! a remove and a create; changes between two looks that undo each other are not
//! seen. The stream looks every 250 ms; a polled watcher at each
//! `GetWatcherEvents`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::connect::{self, Code, ConnectError};
use crate::registry::Sbx;

/// Most watchers (polled and streamed) of one sandbox.
const MAX_WATCHERS: usize = 16;
/// How often a streamed watcher looks.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// One listing: each entry's path, with what a change is judged by, and the entry.
pub(crate) type Listing = BTreeMap<String, (String, Value)>;

/// The polled watchers of one sandbox, and how many streams watch.
#[derive(Default)]
pub(crate) struct Watchers {
    by_id: BTreeMap<String, Watcher>,
    streams: usize,
}

struct Watcher {
    path: String,
    recursive: bool,
    include_entry: bool,
    last: Listing,
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
    #[serde(default)]
    watcher_id: String,
}

/// The listing of `path` (all the way down when `recursive`).
async fn look(sbx: &Sbx, path: &str, recursive: bool) -> Result<Listing, ConnectError> {
    let entries = crate::files::list(sbx, path, if recursive { 32 } else { 1 }).await?;
    Ok(entries
        .into_iter()
        .filter_map(|e| {
            let p = e["path"].as_str()?.to_string();
            let judged = format!(
                "{}|{}|{}|{}",
                e["type"], e["size"], e["modifiedTime"], e["mode"]
            );
            Some((p, (judged, e)))
        })
        .collect())
}

/// The events from `before` to `after`, with names relative to `root`.
pub(crate) fn events(
    root: &str,
    before: &Listing,
    after: &Listing,
    include_entry: bool,
) -> Vec<Value> {
    let name = |p: &str| {
        p.strip_prefix(root)
            .map(|r| r.trim_start_matches('/'))
            .unwrap_or(p)
            .to_string()
    };
    let event = |p: &str, kind: &str, entry: Option<&Value>| {
        let mut v = json!({ "name": name(p), "type": kind });
        if let (true, Some(e)) = (include_entry, entry) {
            v["entry"] = e.clone();
        }
        v
    };
    let mut out = Vec::new();
    for (p, (judged, entry)) in after {
        match before.get(p) {
            None => out.push(event(p, "EVENT_TYPE_CREATE", Some(entry))),
            Some((was, old)) if was != judged => {
                let kind = if old["mode"] != entry["mode"]
                    && old["size"] == entry["size"]
                    && old["modifiedTime"] == entry["modifiedTime"]
                {
                    "EVENT_TYPE_CHMOD"
                } else {
                    "EVENT_TYPE_WRITE"
                };
                out.push(event(p, kind, Some(entry)));
            }
            Some(_) => {}
        }
    }
    for p in before.keys() {
        if !after.contains_key(p) {
            out.push(event(p, "EVENT_TYPE_REMOVE", None));
        }
    }
    out
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
            let last = look(sbx, &path, r.recursive).await?;
            let id = uuid::Uuid::new_v4().to_string();
            let mut w = sbx.watchers.lock();
            if w.by_id.len() + w.streams >= MAX_WATCHERS {
                return Err(too_many());
            }
            w.by_id.insert(
                id.clone(),
                Watcher {
                    path,
                    recursive: r.recursive,
                    include_entry: r.include_entry,
                    last,
                },
            );
            Ok(json!({ "watcherId": id }))
        }
        "GetWatcherEvents" => {
            let (path, recursive, include_entry, before) = {
                let w = sbx.watchers.lock();
                let watcher = w
                    .by_id
                    .get(&r.watcher_id)
                    .ok_or_else(|| unknown(&r.watcher_id))?;
                (
                    watcher.path.clone(),
                    watcher.recursive,
                    watcher.include_entry,
                    watcher.last.clone(),
                )
            };
            let after = look(sbx, &path, recursive).await?;
            let found = events(&path, &before, &after, include_entry);
            if let Some(watcher) = sbx.watchers.lock().by_id.get_mut(&r.watcher_id) {
                watcher.last = after;
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

/// `WatchDir`: `start`, then the events as they are seen, with keepalives, until the
/// caller goes or its deadline passes.
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
    let first = match look(&sbx, &path, r.recursive).await {
        Ok(l) => l,
        Err(e) => {
            drop(held);
            return Err(e);
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
            let mut before = first;
            let mut quiet = Duration::ZERO;
            loop {
                tokio::time::sleep(LOOK_EVERY).await;
                let after = match look(&sbx, &path, r.recursive).await {
                    Ok(l) => l,
                    Err(e) => return Some(e),
                };
                let found = events(&path, &before, &after, r.include_entry);
                before = after;
                if found.is_empty() {
                    quiet += LOOK_EVERY;
                    if quiet >= timing.keepalive {
                        quiet = Duration::ZERO;
                        if tx.send(frame(json!({ "keepalive": {} }))).await.is_err() {
                            return None;
                        }
                    }
                    continue;
                }
                quiet = Duration::ZERO;
                for e in found {
                    if tx.send(frame(json!({ "filesystem": e }))).await.is_err() {
                        return None;
                    }
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

    fn entry(path: &str, size: u64, mode: u32, t: &str) -> (String, (String, Value)) {
        let e = json!({ "path": path, "type": "FILE_TYPE_FILE", "size": size.to_string(), "mode": mode, "modifiedTime": t });
        let judged = format!(
            "{}|{}|{}|{}",
            e["type"], e["size"], e["modifiedTime"], e["mode"]
        );
        (path.to_string(), (judged, e))
    }

    #[test]
    fn listings_differ_as_events() {
        let before: Listing = [
            entry("/w/a", 1, 0o644, "t1"),
            entry("/w/b", 1, 0o644, "t1"),
            entry("/w/c", 1, 0o644, "t1"),
        ]
        .into();
        let after: Listing = [
            entry("/w/a", 2, 0o644, "t2"),
            entry("/w/b", 1, 0o600, "t1"),
            entry("/w/sub/d", 1, 0o644, "t1"),
        ]
        .into();
        let got: Vec<(String, String)> = events("/w", &before, &after, false)
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap().into(),
                    e["type"].as_str().unwrap().into(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a".into(), "EVENT_TYPE_WRITE".into()),
                ("b".into(), "EVENT_TYPE_CHMOD".into()),
                ("sub/d".into(), "EVENT_TYPE_CREATE".into()),
                ("c".into(), "EVENT_TYPE_REMOVE".into()),
            ]
        );
        let with = events("/w", &before, &after, true);
        assert!(with[0].get("entry").is_some() && with[3].get("entry").is_none());
        assert!(events("/w", &after, &after, true).is_empty());
    }
}
