//! Log segments: the bytes as a stored segment value, and as the payload of a sound frame (past
//! the digest, what a writer with access to the store could put there).
#![no_main]
use libfuzzer_sys::fuzz_target;
use veriflow_runtime::codec;
use veriflow_runtime::log::segment::{decode_segment, SEGMENT_MAGIC};

fn check(bytes: &[u8]) {
    if let Ok(seg) = decode_segment(bytes) {
        assert!(seg.events.len() * 4 <= bytes.len());
        assert!(seg.events.capacity() <= (1 << 16).max(2 * seg.events.len()));
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    check(&codec::frame(SEGMENT_MAGIC, data));
});
