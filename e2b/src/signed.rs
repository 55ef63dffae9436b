//! Signed file URLs, as E2B's SDKs make them (`download_url`, `upload_url`): the
//! agent's `GET /files` (a read) and `POST /files` (a write) taken without the
//! access token, on a `signature` the SDK computed from the sandbox's access token,
//! bound to the path, the operation, the user and, when given, an expiry
//! (`signature_expiration`, Unix seconds).
//!
//! The signature is `v1_` and the unpadded standard base64 of the SHA-256 of
//! `{path}:{operation}:{user}:{token}`, with `:{expiration}` after it when the URL
//! expires. It is compared in constant time. A URL that names no sandbox (the URL
//! mode, where the SDK's file URL is the server's own) is matched against the open
//! sandboxes' tokens: only the sandbox whose token made it matches.

use actix_web::dev::RequestHead;
use actix_web::http::Method;
use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::registry::{Inner, Sbx};

/// What a signed request's signature says for one sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Made with the sandbox's token, for this path and operation, and not expired.
    Valid,
    /// Made with the sandbox's token, for this path and operation, but past its
    /// expiry: answered 401, as E2B's agent does.
    Expired,
    /// Not made with the sandbox's token (or for something else).
    Invalid,
}

/// What E2B's agent answers for an expired signature.
pub(crate) const EXPIRED_MESSAGE: &str = "signature is already expired";

/// The signed parts of a request's query.
#[derive(Debug, Default)]
struct Signed {
    path: String,
    user: String,
    signature: String,
    expiration: Option<String>,
}

/// The signed request `head` makes, if it is one: `GET` or `POST` of `/files` with
/// a `signature` in its query.
fn signed(head: &RequestHead) -> Option<(Signed, &'static str)> {
    if head.uri.path() != "/files" {
        return None;
    }
    let operation = match head.method {
        Method::GET => "read",
        Method::POST => "write",
        _ => return None,
    };
    let mut s = Signed::default();
    let mut has_signature = false;
    for (k, v) in form_urlencoded::parse(head.uri.query().unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "path" => s.path = v.into_owned(),
            "username" => s.user = v.into_owned(),
            "signature" => {
                has_signature = true;
                s.signature = v.into_owned();
            }
            "signature_expiration" => s.expiration = Some(v.into_owned()),
            _ => {}
        }
    }
    has_signature.then_some((s, operation))
}

/// Whether `head` is a signed file request (whatever sandbox it may be for).
pub(crate) fn is_signed(head: &RequestHead) -> bool {
    signed(head).is_some()
}

/// The signature `token` makes for these parts.
fn signature(token: &str, s: &Signed, operation: &str) -> String {
    let mut raw = format!("{}:{operation}:{}:{token}", s.path, s.user);
    if let Some(e) = &s.expiration {
        raw.push(':');
        raw.push_str(e);
    }
    let digest = Sha256::digest(raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// What `head`'s signature says for `sbx`; `None` when `head` is no signed request.
pub(crate) fn verdict(sbx: &Sbx, head: &RequestHead) -> Option<Verdict> {
    let (s, operation) = signed(head)?;
    Some(judge(&sbx.token, &s, operation, unix_now()))
}

fn judge(token: &str, s: &Signed, operation: &str, now: u64) -> Verdict {
    let expected = signature(token, s, operation);
    if !bool::from(expected.as_bytes().ct_eq(s.signature.as_bytes())) {
        return Verdict::Invalid;
    }
    match &s.expiration {
        // An expiry that is no number cannot have been signed as one by the SDK:
        // it was, so it is past.
        Some(e) if e.parse::<u64>().map_or(true, |e| e < now) => Verdict::Expired,
        _ => Verdict::Valid,
    }
}

/// The open sandbox whose token made `head`'s signature, and the verdict: for a
/// signed request that names no sandbox.
pub(crate) fn find(inner: &Inner, head: &RequestHead) -> Option<(std::sync::Arc<Sbx>, Verdict)> {
    let (s, operation) = signed(head)?;
    let now = unix_now();
    // Looked at in the map's own walk, with no second lookup in it (which could wait
    // on a writer behind the walk's read lock).
    let live_at = std::time::SystemTime::now();
    inner.sandboxes.iter().find_map(|e| {
        let sbx = e.value();
        if *sbx.end_at.lock() <= live_at {
            return None;
        }
        match judge(&sbx.token, &s, operation, now) {
            Verdict::Invalid => None,
            v => Some((sbx.clone(), v)),
        }
    })
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(expiration: Option<&str>) -> Signed {
        Signed {
            path: "a.txt".into(),
            user: "user".into(),
            signature: String::new(),
            expiration: expiration.map(String::from),
        }
    }

    #[test]
    fn signatures_are_e2bs() {
        // The SDK's: v1_ + unpadded base64 of sha256("a.txt:read:user:tok").
        let digest = Sha256::digest(b"a.txt:read:user:tok");
        let expected = format!(
            "v1_{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
        );
        assert_eq!(signature("tok", &parts(None), "read"), expected);
        assert!(!expected.ends_with('='));
    }

    #[test]
    fn a_signature_binds_the_token_path_operation_and_expiry() {
        let mut s = parts(Some("1000"));
        s.signature = signature("tok", &s, "read");
        assert_eq!(judge("tok", &s, "read", 999), Verdict::Valid);
        assert_eq!(judge("tok", &s, "read", 1000), Verdict::Valid);
        assert_eq!(judge("tok", &s, "read", 1001), Verdict::Expired);
        assert_eq!(judge("other", &s, "read", 999), Verdict::Invalid);
        assert_eq!(judge("tok", &s, "write", 999), Verdict::Invalid);
        let mut moved = parts(Some("1000"));
        moved.path = "b.txt".into();
        moved.signature = s.signature.clone();
        assert_eq!(judge("tok", &moved, "read", 999), Verdict::Invalid);
        let mut later = parts(Some("2000"));
        later.signature = s.signature.clone();
        assert_eq!(judge("tok", &later, "read", 999), Verdict::Invalid);
    }
}
