//! Entry points for fuzzing the decoders of this crate that take outside bytes (issue 13
//! point 11): the `fuzz/` targets and the property tests call these. Not an API: hidden from
//! the docs and free to change.
//!
//! Each function takes arbitrary bytes, runs them through one decoder, checks the properties
//! every decoder keeps (no panic; nothing allocated beyond the input's size or the stated
//! limit; damaged data refused where a digest, MAC or AEAD tag protects it), and panics if one
//! fails, which is how a fuzzer or a property test notices.

use std::time::Duration;

use crate::erasure::{parse_header, verify_fragment, Codec, HEADER_LEN};
use crate::protocol::{Request, Response};
use crate::store::{MemoryStore, PageLimit, Store};
use crate::wire::{self, FixedSession, FrameBudget, READ_CHUNK};
use crate::Key;

/// The pre-shared key of the wire entry point's fixed session.
pub const SESSION: [u8; 32] = [0x5a; 32];
/// Largest frame the wire entry point accepts: small, so a fuzzer explores the limit.
pub const MAX_FRAME: usize = 1 << 17;

thread_local! {
    static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    static PAIR: (FixedSession, FixedSession) =
        wire::fixed_session_pair(&Key::from_bytes(SESSION)).expect("a fixed Noise session");
}

/// The client end of the wire entry point's fixed session: seals frames the entry point
/// opens (frame `i` of a stream from nonce `i` when each takes one Noise message).
pub fn fixed_client() -> FixedSession {
    PAIR.with(|p| p.0.clone())
}

/// Wire frames from outside bytes (wire rules 1, 3-8): reads frames from `data` as a client's
/// stream within a budget and opens each with the server end of a fixed Noise session (most
/// fail the tag, as they must), and decodes `data` itself as a request and as a response
/// payload, answering a request against a small in-memory store.
pub fn wire_bytes(data: &[u8]) {
    // 1. Framing: a stream of frames; memory follows the bytes (rule 7).
    let budget = FrameBudget::new(wire::frame_cost(MAX_FRAME) * 2);
    let server = PAIR.with(|p| p.1.clone());
    RT.with(|rt| {
        rt.block_on(async {
            let mut stream = data;
            let mut nonce = 0u64;
            loop {
                let before = stream.len();
                match server
                    .recv_within(
                        &mut stream,
                        nonce,
                        MAX_FRAME,
                        &budget,
                        Duration::from_secs(1),
                    )
                    .await
                {
                    Ok((payload, _reservation, used)) => {
                        assert!(payload.len() <= MAX_FRAME);
                        assert!(payload.capacity() <= payload.len().max(READ_CHUNK) * 2);
                        // Only sealed bytes open: the fuzzer must have found a valid frame.
                        let _ = postcard::from_bytes::<Request>(&payload);
                        nonce += used;
                    }
                    Err(_) => break,
                }
                assert!(stream.len() < before, "a frame read consumed nothing");
            }
        })
    });
    let arrived = data.len();
    assert!(
        budget.peak_buffered() <= 2 * arrived + wire::MAX_MESSAGE,
        "{} bytes buffered for {arrived} bytes of input",
        budget.peak_buffered()
    );
    assert_eq!(budget.reserved(), 0);
    assert_eq!(budget.buffered(), 0);

    // 2. Payloads: what a key holder can send in a frame that opens.
    if let Ok(req) = postcard::from_bytes::<Request>(data) {
        assert!(
            request_bytes(&req) <= data.len(),
            "{req:?} from {} bytes",
            data.len()
        );
        let store = MemoryStore::default();
        let good = Codec::replicate(1)
            .expect("replicate(1)")
            .encode(b"value", 1)
            .remove(0);
        let _ = store.put(b"k", &good);
        let _ = store.put(b"k2", &good);
        let limit = PageLimit {
            max_keys: 1,
            max_bytes: 64,
        };
        if let Response::Page { entries, .. } = crate::server::handle(&store, req, limit) {
            assert!(entries.len() <= 1);
        }
    }
    let _ = postcard::from_bytes::<Response>(data);
}

/// Bytes of keys and values a decoded request holds (each came from the input).
fn request_bytes(r: &Request) -> usize {
    match r {
        Request::Ping => 0,
        Request::Put { key, value } => key.len() + value.len(),
        Request::Batch(pairs) => pairs.iter().map(|(k, v)| k.len() + v.len()).sum(),
        Request::Get { key } | Request::Delete { key } => key.len(),
        Request::Scan { prefix, after, .. } => prefix.len() + after.as_ref().map_or(0, |a| a.len()),
        Request::Hello { .. } => 0,
        Request::RaiseFence { scope, .. } => scope.len(),
        Request::FencedBatch { fences, pairs } => {
            fences.iter().map(|(s, _)| s.len()).sum::<usize>()
                + pairs.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
        }
        Request::DeleteBatch { keys } => keys.iter().map(|k| k.len()).sum(),
    }
}

/// Erasure fragments from outside bytes (erasure rules 3-6): a fragment that passes its check
/// has a consistent header; decoding a set of slots made of `data` returns the encoded blob or
/// an error, never other bytes.
pub fn fragment_bytes(data: &[u8]) {
    if let Ok((h, _)) = verify_fragment(data) {
        assert_eq!(parse_header(data).ok(), Some(h.clone()));
        let piece = data.len() - HEADER_LEN;
        assert_eq!(
            usize::try_from(h.blob_len).ok().map(|l| l.div_ceil(h.m)),
            Some(piece)
        );
    }
    // Put the bytes in one slot beside genuine fragments of a known blob: whatever they are,
    // the blob read back is the one encoded, or there is an error.
    let blob: &[u8] = b"the blob every slot but one holds";
    for codec in [Codec::replicate(2), Codec::parity(2), Codec::ida(2, 2)] {
        let codec = codec.expect("valid parameters");
        let n = codec.total_fragments();
        let frags = codec.encode(blob, 7);
        for slot in 0..n {
            let mut slots: Vec<Option<&[u8]>> = frags.iter().map(|f| Some(f.as_slice())).collect();
            slots[slot] = Some(data);
            // Keep only M slots besides the fuzzed one so that it matters.
            for (i, s) in slots.iter_mut().enumerate() {
                if i != slot && i > codec.data_fragments() {
                    *s = None;
                }
            }
            if let Ok(d) = codec.decode(&slots) {
                if d.blob != blob {
                    // Only a valid fragment of a newer version may win, and then its blob is
                    // what its own digests say: it must verify.
                    assert!(verify_fragment(data).is_ok(), "decoded other bytes");
                }
            }
        }
    }
}

/// A store spec from outside text: parsing never panics and what parses prints back to a
/// spec that parses to the same.
pub fn store_spec_text(text: &str) {
    if let Ok(spec) = text.parse::<crate::StoreSpec>() {
        let again: crate::StoreSpec = spec
            .to_string()
            .parse()
            .unwrap_or_else(|e| panic!("{spec} does not parse back: {e}"));
        assert_eq!(again.to_string(), spec.to_string());
    }
}

/// One damage to an encoding, for property tests: `(kind, at, len, bytes)` with `kind % 4`
/// choosing a bit flip at `at` (bit `len % 8`), a truncation to `at` bytes, a splice of `bytes`
/// over `len` bytes at `at`, or a copy of `len` bytes from `at` to the end (a repeated tail).
/// Positions are taken modulo the length, so any tuple applies to any encoding.
pub type Damage = (u8, usize, usize, Vec<u8>);

/// The proptest strategy of 1-3 damages, shared by every crate's decoder property tests.
#[cfg(any(test, feature = "proptest"))]
pub fn damages() -> impl proptest::strategy::Strategy<Value = Vec<Damage>> {
    use proptest::prelude::*;
    prop::collection::vec(
        (
            any::<u8>(),
            any::<usize>(),
            any::<usize>(),
            prop::collection::vec(any::<u8>(), 0..8),
        ),
        1..4,
    )
}

/// Applies `damages` in order to a copy of `bytes`.
pub fn damage(bytes: &[u8], damages: &[Damage]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for (kind, at, len, with) in damages {
        let n = b.len();
        match kind % 4 {
            0 if n > 0 => b[at % n] ^= 1 << (len % 8),
            1 => b.truncate(at % (n + 1)),
            2 => {
                let at = at % (n + 1);
                let end = (at + len % 16).min(n);
                b.splice(at..end, with.iter().copied());
            }
            3 if n > 0 => {
                let at = at % n;
                let end = (at + len % 64).min(n);
                let tail = b[at..end].to_vec();
                b.extend_from_slice(&tail);
            }
            _ => {}
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::erasure::Codec;
    use proptest::prelude::*;
    use serde_bytes::ByteBuf;

    /// A valid frame stream carrying `req` as frame 0 of the fixed session.
    fn valid_stream(req: &Request) -> Vec<u8> {
        fixed_client().seal(0, &postcard::to_stdvec(req).unwrap())
    }

    fn first_request(stream: &[u8]) -> Option<Request> {
        let budget = FrameBudget::new(wire::frame_cost(MAX_FRAME));
        let server = PAIR.with(|p| p.1.clone());
        RT.with(|rt| {
            rt.block_on(async {
                let mut s = stream;
                let (payload, _r, _) = server
                    .recv_within(&mut s, 0, MAX_FRAME, &budget, Duration::from_secs(1))
                    .await
                    .ok()?;
                postcard::from_bytes::<Request>(&payload).ok()
            })
        })
    }

    /// The committed fuzz seeds of the `wire` target are frames of today's format: the valid
    /// ones open, the damaged one does not (a format change must regenerate them).
    #[test]
    fn the_committed_wire_seeds_are_current() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/wire");
        let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
        let first = |name: &str| format!("{:?}", first_request(&read(name)));
        assert_eq!(first("frame-ping"), format!("{:?}", Some(Request::Ping)));
        assert_eq!(first("two-frames"), format!("{:?}", Some(sample_request())));
        assert_eq!(first("frame-bad-tag"), "None");
        assert_eq!(read("frame-ping"), valid_stream(&Request::Ping));
    }

    /// Writes the `wire` seeds: `cargo test -p veriflow-checkpoint --lib -- --ignored
    /// write_wire_seeds`.
    #[test]
    #[ignore = "writes fuzz/seeds/wire; run by hand after a wire format change"]
    fn write_wire_seeds() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/wire");
        let ping = valid_stream(&Request::Ping);
        std::fs::write(dir.join("frame-ping"), &ping).unwrap();
        let mut bad = valid_stream(&sample_request());
        let last = bad.len() - 1;
        bad[last] ^= 1;
        std::fs::write(dir.join("frame-bad-tag"), &bad).unwrap();
        let c = fixed_client();
        let mut two = c.seal(0, &postcard::to_stdvec(&sample_request()).unwrap());
        two.extend_from_slice(&c.seal(1, &postcard::to_stdvec(&Request::Ping).unwrap()));
        std::fs::write(dir.join("two-frames"), &two).unwrap();
    }

    fn sample_request() -> Request {
        Request::Batch(vec![
            (ByteBuf::from(b"seg/1".to_vec()), ByteBuf::from(vec![1; 40])),
            (ByteBuf::from(b"seg/2".to_vec()), ByteBuf::from(vec![2; 9])),
        ])
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes_never_break_the_wire_decoders(data in prop::collection::vec(any::<u8>(), 0..256)) {
            wire_bytes(&data);
        }

        #[test]
        fn a_damaged_frame_is_refused_by_its_tag(d in damages()) {
            let good = valid_stream(&sample_request());
            prop_assert!(first_request(&good).is_some());
            let bad = damage(&good, &d);
            wire_bytes(&bad);
            // Bytes past the frame are the next frame's business; the frame itself must be
            // exactly the original one or be refused.
            if let Some(req) = first_request(&bad) {
                let n = good.len();
                prop_assert_eq!(&bad[..n], &good[..], "accepted a changed frame: {:?}", req);
            }
        }

        #[test]
        fn a_frame_claiming_a_huge_length_allocates_what_arrived(len in any::<u32>(), body in prop::collection::vec(any::<u8>(), 0..512)) {
            let mut stream = len.to_le_bytes().to_vec();
            stream.extend_from_slice(&body);
            wire_bytes(&stream);
        }

        #[test]
        fn arbitrary_bytes_never_break_the_fragment_decoders(data in prop::collection::vec(any::<u8>(), 0..256)) {
            fragment_bytes(&data);
        }

        #[test]
        fn a_damaged_fragment_is_refused_by_its_digest(d in damages(), which in 0usize..4, blob in prop::collection::vec(any::<u8>(), 0..300)) {
            let codec = Codec::ida(2, 2).unwrap();
            let frags = codec.encode(&blob, 3);
            let good = &frags[which];
            let bad = damage(good, &d);
            fragment_bytes(&bad);
            if bad != *good {
                prop_assert!(verify_fragment(&bad).is_err(), "a changed fragment verified");
                prop_assert!(codec.check_fragment(which, &bad).is_err());
            }
            // Any M of the others plus the damaged one still decode to the blob.
            let mut slots: Vec<Option<Vec<u8>>> = frags.iter().cloned().map(Some).collect();
            slots[which] = Some(bad);
            slots[(which + 1) % 4] = None;
            let got = codec.decode(&slots).unwrap();
            prop_assert_eq!(got.blob, blob);
        }

        #[test]
        fn arbitrary_text_never_breaks_the_store_spec_parser(text in ".{0,64}") {
            store_spec_text(&text);
        }

        #[test]
        fn damaged_store_specs_parse_or_say_why(d in damages(), which in 0usize..6) {
            let specs = [
                "local:/tmp/x",
                "memory",
                "central:127.0.0.1:7000",
                "replicate:2:a:1,b:2",
                "parity:2:a:1,b:2,c:3",
                "ida:2,1,quorum=2:a:1,b:2,c:3",
            ];
            let bad = damage(specs[which].as_bytes(), &d);
            store_spec_text(&String::from_utf8_lossy(&bad));
        }
    }
}
