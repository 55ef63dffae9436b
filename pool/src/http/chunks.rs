//! Output chunks as NDJSON lines, losslessly: text where the bytes are UTF-8, base64
//! where they are not.
//!
//! A chunk boundary can fall inside a multi-byte character, so each stream keeps the
//! incomplete tail of a chunk (at most 3 bytes) and puts it in front of the next one:
//! a program that writes UTF-8 gets only `data` lines, whatever its writes' sizes.
//! Bytes that are not UTF-8 go out as one `data_base64` line holding the chunk's bytes
//! exactly.

use base64::Engine as _;
use paddock_core::StreamKind;
use serde_json::{json, Value};

/// The stream lines of one execution.
#[derive(Debug, Default)]
pub(super) struct ChunkLines {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

fn name(stream: StreamKind) -> &'static str {
    match stream {
        StreamKind::Stdout => "stdout",
        StreamKind::Stderr => "stderr",
    }
}

impl ChunkLines {
    fn held(&mut self, stream: StreamKind) -> &mut Vec<u8> {
        match stream {
            StreamKind::Stdout => &mut self.stdout,
            StreamKind::Stderr => &mut self.stderr,
        }
    }

    /// The line for a chunk of `stream`, or `None` when all of it is held (the start
    /// of a character that the next chunk completes).
    pub(super) fn line(&mut self, stream: StreamKind, data: &[u8]) -> Option<Value> {
        let held = self.held(stream);
        let mut bytes = std::mem::take(held);
        bytes.extend_from_slice(data);
        match std::str::from_utf8(&bytes) {
            Ok(text) => Some(text_line(stream, text)),
            Err(e) if e.error_len().is_none() => {
                // Valid up to an incomplete character at the end: hold that.
                let valid = e.valid_up_to();
                let tail = bytes.split_off(valid);
                *self.held(stream) = tail;
                let text = std::str::from_utf8(&bytes).ok()?;
                (!text.is_empty()).then(|| text_line(stream, text))
            }
            Err(_) => Some(binary_line(stream, &bytes)),
        }
    }

    /// Lines for what is still held when the output ends (bytes that never became a
    /// character).
    pub(super) fn finish(&mut self) -> Vec<Value> {
        [StreamKind::Stdout, StreamKind::Stderr]
            .into_iter()
            .filter_map(|stream| {
                let held = std::mem::take(self.held(stream));
                (!held.is_empty()).then(|| binary_line(stream, &held))
            })
            .collect()
    }
}

fn text_line(stream: StreamKind, text: &str) -> Value {
    json!({"type": name(stream), "data": text})
}

fn binary_line(stream: StreamKind, bytes: &[u8]) -> Value {
    json!({
        "type": name(stream),
        "data_base64": base64::engine::general_purpose::STANDARD.encode(bytes),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes a client gets back from the lines.
    fn decode(lines: &[Value], stream: &str) -> Vec<u8> {
        let mut out = Vec::new();
        for l in lines.iter().filter(|l| l["type"] == stream) {
            match (l.get("data"), l.get("data_base64")) {
                (Some(d), None) => out.extend_from_slice(d.as_str().unwrap().as_bytes()),
                (None, Some(b)) => out.extend(
                    base64::engine::general_purpose::STANDARD
                        .decode(b.as_str().unwrap())
                        .unwrap(),
                ),
                other => panic!("a line has exactly one of data and data_base64: {other:?}"),
            }
        }
        out
    }

    fn run(chunks: &[(StreamKind, &[u8])]) -> Vec<Value> {
        let mut c = ChunkLines::default();
        let mut lines: Vec<Value> = chunks.iter().filter_map(|(s, d)| c.line(*s, d)).collect();
        lines.extend(c.finish());
        lines
    }

    #[test]
    fn utf8_split_anywhere_stays_text() {
        let text = "héllo → wörld 🦀\n".as_bytes();
        for cut in 0..=text.len() {
            for cut2 in cut..=text.len() {
                let lines = run(&[
                    (StreamKind::Stdout, &text[..cut]),
                    (StreamKind::Stdout, &text[cut..cut2]),
                    (StreamKind::Stdout, &text[cut2..]),
                ]);
                assert!(
                    lines.iter().all(|l| l.get("data").is_some()),
                    "{cut}/{cut2}: {lines:?}"
                );
                assert_eq!(decode(&lines, "stdout"), text);
            }
        }
    }

    #[test]
    fn binary_comes_back_exactly() {
        let all: Vec<u8> = (0..=255u8).collect();
        let lines = run(&[
            (StreamKind::Stdout, &all[..100]),
            (StreamKind::Stderr, b"err \xff"),
            (StreamKind::Stdout, &all[100..]),
            // A character started and never finished.
            (StreamKind::Stderr, b"\xe2\x82"),
        ]);
        assert_eq!(decode(&lines, "stdout"), all);
        assert_eq!(decode(&lines, "stderr"), b"err \xff\xe2\x82");
        assert!(lines.iter().any(|l| l.get("data_base64").is_some()));
    }
}
