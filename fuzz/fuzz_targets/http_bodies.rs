//! The HTTP API's bodies (`POST /v1/executions`, `/v1/sandboxes`, `…/exec`,
//! `…/processes`, `…/terminals`, and the TCP target) on arbitrary bytes and on bodies
//! generated from them: no panic, only INVALID_OPTIONS refusals, and validation of
//! whatever parses never panics (`paddock_core::fuzzing::http_bodies`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = paddock_core::fuzzing::http_bodies(data);
});
