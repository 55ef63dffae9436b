//! `protocol::parse` on arbitrary bytes: no panic, only PROTOCOL_ERRORs, and every frame
//! that parses (plus one generated from the input) survives `parse(encode(f))`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = paddock_core::fuzzing::frame_parse(data);
});
