//! `GET /sandboxes`: the caller's sandboxes, filtered and paged in the order they
//! were opened (newest first unless `order=asc`).

use std::sync::Arc;
use std::time::SystemTime;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::Value;

use super::{caller, described, state, Answer, ApiError};
use crate::registry::{tenant_of, Inner, Sbx};

/// The list's page size when none is asked for, and the largest.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

/// `GET /sandboxes` and `GET /v2/sandboxes`: the caller's sandboxes, filtered by
/// `state` (comma-separated), `metadata` (URL-encoded `key=value` pairs, every one
/// required), `template` and `startedAfter` (RFC 3339, inclusive), newest first
/// (`order=desc`, E2B's default) or oldest first (`order=asc`), paged by `limit` and
/// `nextToken` (the `X-Next-Token` of the previous page, with the same order).
pub(crate) async fn list(inner: web::Data<Arc<Inner>>, req: HttpRequest) -> HttpResponse {
    let run = || -> Answer {
        let caller = caller(&inner, &req)?;
        let mut states: Option<Vec<String>> = None;
        let mut wanted: Vec<(String, String)> = Vec::new();
        let mut template: Option<String> = None;
        let mut limit = DEFAULT_PAGE;
        let mut after: Option<String> = None;
        let mut newest_first = true;
        let mut started_after: Option<SystemTime> = None;
        for (k, v) in form_urlencoded::parse(req.query_string().as_bytes()) {
            match k.as_ref() {
                "state" => {
                    let s = states.get_or_insert_with(Vec::new);
                    for one in v.split(',').filter(|x| !x.is_empty()) {
                        if one != "running" && one != "paused" {
                            return Err(ApiError::new(
                                StatusCode::BAD_REQUEST,
                                format!("state {one:?}: use running or paused"),
                            ));
                        }
                        s.push(one.to_string());
                    }
                }
                "metadata" | "query" => {
                    for (mk, mv) in form_urlencoded::parse(v.as_bytes()) {
                        wanted.push((unquote(&mk), unquote(&mv)));
                    }
                }
                "template" => template = Some(v.into_owned()),
                "limit" => {
                    limit = v
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_PAGE).contains(n))
                        .ok_or_else(|| {
                            ApiError::new(
                                StatusCode::BAD_REQUEST,
                                format!("limit {v:?}: use 1 to {MAX_PAGE}"),
                            )
                        })?
                }
                "nextToken" => after = Some(v.into_owned()),
                "order" => {
                    newest_first = match v.as_ref() {
                        "desc" => true,
                        "asc" => false,
                        other => {
                            return Err(ApiError::new(
                                StatusCode::BAD_REQUEST,
                                format!("order {other:?}: use asc or desc"),
                            ))
                        }
                    }
                }
                "startedAfter" => started_after = Some(parse_time("startedAfter", &v)?),
                _ => {}
            }
        }
        let now = SystemTime::now();
        let mut mine: Vec<Arc<Sbx>> = inner
            .sandboxes
            .iter()
            .filter(|e| caller.sees(tenant_of(&e.value().caller)))
            .filter(|e| *e.value().end_at.lock() > now)
            .map(|e| e.value().clone())
            .filter(|s| {
                states
                    .as_ref()
                    .is_none_or(|st| st.iter().any(|x| x == state(s)))
            })
            .filter(|s| template.as_ref().is_none_or(|t| &s.template == t))
            .filter(|s| started_after.is_none_or(|after| s.started_at >= after))
            .filter(|s| {
                wanted
                    .iter()
                    .all(|(k, v)| s.metadata.get(k).is_some_and(|have| have == v))
            })
            .collect();
        // Ids are random: the order of opening is that of the start times (ties
        // broken by id), and a page's token names the place of its last sandbox in
        // that order, which holds even once that sandbox has ended.
        mine.sort_by_cached_key(|s| page_key(s));
        if newest_first {
            mine.reverse();
        }
        if let Some(after) = &after {
            let Some(after) = parse_page_token(after) else {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("nextToken {after:?}: give the X-Next-Token of the previous page"),
                ));
            };
            // After the token's place, in the list's order.
            mine.retain(|s| match newest_first {
                true => page_key(s) < after,
                false => page_key(s) > after,
            });
        }
        let more = mine.len() > limit;
        mine.truncate(limit);
        let page: Vec<Value> = mine.iter().map(|s| described(&inner, s, None)).collect();
        let mut answer = HttpResponse::Ok();
        if more {
            if let Some(last) = mine.last() {
                let (nanos, id) = page_key(last);
                answer.insert_header(("X-Next-Token", format!("{nanos}.{id}")));
            }
        }
        Ok(answer.json(page))
    };
    run().unwrap_or_else(|e| e.response())
}

/// A sandbox's place in the list: its start (ns since the Unix epoch), then its id.
fn page_key(s: &Sbx) -> (u128, String) {
    let nanos = s
        .started_at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    (nanos, s.id.clone())
}

/// The place a `nextToken` (`{nanos}.{id}`, from [`page_key`]) names.
fn parse_page_token(token: &str) -> Option<(u128, String)> {
    let (nanos, id) = token.split_once('.')?;
    Some((nanos.parse().ok()?, id.to_string()))
}

/// An RFC 3339 time of the query (where a `+` of its offset came unescaped, and so
/// decoded as a space, it is put back).
fn parse_time(field: &str, v: &str) -> Result<SystemTime, ApiError> {
    let text = v.trim().replace(' ', "+");
    time::OffsetDateTime::parse(&text, &time::format_description::well_known::Rfc3339)
        .map(SystemTime::from)
        .map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("{field} {v:?}: give an RFC 3339 time, as 2025-01-31T12:00:00Z ({e})"),
            )
        })
}

/// Percent-decodes what the SDK quoted before it URL-encoded the pairs.
fn unquote(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_token_names_a_place_in_the_order_of_starts() {
        assert_eq!(
            parse_page_token("1733380000123456789.sp-0123"),
            Some((1_733_380_000_123_456_789, "sp-0123".to_string()))
        );
        // Ids hold no dot: the first one ends the time.
        assert_eq!(parse_page_token("5.a.b"), Some((5, "a.b".to_string())));
        for bad in ["", "sp-0123", "x.sp-0123", "-1.sp", ".sp"] {
            assert_eq!(parse_page_token(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn started_after_takes_rfc_3339_as_the_sdks_send_it() {
        let t = |v: &str| {
            parse_time("startedAfter", v)
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_millis())
        };
        assert_eq!(t("2025-01-31T12:00:00Z"), Some(1_738_324_800_000));
        // Python's isoformat, its `+` decoded as a space by the query's parser.
        assert_eq!(
            t("2025-01-31T12:00:00.250000 00:00"),
            Some(1_738_324_800_250)
        );
        assert_eq!(t("2025-01-31T13:00:00+01:00"), Some(1_738_324_800_000));
        for bad in ["", "yesterday", "2025-01-31"] {
            assert!(parse_time("startedAfter", bad).is_err(), "{bad:?}");
        }
    }
}
