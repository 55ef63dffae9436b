//! The names a fleet uses on NATS: subjects, streams, buckets and keys, all under
//! the fleet's prefix (`fleet.prefix`) so that several fleets can share a cluster.
//!
//! Everything a caller chooses (an engine's name, a tenant, an idempotency key) is
//! encoded before it becomes part of a name: NATS gives `.`, `*`, `>` and
//! whitespace meanings of their own.

use paddock_core::{EngineName, ExecutionId};
use sha2::{Digest, Sha256};

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// A token safe in subjects, stream names and keys alike: `s` itself when it is
/// made of letters, digits, `-` and `_` only (and short), else `x` and its hex (so
/// two different inputs never share a token).
pub(crate) fn token(s: &str) -> String {
    if crate::config::is_token(s) && !s.starts_with('x') {
        s.to_string()
    } else if s.len() <= 40 {
        format!("x{}", hex(s.as_bytes()))
    } else {
        // Long names: a digest (NATS names have a length limit of their own).
        format!("x{}", hex(&Sha256::digest(s.as_bytes())[..20]))
    }
}

/// The token of a tenant (`_` for work without one).
pub(crate) fn tenant_token(tenant: Option<&str>) -> String {
    match tenant {
        None => "_".into(),
        Some(t) => format!("t{}", hex(&Sha256::digest(t.as_bytes())[..12])),
    }
}

/// Every name of one fleet.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    prefix: String,
}

impl Names {
    pub(crate) fn new(prefix: &str) -> Names {
        Names {
            prefix: prefix.to_string(),
        }
    }

    /// The work-queue stream of an engine.
    pub(crate) fn work_stream(&self, engine: &EngineName) -> String {
        format!("{}_WORK_{}", self.prefix, token(engine.as_str()))
    }

    /// The subject work for an engine is published on.
    pub(crate) fn work_subject(&self, engine: &EngineName) -> String {
        format!("{}.work.{}", self.prefix, token(engine.as_str()))
    }

    /// The audit stream.
    pub(crate) fn audit_stream(&self) -> String {
        format!("{}_AUDIT", self.prefix)
    }

    /// The subject of a tenant's audit entries.
    pub(crate) fn audit_subject(&self, tenant: Option<&str>) -> String {
        format!("{}.audit.{}", self.prefix, tenant_token(tenant))
    }

    /// Every audit subject.
    pub(crate) fn audit_all(&self) -> String {
        format!("{}.audit.>", self.prefix)
    }

    /// The bucket of execution records.
    pub(crate) fn exec_bucket(&self) -> String {
        format!("{}_exec", self.prefix)
    }

    /// The bucket of idempotency keys.
    pub(crate) fn idem_bucket(&self) -> String {
        format!("{}_idem", self.prefix)
    }

    /// The bucket of per-tenant rate counters.
    pub(crate) fn rate_bucket(&self) -> String {
        format!("{}_rate", self.prefix)
    }

    /// The bucket of per-tenant holds (concurrency caps).
    pub(crate) fn shares_bucket(&self) -> String {
        format!("{}_shares", self.prefix)
    }

    /// The bucket of sandbox owners.
    pub(crate) fn session_bucket(&self) -> String {
        format!("{}_sessions", self.prefix)
    }

    /// The bucket of node cards (heartbeats).
    pub(crate) fn node_bucket(&self) -> String {
        format!("{}_nodes", self.prefix)
    }

    /// The key of an execution's record.
    pub(crate) fn exec_key(id: &ExecutionId) -> String {
        id.to_string()
    }

    /// The key of an idempotency key.
    pub(crate) fn idem_key(tenant: Option<&str>, key: &str) -> String {
        format!(
            "{}.{}",
            tenant_token(tenant),
            hex(&Sha256::digest(key.as_bytes())[..16])
        )
    }

    /// Where a node receives the output and results of the work it accepted.
    pub(crate) fn inbox(&self, node: &str) -> String {
        format!("{}.node.{}.inbox", self.prefix, node)
    }

    /// Where a node answers requests about the work it runs or accepted.
    pub(crate) fn control(&self, node: &str) -> String {
        format!("{}.node.{}.ctl", self.prefix, node)
    }

    /// Where every node hears requests about work it may have accepted.
    pub(crate) fn broadcast(&self) -> String {
        format!("{}.all.ctl", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_safe_and_distinct() {
        for s in ["subprocess", "my-engine_2"] {
            assert_eq!(token(s), s);
        }
        let odd = ["a.b", "a b", "a*", ">", "", "x41", "é"];
        let mut seen = std::collections::HashSet::new();
        for s in odd {
            let t = token(s);
            assert!(crate::config::is_token(&t), "{s:?} -> {t}");
            assert!(seen.insert(t), "{s:?} collides");
        }
        // `x2e` is not taken for itself: it would collide with `token(".")`.
        assert_ne!(token("x2e"), token("."));
        let long = "e".repeat(200);
        assert!(crate::config::is_token(&token(&long)));
    }

    #[test]
    fn tenants_and_keys_make_safe_subjects() {
        let n = Names::new("paddock");
        let s = n.audit_subject(Some("acme.*>"));
        assert!(s.starts_with("paddock.audit.t"));
        assert_eq!(s.matches('.').count(), 2);
        assert_ne!(
            Names::idem_key(Some("a"), "k"),
            Names::idem_key(Some("b"), "k")
        );
        assert_ne!(Names::idem_key(None, "k"), Names::idem_key(Some("_"), "k"));
    }
}
