//! [`Caller`]: on whose behalf a call through the facade runs.
//!
//! Every lookup by id, cancel by id, audit search and statistics call takes one, so a
//! surface built on the facade (the HTTP API, a fleet node, an E2B-compatible API)
//! scopes its answers to the tenant it authenticated without re-implementing the
//! rule: a tenant sees only its own executions, sandboxes, audit entries and
//! figures, and another tenant's id is answered exactly like one that never existed.

/// On whose behalf a facade call runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Caller {
    /// A tenant, or (`None`) a caller without one. It sees only work accounted to
    /// the same tenant (`None` sees only work without a tenant).
    Tenant(Option<String>),
    /// An operator of a multi-tenant surface (named by the tenant of its key): it
    /// sees every tenant's work, and each call that reaches beyond its own tenant
    /// is recorded in the audit log's operator-access record.
    Operator(String),
    /// The program that embeds Paddock: trusted with everything, not recorded.
    Embedder,
}

impl Caller {
    /// A tenant by name.
    pub fn tenant(name: impl Into<String>) -> Caller {
        Caller::Tenant(Some(name.into()))
    }

    /// A tenant, or none.
    pub fn of(tenant: Option<&str>) -> Caller {
        Caller::Tenant(tenant.map(str::to_owned))
    }

    /// Whether the caller may see work accounted to `owner`.
    pub fn sees(&self, owner: Option<&str>) -> bool {
        match self {
            Caller::Tenant(t) => t.as_deref() == owner,
            Caller::Operator(_) | Caller::Embedder => true,
        }
    }

    /// The one tenant the caller is confined to, or `None` for callers that see
    /// every tenant.
    pub fn confined_to(&self) -> Option<Option<&str>> {
        match self {
            Caller::Tenant(t) => Some(t.as_deref()),
            Caller::Operator(_) | Caller::Embedder => None,
        }
    }

    /// Whether this is an operator.
    pub fn is_operator(&self) -> bool {
        matches!(self, Caller::Operator(_))
    }
}

#[cfg(test)]
mod tests {
    use super::Caller;

    #[test]
    fn tenants_see_only_their_own() {
        let alice = Caller::tenant("alice");
        assert!(alice.sees(Some("alice")));
        assert!(!alice.sees(Some("bob")));
        assert!(!alice.sees(None));
        let nobody = Caller::of(None);
        assert!(nobody.sees(None));
        assert!(!nobody.sees(Some("alice")));
        assert!(Caller::Operator("ops".into()).sees(Some("alice")));
        assert!(Caller::Embedder.sees(None));
        assert_eq!(alice.confined_to(), Some(Some("alice")));
        assert_eq!(Caller::Embedder.confined_to(), None);
    }
}
