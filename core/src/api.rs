//! The JSON bodies of the HTTP API that carry work (`docs/http-api.md`): what an
//! execution and a sandbox are asked with, and the one parser every body goes through.
//!
//! They live here, beside the types they build, so that the server, clients and the
//! fuzz targets (`paddock_core::fuzzing::http_bodies`) share them.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::exec::ExecRequest;
use crate::isolation::{EngineName, IsolationLevel, NetworkPolicy};
use crate::limits::Limits;
use crate::program::Program;

/// The body of `POST /v1/executions` and `POST /v1/sandboxes/{id}/exec`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecBody {
    /// The engine (the configured default when absent).
    #[serde(default)]
    pub engine: Option<EngineName>,
    /// What to run.
    pub program: Program,
    /// Its stdin.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The working directory inside the workdir.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Limits over the defaults.
    #[serde(default)]
    pub limits: Limits,
    /// The network policy.
    #[serde(default)]
    pub network: NetworkPolicy,
    /// The isolation level required.
    #[serde(default)]
    pub level: IsolationLevel,
}

impl ExecBody {
    /// The request for `tenant`, with the engine, network and level asked for.
    pub fn into_request(
        self,
        tenant: Option<String>,
    ) -> (
        ExecRequest,
        Option<EngineName>,
        NetworkPolicy,
        IsolationLevel,
    ) {
        let mut r = ExecRequest::new(self.program);
        r.stdin = self.stdin;
        r.env = self.env;
        r.cwd = self.cwd;
        r.limits = self.limits;
        r.tenant = tenant;
        (r, self.engine, self.network, self.level)
    }
}

/// The body of `POST /v1/sandboxes` (an empty body means all defaults).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxBody {
    /// The engine (the configured default when absent).
    #[serde(default)]
    pub engine: Option<EngineName>,
    /// The session's limits.
    #[serde(default)]
    pub limits: Limits,
    /// The network policy.
    #[serde(default)]
    pub network: NetworkPolicy,
    /// The isolation level required.
    #[serde(default)]
    pub level: IsolationLevel,
}

/// Parses a JSON body; a malformed or misshapen one is `INVALID_OPTIONS` naming the
/// field at fault (`limits.memory_bytes: invalid type…`), or `body` for the whole.
pub fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." || path.is_empty() {
            "body".to_string()
        } else {
            path
        };
        Error::invalid_options(&field, format!("{e}; see docs/http-api.md"))
    })?;
    // Trailing bytes after the value are an error too.
    de.end()
        .map_err(|e| Error::invalid_options("body", format!("{e}; see docs/http-api.md")))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    #[test]
    fn bodies_parse_and_errors_name_the_field() {
        let b: ExecBody =
            parse_body(br#"{"program": {"command": ["true"]}, "limits": {"timeout_ms": 5}}"#)
                .unwrap();
        let (r, engine, _, _) = b.into_request(Some("t".into()));
        assert_eq!(r.limits.timeout_ms, Some(5));
        assert_eq!(r.tenant.as_deref(), Some("t"));
        assert!(engine.is_none());
        let e = parse_body::<ExecBody>(
            br#"{"program": {"command": ["true"]}, "limits": {"memory_bytes": "x"}}"#,
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidOptions);
        assert!(e.message.contains("limits.memory_bytes"), "{e}");
        let e = parse_body::<SandboxBody>(b"{\"bogus\": 1}").unwrap_err();
        assert!(e.message.contains("bogus"), "{e}");
        let e = parse_body::<SandboxBody>(b"{} {}").unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidOptions);
        assert!(parse_body::<SandboxBody>(b"{}").is_ok());
    }
}
