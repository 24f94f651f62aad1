//! `--store` specs: parse, print back, parse again.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        veriflow_checkpoint::fuzzing::store_spec_text(text);
    }
});
