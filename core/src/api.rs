//! The JSON bodies of the HTTP API that carry work (`docs/http-api.md`): what an
//! execution and a sandbox are asked with, and the one parser every body goes through.
//!
//! They live here, beside the types they build, so that the server, clients and the
//! fuzz targets (`paddock_core::fuzzing::http_bodies`) share them.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::exec::{ExecOrder, ExecRequest};
use crate::isolation::{EngineName, IsolationLevel, NetworkPolicy};
use crate::limits::Limits;
use crate::program::Program;
use crate::strict::Strict;

/// The body of `POST /v1/executions` and `POST /v1/sandboxes/{id}/exec`.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ExecBody {
    /// The engine (the configured default when absent).
    #[serde(default)]
    pub engine: Option<EngineName>,
    /// What to run.
    #[serde(deserialize_with = "program_object")]
    #[cfg_attr(feature = "schema", schemars(with = "Program"))]
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
    /// In a fleet, what to do if the node running it is lost: `report` (answer
    /// `NODE_LOST`) or `retry` (run it on another node); the fleet's
    /// `on_node_loss` when absent. A single node ignores it.
    #[serde(default)]
    pub on_node_loss: Option<crate::fleet::OnNodeLoss>,
}

impl ExecBody {
    /// The order for `tenant`: the request, with the engine, level, network and
    /// `on_node_loss` asked for (no trace: that comes in a header).
    pub fn into_order(self, tenant: Option<String>) -> ExecOrder {
        let mut request = ExecRequest::new(self.program);
        request.stdin = self.stdin;
        request.env = self.env;
        request.cwd = self.cwd;
        request.limits = self.limits;
        request.tenant = tenant;
        ExecOrder {
            request,
            engine: self.engine,
            level: self.level,
            network: self.network,
            traceparent: None,
            on_node_loss: self.on_node_loss,
        }
    }
}

/// The body of `POST /v1/sandboxes` (an empty body means all defaults).
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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

/// A [`Program`] from a JSON object only. [`Program`] is an untagged enum, which
/// buffers its input before it tries each variant, so the derived form would also
/// take a variant's fields as an array (`"program": [["ls"]]`); [`Strict`] cannot
/// reach inside that buffer, so the shape is checked here.
fn program_object<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Program, D::Error> {
    use serde::de::{Error as _, Unexpected};
    let value = serde_json::Value::deserialize(deserializer)?;
    let unexpected = match &value {
        serde_json::Value::Object(_) => {
            return Program::deserialize(value).map_err(D::Error::custom)
        }
        serde_json::Value::Array(_) => Unexpected::Seq,
        serde_json::Value::Null => Unexpected::Unit,
        serde_json::Value::Bool(b) => Unexpected::Bool(*b),
        serde_json::Value::Number(_) => Unexpected::Other("a number"),
        serde_json::Value::String(s) => Unexpected::Str(s),
    };
    Err(D::Error::invalid_type(
        unexpected,
        &"a program: {\"command\": […]}, {\"language\": …, \"code\": …}, {\"handler\": …} or {\"resume\": …}",
    ))
}

/// Parses a JSON body; a malformed or misshapen one is `INVALID_OPTIONS` naming the
/// field at fault (`limits.memory_bytes: invalid type…`), or `body` for the whole.
/// A struct is read from a JSON object only, never from an array of its fields.
pub fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(Strict(&mut de)).map_err(|e| {
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
        let order = b.into_order(Some("t".into()));
        assert_eq!(order.request.limits.timeout_ms, Some(5));
        assert_eq!(order.request.tenant.as_deref(), Some("t"));
        assert!(order.engine.is_none());
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

    #[test]
    fn a_struct_is_an_object_never_an_array_of_its_fields() {
        // serde's derived structs would take these (in field order); the API's
        // bodies are objects, as its OpenAPI document says.
        for (body, field) in [
            (
                &br#"{"program": {"command": ["true"]}, "limits": []}"#[..],
                "limits",
            ),
            (
                br#"{"program": {"command": ["true"]}, "limits": [5000]}"#,
                "limits",
            ),
            (br#"{"program": [["true"]]}"#, "program"),
            (br#"{"program": ["handler"]}"#, "program"),
            (
                br#"{"program": {"command": ["true"]}, "network": {"allowlist": [["h"]]}}"#,
                "network",
            ),
        ] {
            let e = parse_body::<ExecBody>(body).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidOptions);
            assert!(e.message.contains(&format!("field `{field}")), "{e}");
            assert!(e.message.contains("invalid type"), "{e}");
        }
        for body in [&b"[]"[..], b"[null, null]", br#"{"limits": [null]}"#] {
            let e = parse_body::<SandboxBody>(body).unwrap_err();
            assert!(e.message.contains("invalid type: sequence"), "{e}");
        }
        let e = parse_body::<crate::TerminalSpec>(br#"{"size": [24, 80]}"#).unwrap_err();
        assert!(e.message.contains("`size`"), "{e}");
        assert!(parse_body::<crate::TerminalSpec>(b"[]").is_err());
        // Arrays where the API takes arrays, and anything inside a JSON input, pass.
        let b: ExecBody = parse_body(
            br#"{"program": {"handler": "h", "input": [[1], {"a": []}]},
                 "network": {"allowlist": {"hosts": ["example.org"]}},
                 "limits": {"timeout_ms": 5}}"#,
        )
        .unwrap();
        assert_eq!(b.program.kind(), crate::ProgramKind::Invoke);
        assert_eq!(b.limits.timeout_ms, Some(5));
        let b: ExecBody = parse_body(br#"{"program": {"command": ["sh", "-c", "true"]}}"#).unwrap();
        assert_eq!(b.program, Program::command(["sh", "-c", "true"]));
        let e = parse_body::<ExecBody>(br#"{"program": {"command": ["true"], "bogus": 1}}"#)
            .unwrap_err();
        assert!(e.message.contains("`program`"), "{e}");
    }
}
