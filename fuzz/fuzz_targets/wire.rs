//! Wire frames (Noise messages of a fixed session), their decryption, request/response payloads and the server's handler.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    veriflow_checkpoint::fuzzing::wire_bytes(data);
});
