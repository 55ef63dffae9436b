//! `protocol::FrameDecoder` on arbitrary bytes: the same results however the input is
//! split, agreement with a line-by-line model, and a buffer that never passes the max.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = paddock_core::fuzzing::frame_decoder(data);
});
