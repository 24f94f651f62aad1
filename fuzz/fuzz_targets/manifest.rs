//! The run manifest: the bytes as the stored value, and inside a sound frame.
#![no_main]
use libfuzzer_sys::fuzz_target;
use veriflow_runtime::codec;
use veriflow_runtime::log::{Manifest, MANIFEST_KEY};
use veriflow_runtime::{MemoryStore, Store};

fn load(bytes: &[u8]) {
    let store = MemoryStore::default();
    store.put(MANIFEST_KEY, bytes).expect("memory put");
    let _ = Manifest::load(&store);
}

fuzz_target!(|data: &[u8]| {
    load(data);
    load(&codec::frame(*b"VFM3", data));
});
