//! The frames of json-stdio protocol v1, and [`encode`] / [`parse`] for one line.
//!
//! On the wire a frame is one JSON object on one line:
//!
//! ```text
//! {"v":1,"kind":"invoke","id":"job-1","input":{"a":1},"ctx":{"tenant":"t1"}}
//! ```
//!
//! [`parse`] is strict about what protocol v1 defines and lenient about what it does
//! not:
//!
//! - `v` must be present and be the integer `1`; anything else is refused, and the
//!   message names the supported version.
//! - `kind` must be one of the seven v1 kinds; an unknown kind is refused, because a
//!   peer cannot safely skip a message whose meaning it does not know.
//! - every field v1 defines for a kind must be present (except the optional `ctx`)
//!   and have the right type; `id`, `token_id` and `error.code` must be non-empty.
//! - fields v1 does not define are ignored, so that a later minor revision can add
//!   optional fields without breaking v1 peers. [`encode`] never writes them, so they
//!   do not survive a round trip.
//! - JSON nesting is limited to 128 levels, counting the frame object itself.
//! - a key repeated within an object takes its last occurrence.

use serde::de::{Deserialize, Deserializer, Error as _};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

use super::error::{ProtocolError, ProtocolErrorKind};
use super::{Direction, FrameKind, PROTOCOL_VERSION};
use crate::exec::StreamKind;

/// The error a handler reports in an `error` frame.
///
/// `code` is the handler's own machine-readable code (any non-empty string; Paddock's
/// [`ErrorCode`](crate::ErrorCode) strings are a good choice but not required).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HandlerError {
    /// A short machine-readable code, for example `"VALUE_ERROR"`.
    pub code: String,
    /// Human-readable detail.
    pub message: String,
}

/// One json-stdio protocol v1 frame.
///
/// Serialized (with serde or [`encode`]) it is a JSON object `{"v":1,"kind":…,"id":…,…}`
/// with the fields below; deserializing checks `v` and `kind` exactly as [`parse`]
/// does, so `serde_json::from_str::<Frame>` and [`parse`] accept the same frames.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// Host → handler: run the handler on `input`.
    Invoke {
        /// The invocation id; every later frame about this invocation carries it.
        id: String,
        /// The handler's input: any JSON value, `null` included.
        input: Value,
        /// Optional context (tenant, deadline, …); omitted on the wire when `None`.
        ctx: Option<Map<String, Value>>,
    },
    /// Host → handler: continue the invocation suspended on `token_id`.
    Resume {
        /// The invocation id.
        id: String,
        /// The token the invocation suspended on.
        token_id: String,
        /// The value the token resolved to: any JSON value.
        value: Value,
    },
    /// Host → handler: stop the invocation.
    Cancel {
        /// The invocation id.
        id: String,
    },
    /// Handler → host: the invocation's result. Terminal.
    Output {
        /// The invocation id.
        id: String,
        /// The result: any JSON value.
        output: Value,
    },
    /// Handler → host: the invocation failed. Terminal.
    Error {
        /// The invocation id.
        id: String,
        /// What went wrong.
        error: HandlerError,
    },
    /// Handler → host: the invocation waits on an external token. Terminal for this
    /// turn; a one-shot handler then exits with
    /// [`SUSPEND_EXIT_CODE`](super::SUSPEND_EXIT_CODE).
    Suspend {
        /// The invocation id.
        id: String,
        /// The token the invocation waits on.
        token_id: String,
    },
    /// Handler → host: diagnostic output, delivered before the terminal frame.
    Log {
        /// The invocation id.
        id: String,
        /// Which stream the text belongs to.
        stream: StreamKind,
        /// The text.
        data: String,
    },
}

impl Frame {
    /// An `invoke` frame without context.
    pub fn invoke(id: impl Into<String>, input: Value) -> Frame {
        Frame::Invoke {
            id: id.into(),
            input,
            ctx: None,
        }
    }

    /// A `resume` frame.
    pub fn resume(id: impl Into<String>, token_id: impl Into<String>, value: Value) -> Frame {
        Frame::Resume {
            id: id.into(),
            token_id: token_id.into(),
            value,
        }
    }

    /// A `cancel` frame.
    pub fn cancel(id: impl Into<String>) -> Frame {
        Frame::Cancel { id: id.into() }
    }

    /// An `output` frame.
    pub fn output(id: impl Into<String>, output: Value) -> Frame {
        Frame::Output {
            id: id.into(),
            output,
        }
    }

    /// An `error` frame.
    pub fn error(
        id: impl Into<String>,
        code: impl Into<String>,
        message: impl Into<String>,
    ) -> Frame {
        Frame::Error {
            id: id.into(),
            error: HandlerError {
                code: code.into(),
                message: message.into(),
            },
        }
    }

    /// A `suspend` frame.
    pub fn suspend(id: impl Into<String>, token_id: impl Into<String>) -> Frame {
        Frame::Suspend {
            id: id.into(),
            token_id: token_id.into(),
        }
    }

    /// A `log` frame.
    pub fn log(id: impl Into<String>, stream: StreamKind, data: impl Into<String>) -> Frame {
        Frame::Log {
            id: id.into(),
            stream,
            data: data.into(),
        }
    }

    /// The frame's kind.
    pub fn kind(&self) -> FrameKind {
        match self {
            Frame::Invoke { .. } => FrameKind::Invoke,
            Frame::Resume { .. } => FrameKind::Resume,
            Frame::Cancel { .. } => FrameKind::Cancel,
            Frame::Output { .. } => FrameKind::Output,
            Frame::Error { .. } => FrameKind::Error,
            Frame::Suspend { .. } => FrameKind::Suspend,
            Frame::Log { .. } => FrameKind::Log,
        }
    }

    /// The invocation id the frame belongs to.
    pub fn id(&self) -> &str {
        match self {
            Frame::Invoke { id, .. }
            | Frame::Resume { id, .. }
            | Frame::Cancel { id }
            | Frame::Output { id, .. }
            | Frame::Error { id, .. }
            | Frame::Suspend { id, .. }
            | Frame::Log { id, .. } => id,
        }
    }

    /// Who sends this frame.
    pub fn direction(&self) -> Direction {
        self.kind().direction()
    }

    /// Whether this frame ends the handler's turn for its id (see
    /// [`FrameKind::is_terminal`]).
    pub fn is_terminal(&self) -> bool {
        self.kind().is_terminal()
    }
}

impl Serialize for Frame {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("v", &PROTOCOL_VERSION)?;
        map.serialize_entry("kind", self.kind().as_str())?;
        map.serialize_entry("id", self.id())?;
        match self {
            Frame::Invoke { input, ctx, .. } => {
                map.serialize_entry("input", input)?;
                if let Some(ctx) = ctx {
                    map.serialize_entry("ctx", ctx)?;
                }
            }
            Frame::Resume {
                token_id, value, ..
            } => {
                map.serialize_entry("token_id", token_id)?;
                map.serialize_entry("value", value)?;
            }
            Frame::Cancel { .. } => {}
            Frame::Output { output, .. } => map.serialize_entry("output", output)?,
            Frame::Error { error, .. } => map.serialize_entry("error", error)?,
            Frame::Suspend { token_id, .. } => map.serialize_entry("token_id", token_id)?,
            Frame::Log { stream, data, .. } => {
                map.serialize_entry("stream", stream)?;
                map.serialize_entry("data", data)?;
            }
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Frame {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Frame, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Frame::from_json_value(value).map_err(|e| D::Error::custom(e.message))
    }
}

/// Encodes a frame as one line: compact JSON followed by `\n`.
///
/// The output never contains a raw newline before the final one (JSON escapes control
/// characters inside strings), starts with `{"v":1,"kind":`, and `parse` gives the
/// frame back for every frame `parse` can produce. `encode` does not check its input:
/// a frame built in code with an empty `id` encodes, but `parse` refuses it.
pub fn encode(frame: &Frame) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    // Writing to a Vec cannot fail, and every map key the frame writes is a string, so
    // serde_json has no error to report here.
    if let Err(e) = serde_json::to_writer(&mut out, frame) {
        unreachable!("encoding a frame into memory failed: {e}");
    }
    out.push(b'\n');
    out
}

/// Parses one line into a frame.
///
/// `line` may end with `"\n"` or `"\r\n"`; it must not contain any other newline.
/// Every failure is a [`ProtocolError`] whose message says what was wrong; see the
/// module documentation for what is checked and what is ignored.
pub fn parse(line: &[u8]) -> Result<Frame, ProtocolError> {
    let line = strip_terminator(line);
    if let Some(at) = line.iter().position(|&b| b == b'\n') {
        return Err(ProtocolError::new(
            ProtocolErrorKind::NotOneLine,
            format!(
                "frame contains a newline at byte {at}; write each frame as a single line \
                 (JSON escapes newlines inside strings as \\n)"
            ),
        ));
    }
    if line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')) {
        return Err(ProtocolError::new(
            ProtocolErrorKind::Empty,
            "empty line; a frame is one JSON object on one line",
        ));
    }
    let text = std::str::from_utf8(line).map_err(|e| {
        ProtocolError::new(
            ProtocolErrorKind::InvalidUtf8,
            format!(
                "frame is not valid UTF-8 (bad byte at offset {}); encode frames as UTF-8 JSON",
                e.valid_up_to()
            ),
        )
    })?;
    let value: Value = serde_json::from_str(text).map_err(|e| {
        let full = e.to_string();
        let location = format!(" at line {} column {}", e.line(), e.column());
        let what = full.strip_suffix(&location).unwrap_or(&full);
        ProtocolError::new(
            ProtocolErrorKind::InvalidJson,
            format!(
                "malformed JSON at column {}: {what}; send one complete JSON object per line",
                e.column()
            ),
        )
    })?;
    Frame::from_json_value(value)
}

/// `line` without one trailing `"\n"` or `"\r\n"`.
pub(crate) fn strip_terminator(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn kind_of(line: &str) -> ProtocolErrorKind {
        parse(line.as_bytes()).unwrap_err().kind
    }

    fn message_of(line: &str) -> String {
        parse(line.as_bytes()).unwrap_err().message
    }

    #[test]
    fn encodes_v_and_kind_first_and_one_line() {
        let f = Frame::Invoke {
            id: "job-1".into(),
            input: json!({"text": "a\nb"}),
            ctx: Some(json!({"tenant": "t1"}).as_object().unwrap().clone()),
        };
        let bytes = encode(&f);
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            "{\"v\":1,\"kind\":\"invoke\",\"id\":\"job-1\",\"input\":{\"text\":\"a\\nb\"},\
             \"ctx\":{\"tenant\":\"t1\"}}\n"
        );
        assert_eq!(parse(&bytes).unwrap(), f);
    }

    #[test]
    fn every_kind_round_trips_with_exact_wire_form() {
        let cases = [
            (
                Frame::invoke("a", Value::Null),
                r#"{"v":1,"kind":"invoke","id":"a","input":null}"#,
            ),
            (
                Frame::resume("a", "tok", json!([1, 2])),
                r#"{"v":1,"kind":"resume","id":"a","token_id":"tok","value":[1,2]}"#,
            ),
            (Frame::cancel("a"), r#"{"v":1,"kind":"cancel","id":"a"}"#),
            (
                Frame::output("a", json!(3.5)),
                r#"{"v":1,"kind":"output","id":"a","output":3.5}"#,
            ),
            (
                Frame::error("a", "VALUE_ERROR", "bad input"),
                r#"{"v":1,"kind":"error","id":"a","error":{"code":"VALUE_ERROR","message":"bad input"}}"#,
            ),
            (
                Frame::suspend("a", "tok"),
                r#"{"v":1,"kind":"suspend","id":"a","token_id":"tok"}"#,
            ),
            (
                Frame::log("a", StreamKind::Stderr, "warn\n"),
                r#"{"v":1,"kind":"log","id":"a","stream":"stderr","data":"warn\n"}"#,
            ),
        ];
        let mut seen = Vec::new();
        for (frame, wire) in cases {
            assert_eq!(encode(&frame), format!("{wire}\n").into_bytes());
            assert_eq!(parse(wire.as_bytes()).unwrap(), frame);
            assert_eq!(serde_json::from_str::<Frame>(wire).unwrap(), frame);
            assert_eq!(serde_json::to_string(&frame).unwrap(), wire);
            assert_eq!(frame.id(), "a");
            seen.push(frame.kind());
        }
        assert_eq!(seen, FrameKind::ALL);
    }

    #[test]
    fn kinds_know_direction_and_terminality() {
        use Direction::*;
        let table: Vec<(FrameKind, Direction, bool)> = FrameKind::ALL
            .iter()
            .map(|&k| (k, k.direction(), k.is_terminal()))
            .collect();
        assert_eq!(
            table,
            vec![
                (FrameKind::Invoke, HostToHandler, false),
                (FrameKind::Resume, HostToHandler, false),
                (FrameKind::Cancel, HostToHandler, false),
                (FrameKind::Output, HandlerToHost, true),
                (FrameKind::Error, HandlerToHost, true),
                (FrameKind::Suspend, HandlerToHost, true),
                (FrameKind::Log, HandlerToHost, false),
            ]
        );
        for &k in FrameKind::ALL {
            assert_eq!(FrameKind::from_wire(k.as_str()), Some(k));
        }
        assert_eq!(FrameKind::from_wire("Invoke"), None);
        assert!(Frame::output("x", Value::Null).is_terminal());
        assert_eq!(Frame::cancel("x").direction(), HostToHandler);
    }

    #[test]
    fn tolerates_line_terminators_but_not_inner_newlines() {
        let f = Frame::cancel("a");
        assert_eq!(
            parse(b"{\"v\":1,\"kind\":\"cancel\",\"id\":\"a\"}\r\n").unwrap(),
            f
        );
        assert_eq!(
            parse(b"{\"v\":1,\"kind\":\"cancel\",\"id\":\"a\"}\n").unwrap(),
            f
        );
        assert_eq!(
            parse(b"  {\"v\":1,\"kind\":\"cancel\",\"id\":\"a\"}  ").unwrap(),
            f
        );
        assert_eq!(
            kind_of("{\"v\":1,\n\"kind\":\"cancel\",\"id\":\"a\"}"),
            ProtocolErrorKind::NotOneLine
        );
        assert_eq!(
            kind_of("{\"v\":1,\"kind\":\"cancel\",\"id\":\"a\"}\n\n"),
            ProtocolErrorKind::NotOneLine
        );
        assert_eq!(kind_of(""), ProtocolErrorKind::Empty);
        assert_eq!(kind_of(" \t\r\n"), ProtocolErrorKind::Empty);
    }

    #[test]
    fn version_is_mandatory_and_exact() {
        let m = message_of(r#"{"kind":"cancel","id":"a"}"#);
        assert!(m.contains("no \"v\"") && m.contains("v1"), "{m}");
        for bad in [r#""1""#, "1.0", "2", "0", "-1", "null", "[1]"] {
            let line = format!(r#"{{"v":{bad},"kind":"cancel","id":"a"}}"#);
            let e = parse(line.as_bytes()).unwrap_err();
            assert_eq!(e.kind, ProtocolErrorKind::Version, "{line}");
            assert!(e.message.contains("supports only v1"), "{}", e.message);
        }
        // The version is checked before the kind: a v2 frame with a v2-only kind is
        // reported as a version problem.
        assert_eq!(
            kind_of(r#"{"v":2,"kind":"stream_open","id":"a"}"#),
            ProtocolErrorKind::Version
        );
    }

    #[test]
    fn unknown_kinds_are_refused_and_unknown_fields_ignored() {
        let e = parse(br#"{"v":1,"kind":"ping","id":"a"}"#).unwrap_err();
        assert_eq!(e.kind, ProtocolErrorKind::UnknownKind);
        assert!(e.message.contains("`ping`") && e.message.contains("invoke, resume"));
        assert_eq!(
            kind_of(r#"{"v":1,"kind":"INVOKE","id":"a","input":1}"#),
            ProtocolErrorKind::UnknownKind
        );
        assert_eq!(
            kind_of(r#"{"v":1,"id":"a"}"#),
            ProtocolErrorKind::InvalidField
        );
        assert_eq!(
            kind_of(r#"{"v":1,"kind":7,"id":"a"}"#),
            ProtocolErrorKind::InvalidField
        );

        let f = parse(br#"{"v":1,"kind":"output","id":"a","output":1,"trace":{"x":[1]}}"#).unwrap();
        assert_eq!(f, Frame::output("a", json!(1)));
        let f = parse(
            br#"{"v":1,"kind":"error","id":"a","error":{"code":"E","message":"m","detail":1}}"#,
        )
        .unwrap();
        assert_eq!(f, Frame::error("a", "E", "m"));
    }

    #[test]
    fn repeated_keys_take_the_last_occurrence() {
        assert_eq!(
            parse(br#"{"v":2,"kind":"cancel","id":"a","v":1,"id":"b"}"#).unwrap(),
            Frame::cancel("b")
        );
        assert_eq!(
            kind_of(r#"{"v":1,"kind":"cancel","id":"a","v":2}"#),
            ProtocolErrorKind::Version
        );
    }

    #[test]
    fn known_fields_are_strict_and_named_in_errors() {
        let cases = [
            (
                r#"{"v":1,"kind":"cancel"}"#,
                "missing required string field `id`",
            ),
            (
                r#"{"v":1,"kind":"cancel","id":5}"#,
                "field `id` must be a string, found a number",
            ),
            (
                r#"{"v":1,"kind":"cancel","id":""}"#,
                "field `id` must not be empty",
            ),
            (
                r#"{"v":1,"kind":"invoke","id":"a"}"#,
                "missing required field `input`",
            ),
            (
                r#"{"v":1,"kind":"invoke","id":"a","input":1,"ctx":[]}"#,
                "field `ctx` must be an object",
            ),
            (
                r#"{"v":1,"kind":"resume","id":"a","value":1}"#,
                "missing required string field `token_id`",
            ),
            (
                r#"{"v":1,"kind":"resume","id":"a","token_id":"t"}"#,
                "missing required field `value`",
            ),
            (
                r#"{"v":1,"kind":"suspend","id":"a","token_id":""}"#,
                "field `token_id` must not be empty",
            ),
            (
                r#"{"v":1,"kind":"output","id":"a"}"#,
                "missing required field `output`",
            ),
            (
                r#"{"v":1,"kind":"error","id":"a","error":"boom"}"#,
                "field `error` must be an object",
            ),
            (
                r#"{"v":1,"kind":"error","id":"a","error":{"message":"m"}}"#,
                "missing required string field `error.code`",
            ),
            (
                r#"{"v":1,"kind":"error","id":"a","error":{"code":"","message":"m"}}"#,
                "field `error.code` must not be empty",
            ),
            (
                r#"{"v":1,"kind":"error","id":"a","error":{"code":"E","message":null}}"#,
                "field `error.message` must be a string, found null",
            ),
            (
                r#"{"v":1,"kind":"log","id":"a","stream":"stdin","data":"x"}"#,
                "field `stream` must be \"stdout\" or \"stderr\"",
            ),
            (
                r#"{"v":1,"kind":"log","id":"a","stream":"stdout","data":[1]}"#,
                "field `data` must be a string, found an array",
            ),
        ];
        for (line, expected) in cases {
            let e = parse(line.as_bytes()).unwrap_err();
            assert_eq!(e.kind, ProtocolErrorKind::InvalidField, "{line}");
            assert!(e.message.contains(expected), "{line}: {}", e.message);
            let kind = line
                .split("\"kind\":\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            assert!(
                e.message.starts_with(&format!("`{kind}` frame: ")),
                "{}",
                e.message
            );
        }
        // ctx: null is the same as no ctx.
        assert_eq!(
            parse(br#"{"v":1,"kind":"invoke","id":"a","input":1,"ctx":null}"#).unwrap(),
            Frame::invoke("a", json!(1))
        );
    }

    #[test]
    fn malformed_bytes_are_classified() {
        assert_eq!(kind_of("{\"v\":1,"), ProtocolErrorKind::InvalidJson);
        let m = message_of("{\"v\":1,}");
        assert!(m.starts_with("malformed JSON at column 8:"), "{m}");
        assert!(!m.contains("line 1"), "{m}");
        assert_eq!(kind_of("[1,2]"), ProtocolErrorKind::NotAnObject);
        assert!(message_of("\"x\"").contains("JSON a string, not an object"));
        assert_eq!(
            parse(b"{\"v\":1,\"kind\":\"cancel\",\"id\":\"\xff\"}")
                .unwrap_err()
                .kind,
            ProtocolErrorKind::InvalidUtf8
        );
        // Lone surrogates are not Unicode scalar values.
        assert_eq!(
            kind_of(r#"{"v":1,"kind":"cancel","id":"\ud800"}"#),
            ProtocolErrorKind::InvalidJson
        );
        // Deep nesting is refused, not a stack overflow.
        let deep = format!(
            r#"{{"v":1,"kind":"output","id":"a","output":{}1{}}}"#,
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        assert_eq!(kind_of(&deep), ProtocolErrorKind::InvalidJson);
        let ok = format!(
            r#"{{"v":1,"kind":"output","id":"a","output":{}1{}}}"#,
            "[".repeat(100),
            "]".repeat(100)
        );
        assert!(parse(ok.as_bytes()).is_ok());
    }

    #[test]
    fn quoted_untrusted_text_is_bounded() {
        let kind = "k".repeat(100_000);
        let m = message_of(&format!(r#"{{"v":1,"kind":"{kind}","id":"a"}}"#));
        assert!(m.len() < 300, "{} bytes", m.len());
        let m = message_of(&format!(r#"{{"v":"{kind}","kind":"cancel","id":"a"}}"#));
        assert!(m.len() < 300, "{} bytes", m.len());
    }

    #[test]
    fn serde_deserialize_applies_the_same_checks() {
        let e = serde_json::from_str::<Frame>(r#"{"kind":"cancel","id":"a"}"#).unwrap_err();
        assert!(e.to_string().contains("\"v\""), "{e}");
        assert!(serde_json::from_str::<Frame>(r#"{"v":1,"kind":"nope","id":"a"}"#).is_err());
    }
}
