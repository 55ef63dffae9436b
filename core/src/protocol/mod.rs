//! The json-stdio protocol, version 1: how a host and a handler process talk over the
//! handler's stdin and stdout.
//!
//! Frames are JSON objects, one a line, each carrying `"v":1` and a `"kind"`. The host
//! writes `invoke`, `resume` and `cancel`; the handler answers with `log`, then exactly
//! one of `output`, `error` or `suspend`. `docs/protocol.md` in the repository is the
//! full specification, written for handler authors in any language.
//!
//! - [`Frame`] is one frame; [`encode`] writes it as a line and [`parse`] reads one
//!   line back, checking the version, the kind and every field.
//! - [`FrameDecoder`] reads a stream that arrives in arbitrary chunks, bounds each
//!   frame's size (1 MiB by default) and never holds more than that.
//! - Everything malformed becomes a [`ProtocolError`], which converts into a
//!   [`crate::Error`] with [`crate::ErrorCode::ProtocolError`]. Nothing here panics on
//!   any input.
//!
//! ```
//! use paddock_core::protocol::{encode, parse, Frame, FrameDecoder};
//! use serde_json::json;
//!
//! let line = encode(&Frame::output("job-1", json!({"sum": 3})));
//! assert_eq!(line, b"{\"v\":1,\"kind\":\"output\",\"id\":\"job-1\",\"output\":{\"sum\":3}}\n");
//! assert_eq!(parse(&line).unwrap(), Frame::output("job-1", json!({"sum": 3})));
//!
//! // The same bytes, arriving in two pieces.
//! let mut decoder = FrameDecoder::new();
//! let (head, tail) = line.split_at(10);
//! assert!(decoder.decode(head).is_empty());
//! assert_eq!(decoder.decode(tail), vec![Ok(Frame::output("job-1", json!({"sum": 3})))]);
//!
//! // A frame from a different protocol version is a PROTOCOL_ERROR.
//! let err = parse(br#"{"v":2,"kind":"output","id":"a","output":1}"#).unwrap_err();
//! let err = paddock_core::Error::from(err);
//! assert_eq!(err.code, paddock_core::ErrorCode::ProtocolError);
//! assert!(err.message.contains("supports only v1"));
//! ```

mod decoder;
mod error;
mod fields;
mod frame;
mod kind;

pub use decoder::{decode_all, FrameDecoder, DEFAULT_MAX_FRAME_SIZE};
pub use error::{ProtocolError, ProtocolErrorKind};
pub use frame::{encode, parse, Frame, HandlerError};
pub use kind::{Direction, FrameKind, PROTOCOL_VERSION, SUSPEND_EXIT_CODE};
