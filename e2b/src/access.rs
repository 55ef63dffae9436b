//! Who may reach which port of a sandbox, decided in one place: the routing and the
//! per-tenant count both take their answer from here, so they cannot disagree.
//!
//! - A port is a number, parsed once: decimal digits without a sign or leading
//!   zeros, 1 to 65535 (`049983` and `+49983` are no ports, not another spelling of
//!   the agent's).
//! - The agent's port (49983) takes the sandbox's access token (`X-Access-Token`);
//!   the code interpreter's (49999) that token or the traffic token
//!   (`E2B-Traffic-Access-Token`). The sandbox's other ports take the traffic token,
//!   or nothing when the sandbox was created with `network.allowPublicTraffic: true`,
//!   as on E2B.
//! - A signed file URL (`GET` or `POST /files` with a `signature`, see
//!   [`crate::signed`]) stands for the access token on the agent's port.
//! - A request without what its port takes is answered exactly as one for a sandbox
//!   that does not exist, whether the sandbox exists, is paused or has ended: an id
//!   alone tells a stranger nothing.

use actix_web::dev::RequestHead;

use crate::registry::{Inner, Sbx};
use crate::{CODE_INTERPRETER_PORT, ENVD_PORT};

/// A port as E2B's addressing writes it (`E2b-Sandbox-Port`, or the `{port}-` of a
/// host name): 1 to 65535 in decimal, without a sign or leading zeros, so that each
/// port has one spelling. Anything else is `None`.
pub(crate) fn parse_port(s: &str) -> Option<u16> {
    let canonical = !s.is_empty()
        && s.len() <= 5
        && !s.starts_with('0')
        && s.bytes().all(|b| b.is_ascii_digit());
    canonical.then(|| s.parse::<u16>().ok()).flatten()
}

/// How a sandbox may be reached from outside, fixed when it is created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Ingress {
    /// `network.allowPublicTraffic`: its own ports (not 49983 or 49999) answer
    /// without a token.
    pub(crate) public: bool,
}

impl Ingress {
    /// What the create request asked: public only when `allowPublicTraffic` is
    /// `true` (omitted, Paddock's default is private: E2B's is the project's, true
    /// unless the project changed it).
    pub(crate) fn asked(allow_public_traffic: Option<bool>) -> Ingress {
        Ingress {
            public: allow_public_traffic == Some(true),
        }
    }

    /// Whether a sandbox created with it gets a traffic token: one whose ports are
    /// private needs one for them, and the code interpreter's SDK sends one with
    /// every call.
    pub(crate) fn needs_traffic_token(self, code_interpreter: bool) -> bool {
        code_interpreter || !self.public
    }
}

/// The sandbox a request reached and what it may do there, as the count found it
/// (kept in the request, so that the routing does not look again).
#[derive(Clone)]
pub(crate) struct Reached {
    pub(crate) sbx: std::sync::Arc<crate::registry::Sbx>,
    pub(crate) access: Access,
}

/// What a request may do with the port it addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// The agent's or the interpreter's port with the sandbox's token: counted for
    /// the sandbox's owner.
    Agent,
    /// One of the sandbox's own ports, public or with its traffic token: counted per
    /// sandbox, so that whoever holds a shared URL cannot use up the owner's places.
    Ports,
    /// Without what the port takes: answered at once as a sandbox that does not
    /// exist, and not counted.
    Refused,
    /// A signed file URL of the sandbox's whose expiry has passed: answered 401, as
    /// E2B's agent does, and not counted.
    Expired,
}

/// What a request (`head`) may do with `port` of `sbx`. Tokens and signatures are
/// compared in constant time.
pub(crate) fn access(sbx: &Sbx, port: u16, head: &RequestHead) -> Access {
    let headers = &head.headers;
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    };
    let token = || sbx.token_matches(header("x-access-token"));
    let traffic = || sbx.traffic_token_matches(header("e2b-traffic-access-token"));
    let admitted = match port {
        ENVD_PORT => {
            if token() {
                return Access::Agent;
            }
            // A signed file URL (`download_url`, `upload_url`) stands for the token.
            return match crate::signed::verdict(sbx, head) {
                Some(crate::signed::Verdict::Valid) => Access::Agent,
                Some(crate::signed::Verdict::Expired) => Access::Expired,
                _ => Access::Refused,
            };
        }
        CODE_INTERPRETER_PORT => {
            return if token() || traffic() {
                Access::Agent
            } else {
                Access::Refused
            }
        }
        _ => sbx.ingress.public || traffic(),
    };
    if admitted {
        Access::Ports
    } else {
        Access::Refused
    }
}

/// Sandbox `id` while it lives: `None` once its lifetime has passed, whether or not
/// the reaper has ended it yet.
pub(crate) fn live(inner: &Inner, id: &str) -> Option<std::sync::Arc<Sbx>> {
    let s = inner.sandboxes.get(id)?.clone();
    let alive = *s.end_at.lock() > std::time::SystemTime::now();
    alive.then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_has_one_spelling() {
        for (text, port) in [
            ("49983", Some(49983)),
            ("1", Some(1)),
            ("65535", Some(65535)),
            ("8000", Some(8000)),
            ("049983", None),
            ("+49983", None),
            ("-1", None),
            ("0", None),
            ("00", None),
            ("65536", None),
            ("99999", None),
            ("4998３", None),
            (" 49983", None),
            ("49983 ", None),
            ("0x1f4", None),
            ("", None),
            ("1000000", None),
        ] {
            assert_eq!(parse_port(text), port, "{text:?}");
        }
    }

    #[test]
    fn private_sandboxes_and_interpreters_get_a_traffic_token() {
        assert!(Ingress::asked(None).needs_traffic_token(false));
        assert!(Ingress::asked(Some(false)).needs_traffic_token(false));
        assert!(!Ingress::asked(Some(true)).needs_traffic_token(false));
        assert!(Ingress::asked(Some(true)).needs_traffic_token(true));
        assert!(!Ingress::asked(None).public);
    }
}
