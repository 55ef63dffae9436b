//! Watching by comparing listings, for engines without the contract's watch (the
//! container engine, until its agent serves it): an entry that appeared is
//! `EVENT_TYPE_CREATE`, one that went `EVENT_TYPE_REMOVE`, one whose size or time
//! changed `EVENT_TYPE_WRITE`, one whose mode changed `EVENT_TYPE_CHMOD`. A rename
//! shows as a remove and a create; changes between two looks that undo each other
//! are not seen. A stream looks every 250 ms; a polled watcher at each
//! `GetWatcherEvents`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::connect::ConnectError;
use crate::registry::Sbx;

/// How often a streamed watcher looks.
pub(super) const LOOK_EVERY: Duration = Duration::from_millis(250);

/// One listing: each entry's path, with what a change is judged by, and the entry.
pub(crate) type Listing = BTreeMap<String, (String, Value)>;

/// The listing of `path` (all the way down when `recursive`).
pub(super) async fn look(sbx: &Sbx, path: &str, recursive: bool) -> Result<Listing, ConnectError> {
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
    let event = |p: &str, kind: &str, entry: Option<&Value>| {
        let mut v = json!({ "name": super::name(root, p), "type": kind });
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
