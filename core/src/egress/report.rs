//! What became of a sandbox's attempts to reach the network: events and the report
//! that gathers them.

use serde::{Deserialize, Serialize};

/// What became of one attempt of a sandbox to reach the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum EgressVerdict {
    /// Admitted and connected (or, for DNS, answered).
    Allowed,
    /// Refused by the policy.
    Denied,
    /// Admitted, but the target could not be reached.
    Failed,
}

/// How an attempt reached Paddock's gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum EgressVia {
    /// An HTTP `CONNECT` through the proxy (`HTTPS_PROXY`).
    Connect,
    /// A plain HTTP request through the proxy (`HTTP_PROXY`).
    Http,
    /// A TCP connection redirected to the gateway (a program that ignores proxies).
    Transparent,
    /// A DNS question to the sandbox's resolver.
    Dns,
}

/// One egress decision, as the audit entry of an execution or session lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EgressEvent {
    /// When the attempt was made (Unix milliseconds).
    pub at_ms: u64,
    /// How it reached the gateway.
    pub via: EgressVia,
    /// The host asked for (a name or an address), as the program gave it.
    pub host: String,
    /// The port asked for (53 for DNS).
    pub port: u16,
    /// The address dialled or answered, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// What became of it.
    pub verdict: EgressVerdict,
    /// The rule that admitted it, or why it was refused or failed.
    pub reason: String,
    /// Bytes from the sandbox to the target.
    #[serde(default)]
    pub bytes_out: u64,
    /// Bytes from the target to the sandbox.
    #[serde(default)]
    pub bytes_in: u64,
}

/// The most decisions one execution's result and audit entry list; later ones are
/// counted in [`EgressReport::omitted`].
pub const MAX_REPORTED_EVENTS: usize = 128;

/// What an execution's egress came to: its decisions, in order, and how many more
/// there were than a result lists (or than the gateway's bounded log kept).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EgressReport {
    /// The decisions, at most [`MAX_REPORTED_EVENTS`].
    pub events: Vec<EgressEvent>,
    /// Decisions made but not listed.
    #[serde(default)]
    pub omitted: u64,
    /// How many were allowed, of all of them (listed or not).
    #[serde(default)]
    pub allowed: u64,
    /// How many were denied, of all of them (listed or not).
    #[serde(default)]
    pub denied: u64,
}

impl EgressReport {
    /// The report of `events` (in order), of which the gateway's log lost `lost`
    /// before they were read.
    pub fn of(mut events: Vec<EgressEvent>, lost: u64) -> EgressReport {
        let allowed = events
            .iter()
            .filter(|e| e.verdict == EgressVerdict::Allowed)
            .count() as u64;
        let denied = events
            .iter()
            .filter(|e| e.verdict == EgressVerdict::Denied)
            .count() as u64;
        let cut = events.len().saturating_sub(MAX_REPORTED_EVENTS) as u64;
        events.truncate(MAX_REPORTED_EVENTS);
        EgressReport {
            events,
            omitted: cut + lost,
            allowed,
            denied,
        }
    }
}
