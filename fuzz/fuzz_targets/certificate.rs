//! Certificates: JSON text into `Certificate::from_json`, then the MAC check under a key (the
//! log check is not reached: no input can forge the MAC).
#![no_main]
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use veriflow_certifier::Certificate;
use veriflow_checkpoint::{Key, MemoryStore};

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(c) = Certificate::from_json(text) {
            let _ = c.to_json();
            assert!(c
                .verify(&Key::from_bytes([9; 32]), Arc::new(MemoryStore::default()))
                .is_err());
        }
    }
});
