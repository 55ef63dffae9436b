//! Reading a frame out of a parsed JSON value: the version, the kind and every field
//! of the kind, each error naming the field.

use serde_json::{Map, Value};

use super::error::{excerpt, ProtocolError, ProtocolErrorKind};
use super::{Frame, FrameKind, HandlerError, PROTOCOL_VERSION};
use crate::exec::StreamKind;

impl Frame {
    /// Builds a frame from an already parsed JSON value, with every check
    /// [`parse`](super::parse) makes after JSON parsing: `v`, `kind`, and the fields of
    /// the kind.
    pub fn from_json_value(value: Value) -> Result<Frame, ProtocolError> {
        let mut obj = match value {
            Value::Object(obj) => obj,
            other => {
                return Err(ProtocolError::new(
                    ProtocolErrorKind::NotAnObject,
                    format!(
                        "frame is a JSON {}, not an object; every frame is one JSON object \
                         with \"v\":1 and a \"kind\"",
                        type_name(&other)
                    ),
                ))
            }
        };
        check_version(obj.get("v"))?;
        let kind = match obj.get("kind") {
            None => {
                return Err(ProtocolError::new(
                    ProtocolErrorKind::InvalidField,
                    format!("frame has no \"kind\" field; add one of {}", kind_list()),
                ))
            }
            Some(Value::String(name)) => FrameKind::from_wire(name).ok_or_else(|| {
                ProtocolError::new(
                    ProtocolErrorKind::UnknownKind,
                    format!(
                        "unknown frame kind `{}`; protocol v1 defines {}",
                        excerpt(name),
                        kind_list()
                    ),
                )
            })?,
            Some(other) => {
                return Err(ProtocolError::new(
                    ProtocolErrorKind::InvalidField,
                    format!(
                        "field `kind` must be a string, found {}; use one of {}",
                        type_name(other),
                        kind_list()
                    ),
                ))
            }
        };
        let mut fields = Fields {
            kind,
            prefix: "",
            obj: &mut obj,
        };
        let id = fields.id("id")?;
        let frame = match kind {
            FrameKind::Invoke => Frame::Invoke {
                id,
                input: fields.value("input")?,
                ctx: fields.ctx()?,
            },
            FrameKind::Resume => Frame::Resume {
                id,
                token_id: fields.id("token_id")?,
                value: fields.value("value")?,
            },
            FrameKind::Cancel => Frame::Cancel { id },
            FrameKind::Output => Frame::Output {
                id,
                output: fields.value("output")?,
            },
            FrameKind::Error => Frame::Error {
                id,
                error: fields.handler_error()?,
            },
            FrameKind::Suspend => Frame::Suspend {
                id,
                token_id: fields.id("token_id")?,
            },
            FrameKind::Log => Frame::Log {
                id,
                stream: fields.stream()?,
                data: fields.string("data")?,
            },
        };
        Ok(frame)
    }
}

fn check_version(v: Option<&Value>) -> Result<(), ProtocolError> {
    match v {
        Some(Value::Number(n)) if n.as_u64() == Some(PROTOCOL_VERSION) => Ok(()),
        None => Err(ProtocolError::new(
            ProtocolErrorKind::Version,
            "frame has no \"v\" field; this host speaks json-stdio protocol v1 only: \
             add \"v\":1 to every frame",
        )),
        Some(other) => Err(ProtocolError::new(
            ProtocolErrorKind::Version,
            format!(
                "unsupported protocol version {}; this host supports only v1: send \"v\":1",
                excerpt(&other.to_string())
            ),
        )),
    }
}

fn kind_list() -> String {
    let names: Vec<&str> = FrameKind::ALL.iter().map(|k| k.as_str()).collect();
    names.join(", ")
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Takes the fields of one frame out of its JSON object, naming the field and the kind
/// in every error.
struct Fields<'a> {
    kind: FrameKind,
    /// Prepended to field names in messages: `"error."` inside the `error` object.
    prefix: &'static str,
    obj: &'a mut Map<String, Value>,
}

impl Fields<'_> {
    fn invalid(&self, message: String) -> ProtocolError {
        ProtocolError::new(
            ProtocolErrorKind::InvalidField,
            format!("`{}` frame: {message}", self.kind),
        )
    }

    fn value(&mut self, field: &str) -> Result<Value, ProtocolError> {
        self.obj.remove(field).ok_or_else(|| {
            self.invalid(format!(
                "missing required field `{}{field}` (any JSON value, null included)",
                self.prefix
            ))
        })
    }

    fn string(&mut self, field: &str) -> Result<String, ProtocolError> {
        match self.obj.remove(field) {
            Some(Value::String(s)) => Ok(s),
            Some(other) => Err(self.invalid(format!(
                "field `{}{field}` must be a string, found {}",
                self.prefix,
                type_name(&other)
            ))),
            None => Err(self.invalid(format!(
                "missing required string field `{}{field}`",
                self.prefix
            ))),
        }
    }

    /// A string that identifies something, so it must not be empty.
    fn id(&mut self, field: &str) -> Result<String, ProtocolError> {
        let s = self.string(field)?;
        if s.is_empty() {
            return Err(self.invalid(format!("field `{}{field}` must not be empty", self.prefix)));
        }
        Ok(s)
    }

    fn ctx(&mut self) -> Result<Option<Map<String, Value>>, ProtocolError> {
        match self.obj.remove("ctx") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(ctx)) => Ok(Some(ctx)),
            Some(other) => Err(self.invalid(format!(
                "field `ctx` must be an object (or absent), found {}",
                type_name(&other)
            ))),
        }
    }

    fn stream(&mut self) -> Result<StreamKind, ProtocolError> {
        match self.string("stream")?.as_str() {
            "stdout" => Ok(StreamKind::Stdout),
            "stderr" => Ok(StreamKind::Stderr),
            other => Err(self.invalid(format!(
                "field `stream` must be \"stdout\" or \"stderr\", found `{}`",
                excerpt(other)
            ))),
        }
    }

    fn handler_error(&mut self) -> Result<HandlerError, ProtocolError> {
        let mut obj = match self.obj.remove("error") {
            Some(Value::Object(obj)) => obj,
            Some(other) => {
                return Err(self.invalid(format!(
                    "field `error` must be an object {{\"code\":…,\"message\":…}}, found {}",
                    type_name(&other)
                )))
            }
            None => {
                return Err(self
                    .invalid("missing required field `error` ({\"code\":…,\"message\":…})".into()))
            }
        };
        let mut inner = Fields {
            kind: self.kind,
            prefix: "error.",
            obj: &mut obj,
        };
        Ok(HandlerError {
            code: inner.id("code")?,
            message: inner.string("message")?,
        })
    }
}
