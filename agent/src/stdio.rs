//! The agent's conversation with the host: protocol frames read from stdin and
//! written to stdout.

use std::collections::VecDeque;
use std::io::Write;

use paddock_core::protocol::{encode, Frame, FrameDecoder};

use crate::sys;
use crate::CHUNK;

/// Writes one frame to stdout.
pub(crate) fn send(frame: &Frame) {
    let bytes = encode(frame);
    let mut out = std::io::stdout().lock();
    // A host that went away ends the agent through stdin's EOF.
    let _ = out.write_all(&bytes);
    let _ = out.flush();
}

/// The host's side of the conversation: frames read from stdin.
pub(crate) struct Host {
    pub(crate) decoder: FrameDecoder,
    pub(crate) queued: VecDeque<Frame>,
    pub(crate) closed: bool,
}

impl Host {
    /// Reads what stdin has (once) and queues the frames in it.
    pub(crate) fn read(&mut self) {
        let mut buf = [0u8; CHUNK];
        let n = match sys::read(std::io::stdin(), &mut buf) {
            Ok(0) => {
                self.closed = true;
                return;
            }
            Ok(n) => n,
            Err(e) => {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    self.closed = true;
                }
                return;
            }
        };
        for item in self.decoder.decode(&buf[..n]) {
            match item {
                Ok(frame) => self.queued.push_back(frame),
                Err(e) => eprintln!("paddock-agent: ignoring a line that is not a frame: {e}"),
            }
        }
    }
}
