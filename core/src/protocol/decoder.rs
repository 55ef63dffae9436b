//! [`FrameDecoder`]: turns a byte stream split anywhere into frames, in bounded memory.

use super::error::{ProtocolError, ProtocolErrorKind};
use super::frame::{parse, Frame};

/// The default maximum size of one frame: 1 MiB.
pub const DEFAULT_MAX_FRAME_SIZE: usize = 1 << 20;

/// An incremental decoder of newline-delimited frames.
///
/// Feed it bytes as they arrive with [`decode`](FrameDecoder::decode), in chunks split
/// anywhere (inside a frame, inside a UTF-8 sequence, between `\r` and `\n`); at end of
/// stream call [`finish`](FrameDecoder::finish). The sequence of results depends only
/// on the bytes, never on how they were split.
///
/// The rules, applied to each line (the bytes before a `\n`):
///
/// - a line longer than [`max_frame_size`](FrameDecoder::max_frame_size) bytes (not
///   counting the `\n`) yields one [`ProtocolErrorKind::TooLarge`] error as soon as
///   the limit is passed; the decoder then discards bytes up to the next `\n` and
///   carries on with the line after it;
/// - a line that is empty or holds only spaces, tabs and `\r` is skipped;
/// - any other line yields what [`parse`] gives for it: a frame or a
///   [`ProtocolError`], located by line number and byte offset;
/// - bytes after the last `\n` that are not blank make [`finish`](FrameDecoder::finish)
///   return a [`ProtocolErrorKind::Truncated`] error.
///
/// Memory is strictly bounded: the decoder keeps only the unfinished tail of the
/// current line, never more than `max_frame_size` bytes of it, and lines that end
/// inside one chunk are parsed in place without being copied.
/// [`buffered_len`](FrameDecoder::buffered_len) reports what it holds.
///
/// ```
/// use paddock_core::protocol::{FrameDecoder, Frame};
///
/// let mut decoder = FrameDecoder::new();
/// assert!(decoder.decode(b"{\"v\":1,\"kind\":\"can").is_empty());
/// let results = decoder.decode(b"cel\",\"id\":\"a\"}\n{\"v\":2}\n");
/// assert_eq!(results.len(), 2);
/// assert_eq!(results[0], Ok(Frame::cancel("a")));
/// assert_eq!(results[1].as_ref().unwrap_err().line, Some(2));
/// assert_eq!(decoder.finish(), None);
/// ```
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    max_frame_size: usize,
    /// The unfinished tail of the current line; never longer than `max_frame_size`.
    partial: Vec<u8>,
    /// The current line is too large: its error was reported and its bytes are being
    /// dropped until the next newline.
    discarding: bool,
    /// 1-based number of the current line.
    line: u64,
    /// Stream offset at which the current line starts.
    line_start: u64,
    /// Bytes consumed from the stream so far.
    consumed: u64,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder::new()
    }
}

impl FrameDecoder {
    /// A decoder with the default maximum frame size, [`DEFAULT_MAX_FRAME_SIZE`].
    pub fn new() -> FrameDecoder {
        FrameDecoder::with_max_frame_size(DEFAULT_MAX_FRAME_SIZE)
    }

    /// A decoder that refuses lines longer than `max_frame_size` bytes (not counting
    /// the terminating `\n`; a `\r` before it counts).
    pub fn with_max_frame_size(max_frame_size: usize) -> FrameDecoder {
        FrameDecoder {
            max_frame_size,
            partial: Vec::new(),
            discarding: false,
            line: 1,
            line_start: 0,
            consumed: 0,
        }
    }

    /// The largest line this decoder accepts, in bytes.
    pub fn max_frame_size(&self) -> usize {
        self.max_frame_size
    }

    /// How many bytes of an unfinished line the decoder holds; at most
    /// [`max_frame_size`](FrameDecoder::max_frame_size).
    pub fn buffered_len(&self) -> usize {
        self.partial.len()
    }

    /// The size of the allocation behind the buffer; like
    /// [`buffered_len`](FrameDecoder::buffered_len), never more than
    /// [`max_frame_size`](FrameDecoder::max_frame_size).
    pub fn buffer_capacity(&self) -> usize {
        self.partial.capacity()
    }

    /// How many bytes the decoder has consumed since it was created.
    pub fn bytes_consumed(&self) -> u64 {
        self.consumed
    }

    /// Decodes `bytes`, the next piece of the stream, and returns every frame and error
    /// completed by it, in stream order.
    pub fn decode(&mut self, bytes: &[u8]) -> Vec<Result<Frame, ProtocolError>> {
        let mut out = Vec::new();
        self.decode_with(bytes, |item| out.push(item));
        out
    }

    /// Like [`decode`](FrameDecoder::decode), but hands each result to `emit` instead
    /// of collecting them.
    pub fn decode_with(
        &mut self,
        mut bytes: &[u8],
        mut emit: impl FnMut(Result<Frame, ProtocolError>),
    ) {
        while !bytes.is_empty() {
            let Some(newline) = bytes.iter().position(|&b| b == b'\n') else {
                // No line ends in this chunk: keep (a bounded part of) it for later.
                if !self.discarding {
                    if self.partial.len() + bytes.len() > self.max_frame_size {
                        emit(Err(self.too_large()));
                        self.partial.clear();
                        self.discarding = true;
                    } else {
                        self.buffer(bytes);
                    }
                }
                self.consumed += bytes.len() as u64;
                return;
            };
            let (piece, rest) = (&bytes[..newline], &bytes[newline + 1..]);
            if self.discarding {
                self.discarding = false;
            } else if self.partial.len() + piece.len() > self.max_frame_size {
                emit(Err(self.too_large()));
                self.partial.clear();
            } else if self.partial.is_empty() {
                if let Some(item) = self.line_result(piece) {
                    emit(item);
                }
            } else {
                self.buffer(piece);
                let mut line = std::mem::take(&mut self.partial);
                if let Some(item) = self.line_result(&line) {
                    emit(item);
                }
                line.clear();
                self.partial = line;
            }
            self.consumed += newline as u64 + 1;
            self.line += 1;
            self.line_start = self.consumed;
            bytes = rest;
        }
    }

    /// Ends the stream: returns a [`ProtocolErrorKind::Truncated`] error if a
    /// non-blank line was left without its `\n`, and resets the decoder to the start of
    /// a line (line numbers and offsets keep counting).
    ///
    /// A line already reported as too large is not reported again.
    pub fn finish(&mut self) -> Option<ProtocolError> {
        let pending = std::mem::take(&mut self.partial);
        let was_discarding = std::mem::replace(&mut self.discarding, false);
        let error = if was_discarding || is_blank(&pending) {
            None
        } else {
            Some(
                ProtocolError::new(
                    ProtocolErrorKind::Truncated,
                    format!(
                        "stream ended after {} bytes of an unterminated frame; end every \
                         frame with a newline (\\n) and flush it",
                        pending.len()
                    ),
                )
                .at(self.line, self.line_start),
            )
        };
        if self.consumed > self.line_start {
            self.line += 1;
            self.line_start = self.consumed;
        }
        error
    }

    /// Appends to the partial line without letting its allocation grow past the
    /// maximum frame size (the caller has checked that the bytes fit).
    fn buffer(&mut self, bytes: &[u8]) {
        let needed = self.partial.len() + bytes.len();
        if needed > self.partial.capacity() {
            let target = needed
                .max(self.partial.capacity().saturating_mul(2))
                .min(self.max_frame_size);
            self.partial.reserve_exact(target - self.partial.len());
        }
        self.partial.extend_from_slice(bytes);
    }

    fn line_result(&self, line: &[u8]) -> Option<Result<Frame, ProtocolError>> {
        if is_blank(line) {
            return None;
        }
        Some(parse(line).map_err(|e| e.at(self.line, self.line_start)))
    }

    fn too_large(&self) -> ProtocolError {
        ProtocolError::new(
            ProtocolErrorKind::TooLarge,
            format!(
                "frame exceeds the maximum frame size of {} bytes and was discarded up to \
                 the next newline; send smaller frames (pass large data through files in \
                 the sandbox workdir) or raise the host's max_frame_size",
                self.max_frame_size
            ),
        )
        .at(self.line, self.line_start)
    }
}

/// Whether a line holds nothing but spaces, tabs and carriage returns.
fn is_blank(line: &[u8]) -> bool {
    line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r'))
}

/// Decodes a complete stream in one call: every line, then the end-of-stream check.
/// Handy in tests and for small captured outputs.
pub fn decode_all(bytes: &[u8], max_frame_size: usize) -> Vec<Result<Frame, ProtocolError>> {
    let mut decoder = FrameDecoder::with_max_frame_size(max_frame_size);
    let mut out = decoder.decode(bytes);
    out.extend(decoder.finish().map(Err));
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::protocol::encode;

    fn kinds(results: &[Result<Frame, ProtocolError>]) -> Vec<Result<String, ProtocolErrorKind>> {
        results
            .iter()
            .map(|r| match r {
                Ok(f) => Ok(f.id().to_string()),
                Err(e) => Err(e.kind),
            })
            .collect()
    }

    #[test]
    fn frames_split_byte_by_byte_decode_like_whole() {
        let mut stream = Vec::new();
        stream.extend(encode(&Frame::log(
            "a",
            crate::StreamKind::Stdout,
            "héllo ✓",
        )));
        stream.extend(b"\r\n  \n");
        stream.extend(encode(&Frame::output("a", json!({"k": [1, 2.5, null]}))));
        stream.extend(b"not json\r\n");
        stream.extend(encode(&Frame::cancel("b")));

        let whole = decode_all(&stream, 1024);
        let mut decoder = FrameDecoder::with_max_frame_size(1024);
        let mut split = Vec::new();
        for b in &stream {
            split.extend(decoder.decode(std::slice::from_ref(b)));
        }
        split.extend(decoder.finish().map(Err));
        assert_eq!(split, whole);
        assert_eq!(
            kinds(&whole),
            vec![
                Ok("a".into()),
                Ok("a".into()),
                Err(ProtocolErrorKind::InvalidJson),
                Ok("b".into())
            ]
        );
        let bad = whole[2].as_ref().unwrap_err();
        // Lines: log, "\r", "  ", output, "not json".
        assert_eq!(bad.line, Some(5));
        let offset = stream.windows(8).position(|w| w == b"not json").unwrap() as u64;
        assert_eq!(bad.offset, Some(offset));
        assert_eq!(decoder.bytes_consumed(), stream.len() as u64);
    }

    #[test]
    fn oversized_line_is_one_error_then_resync() {
        let max = 64;
        let mut stream = Vec::new();
        stream.extend(encode(&Frame::cancel("first")));
        stream.extend(vec![b'x'; 1000]);
        stream.push(b'\n');
        stream.extend(encode(&Frame::cancel("after")));

        for chunk in [1, 7, 64, 65, 2000] {
            let mut decoder = FrameDecoder::with_max_frame_size(max);
            let mut results = Vec::new();
            for piece in stream.chunks(chunk) {
                results.extend(decoder.decode(piece));
                assert!(decoder.buffered_len() <= max);
                assert!(
                    decoder.partial.capacity() <= max,
                    "capacity grew past the max"
                );
            }
            assert_eq!(decoder.finish(), None);
            assert_eq!(
                kinds(&results),
                vec![
                    Ok("first".into()),
                    Err(ProtocolErrorKind::TooLarge),
                    Ok("after".into())
                ],
                "chunk {chunk}"
            );
            let e = results[1].as_ref().unwrap_err();
            let first_len = encode(&Frame::cancel("first")).len() as u64;
            assert_eq!((e.line, e.offset), (Some(2), Some(first_len)));
            assert!(e.message.contains("64 bytes"), "{}", e.message);
        }
    }

    #[test]
    fn limit_is_exact_and_excludes_the_newline() {
        let line = encode(&Frame::cancel("a"));
        let len = line.len() - 1;
        assert!(decode_all(&line, len)[0].is_ok());
        assert_eq!(
            decode_all(&line, len - 1)[0].as_ref().unwrap_err().kind,
            ProtocolErrorKind::TooLarge
        );
        // A `\r` before the newline counts toward the limit.
        let mut crlf = line[..len].to_vec();
        crlf.extend(b"\r\n");
        assert_eq!(
            decode_all(&crlf, len)[0].as_ref().unwrap_err().kind,
            ProtocolErrorKind::TooLarge
        );
        assert!(decode_all(&crlf, len + 1)[0].is_ok());
    }

    #[test]
    fn end_of_stream_inside_a_frame_is_truncated() {
        let mut decoder = FrameDecoder::new();
        let unterminated = b"{\"v\":1,\"kind\":\"cancel\",\"id\":\"a\"}";
        assert_eq!(unterminated.len(), 32);
        assert!(decoder.decode(unterminated).is_empty());
        assert_eq!(decoder.buffered_len(), 32);
        let e = decoder.finish().unwrap();
        assert_eq!(e.kind, ProtocolErrorKind::Truncated);
        assert_eq!((e.line, e.offset), (Some(1), Some(0)));
        assert!(e.message.contains("32 bytes"), "{}", e.message);
        assert_eq!(decoder.buffered_len(), 0);
        // The decoder is usable afterwards and keeps counting lines.
        let r = decoder.decode(b"oops\n");
        assert_eq!(r[0].as_ref().unwrap_err().line, Some(2));
        assert_eq!(decoder.finish(), None);

        // Blank tails and oversized tails are not reported at the end.
        assert_eq!(decode_all(b"\r  ", 16), vec![]);
        let r = decode_all(&[b'x'; 40], 16);
        assert_eq!(kinds(&r), vec![Err(ProtocolErrorKind::TooLarge)]);
    }

    #[test]
    fn split_utf8_and_crlf_are_reassembled() {
        let line = encode(&Frame::log("é", crate::StreamKind::Stderr, "日本語"));
        let mut crlf = line[..line.len() - 1].to_vec();
        crlf.extend(b"\r\n");
        for cut in 0..=crlf.len() {
            let mut decoder = FrameDecoder::new();
            let mut out = decoder.decode(&crlf[..cut]);
            out.extend(decoder.decode(&crlf[cut..]));
            assert_eq!(out.len(), 1, "cut {cut}");
            assert_eq!(out[0].as_ref().unwrap().id(), "é");
            assert_eq!(decoder.buffered_len(), 0);
        }
    }

    #[test]
    fn decode_with_streams_results() {
        let mut decoder = FrameDecoder::new();
        let mut ids = Vec::new();
        let mut stream = encode(&Frame::cancel("x"));
        stream.extend(encode(&Frame::cancel("y")));
        decoder.decode_with(&stream, |r| ids.push(r.unwrap().id().to_string()));
        assert_eq!(ids, ["x", "y"]);
        assert_eq!(
            FrameDecoder::default().max_frame_size(),
            DEFAULT_MAX_FRAME_SIZE
        );
    }
}
