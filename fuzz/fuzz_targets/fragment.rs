//! Erasure fragments: checks, headers, decoding beside genuine fragments.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    veriflow_checkpoint::fuzzing::fragment_bytes(data);
});
