//! `PaddockConfig::from_toml_str` / `from_json_str` on arbitrary text: no panic, only
//! INVALID_CONFIG errors, and every accepted config round-trips through TOML and JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = paddock::fuzzing::config_parse(data);
});
