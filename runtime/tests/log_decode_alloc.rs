//! Allocation of the segment decoder on a damaged segment, measured by a counting allocator
//! (its own test binary, so no other test's allocations are counted).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use veriflow_runtime::codec;
use veriflow_runtime::log::segment::{decode_segment, SEGMENT_MAGIC};

struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts the bytes asked for.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::SeqCst);
        // SAFETY: the caller's contract is passed on to System.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on to System.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Found by `cargo fuzz run segment` (30 executions a second): a sound frame of 24 header bytes
/// whose event count says 65,536 makes `decode_segment` reserve room for 65,536 events (about
/// 10 MB) before it finds the first event missing. The reservation should be bounded by what
/// the payload can hold (an event takes at least its 4-byte length).
#[test]
fn a_segment_claiming_many_events_allocates_what_its_bytes_can_hold() {
    let mut payload = vec![0u8; 24];
    payload[20..24].copy_from_slice(&u32::MAX.to_le_bytes()); // event count
    let frame = codec::frame(SEGMENT_MAGIC, &payload);
    let before = ALLOCATED.load(Ordering::SeqCst);
    assert!(decode_segment(&frame).is_err());
    let used = ALLOCATED.load(Ordering::SeqCst) - before;
    assert!(
        used <= 64 * frame.len() + 4096,
        "{used} bytes allocated to decode a {}-byte segment",
        frame.len()
    );
}
