//! The Connect protocol with JSON messages, as E2B's sandbox agent speaks it.
//!
//! - A unary call is `POST /<package>.<Service>/<Method>` with an `application/json`
//!   body; the answer is 200 with the JSON message, or an error status with
//!   `{"code": "<snake_case>", "message": …}`.
//! - A stream (`application/connect+json`) is a sequence of envelopes: one flag
//!   byte, a 4-byte big-endian length, then that many bytes of JSON. Flag `0x02`
//!   marks the last envelope, the end of the stream: `{}` or `{"error": {…}}`.

use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;

pub(crate) use crate::errors::{Code, ConnectError};

/// The flag of the end-of-stream envelope.
pub(crate) const END_STREAM: u8 = 0x02;
/// The flag of a compressed envelope, which Paddock never accepts (it offers no
/// compression).
const COMPRESSED: u8 = 0x01;
/// The content type of a Connect stream with JSON messages.
pub(crate) const STREAM_JSON: &str = "application/connect+json";

/// One envelope holding `message` as JSON.
pub(crate) fn envelope(flag: u8, message: &impl Serialize) -> Bytes {
    let json = serde_json::to_vec(message).unwrap_or_else(|_| b"{}".to_vec());
    let mut out = BytesMut::with_capacity(5 + json.len());
    out.put_u8(flag);
    out.put_u32(json.len() as u32);
    out.put_slice(&json);
    out.freeze()
}

/// The end-of-stream envelope: `{}`, or `{"error": …}`.
pub(crate) fn end_of_stream(error: Option<&ConnectError>) -> Bytes {
    match error {
        None => envelope(END_STREAM, &serde_json::json!({})),
        Some(e) => envelope(END_STREAM, &serde_json::json!({ "error": e.json() })),
    }
}

/// Reads envelopes from the bytes of a stream as they arrive.
#[derive(Debug)]
pub(crate) struct Decoder {
    buf: BytesMut,
    max_message: usize,
}

impl Decoder {
    /// A decoder refusing messages above `max_message` bytes.
    pub(crate) fn new(max_message: usize) -> Decoder {
        Decoder {
            buf: BytesMut::new(),
            max_message,
        }
    }

    /// Adds bytes read from the stream.
    pub(crate) fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole envelope, `None` until one has arrived whole, or an error for
    /// a compressed or oversized one.
    pub(crate) fn next(&mut self) -> Result<Option<(u8, Bytes)>, ConnectError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flag = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if flag & COMPRESSED != 0 {
            return Err(ConnectError::invalid(
                "a compressed envelope: this server offers no compression; send Connect-Content-Encoding identity",
            ));
        }
        if flag & !(COMPRESSED | END_STREAM) != 0 {
            return Err(ConnectError::invalid(format!(
                "an envelope with unknown flags {flag:#04x}"
            )));
        }
        if len > self.max_message {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!(
                    "an envelope of {len} bytes; at most {} are read",
                    self.max_message
                ),
            ));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let mut frame = self.buf.split_to(5 + len);
        let body = frame.split_off(5).freeze();
        Ok(Some((flag, body)))
    }

    /// Whether bytes of an unfinished envelope are left.
    pub(crate) fn has_partial(&self) -> bool {
        !self.buf.is_empty()
    }
}

/// Parses a unary request's JSON body into `T`, answering a malformed one with
/// `invalid_argument` that names the problem.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ConnectError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        body
    };
    serde_json::from_slice(body)
        .map_err(|e| ConnectError::invalid(format!("malformed request: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::StatusCode;
    use paddock_core::{Error, ErrorCode};

    #[test]
    fn envelopes_round_trip_in_pieces() {
        let a = envelope(0, &serde_json::json!({"x": 1}));
        let b = end_of_stream(None);
        let mut all = a.to_vec();
        all.extend_from_slice(&b);
        let mut d = Decoder::new(1 << 20);
        let mut got = Vec::new();
        for byte in all {
            d.push(&[byte]);
            while let Some(e) = d.next().unwrap() {
                got.push(e);
            }
        }
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, 0);
        assert_eq!(&got[0].1[..], br#"{"x":1}"#);
        assert_eq!(got[1].0, END_STREAM);
        assert_eq!(&got[1].1[..], b"{}");
        assert!(!d.has_partial());
    }

    #[test]
    fn bad_envelopes_are_refused_with_a_reason() {
        let mut d = Decoder::new(16);
        d.push(&[0, 0, 0, 1, 0]);
        assert_eq!(d.next().unwrap_err().code, Code::ResourceExhausted);
        let mut d = Decoder::new(16);
        d.push(&[COMPRESSED, 0, 0, 0, 1, b'x']);
        assert_eq!(d.next().unwrap_err().code, Code::InvalidArgument);
        let mut d = Decoder::new(16);
        d.push(&[0x80, 0, 0, 0, 0]);
        assert!(d.next().unwrap_err().message.contains("unknown flags"));
    }

    #[test]
    fn errors_end_a_stream_and_map_from_paddock_codes() {
        let e = ConnectError::from(Error::new(ErrorCode::NotFound, "no such sandbox"));
        assert_eq!(e.code, Code::NotFound);
        assert_eq!(e.unary().status(), StatusCode::NOT_FOUND);
        let end = end_of_stream(Some(&e));
        assert_eq!(end[0], END_STREAM);
        let v: serde_json::Value = serde_json::from_slice(&end[5..]).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
        assert!(parse::<serde_json::Value>(b"{nope").is_err());
        assert_eq!(
            parse::<serde_json::Value>(b" ").unwrap(),
            serde_json::json!({})
        );
    }
}
