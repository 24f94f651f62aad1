//! The messages of an SPMD run (module rules 2-7), and how they ride on the runtime's
//! transport.
//!
//! The runtime's [`Message`] is a closed enum; its [`IterMsg::Halo`] carries opaque bytes, so an
//! SPMD message travels as one: `data` = the bulk payload (a p slice, a checkpoint piece, ...),
//! then the [`Wire`] header encoded with postcard, then the header's length as a little-endian
//! u32. The bulk goes first so that a checkpoint piece is moved into the message, not copied
//! (the header is appended to the buffer the piece was built in), and the receiver truncates the
//! buffer back to the bulk. `step` and `iter` of the carrier are 0 and ignored.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use veriflow::runtime::iterative::IterMsg;
use veriflow::runtime::transport::{Endpoint, Message};
use veriflow::VnodeId;

use super::SpmdError;

/// Which global reduction a [`Wire::Partials`] belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) enum Phase {
    /// b.b, once per start from the initial state.
    Init,
    /// p.Ap of an iteration.
    Pq,
    /// The new r.r of an iteration.
    Rr,
}

/// The header of an SPMD message; `g` is the generation (module rule 5).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) enum Wire {
    /// Worker -> master at start: the columns its rows touch (with its own rows).
    Window { lo: u64, hi: u64 },
    /// Master -> workers: every worker's window, by worker.
    Table { windows: Vec<(u64, u64)> },
    /// Worker -> worker: the receiver's share of the sender's p at iteration `k`, starting at
    /// global row `start` (bulk: f64 LE).
    Halo { g: u64, k: u64, start: u64 },
    /// Worker -> every worker: the sender's per-block partials of a reduction (bulk: f64 LE).
    Partials { g: u64, k: u64, phase: Phase },
    /// Worker -> encoders: the sender's state at checkpoint `stamp` (bulk: the block state's
    /// bytes, kernel rule 4).
    Piece { g: u64, stamp: u64, threshold: f64 },
    /// Encoder -> master: the encoding of checkpoint `stamp` is complete and held.
    Encoded {
        g: u64,
        stamp: u64,
        bytes: u64,
        encode_ns: u64,
    },
    /// Master -> workers and encoders: checkpoint `stamp` is complete; drop older ones.
    Commit { stamp: u64 },
    /// Master -> live workers and encoders: a failure; stop and answer [`Wire::Halted`].
    Abort { g: u64 },
    /// Worker or encoder -> master: stopped for generation `g`.
    Halted { g: u64 },
    /// Master -> live workers and encoders: roll back to checkpoint `stamp` (0: the initial
    /// state); workers in `lost` rebuild theirs from the encoding.
    Rollback { g: u64, stamp: u64, lost: Vec<u32> },
    /// Spare -> survivors and encoders: send me your part of checkpoint `stamp`.
    Fetch { g: u64, stamp: u64 },
    /// Survivor -> spare: its copy of checkpoint `stamp` (bulk: the state's bytes).
    Copy { g: u64, stamp: u64, threshold: f64 },
    /// Encoder -> spare: its encoding of checkpoint `stamp` (bulk), or nothing if it has none.
    Parity {
        g: u64,
        stamp: u64,
        held: bool,
        threshold: f64,
    },
    /// Spare -> master: state rebuilt (bulk: the rebuilt bytes, for the recovery error only).
    Recovered { g: u64, stamp: u64 },
    /// Worker -> master: finished at iteration `k` (bulk: its rows of x, f64 LE).
    Done {
        g: u64,
        k: u64,
        rho: f64,
        converged: bool,
        checkpoint_ns: u64,
        /// The last checkpoint it took (the master waits for its commit: rule 7).
        last_stamp: u64,
    },
    /// Any -> master: a fatal error (breakdown, a bad message, a store failure).
    Failed { message: String },
    /// Master -> all: the run is over.
    Stop,
}

/// Sends `w` with `bulk` to vnode `to` (module docs above for the layout).
pub(crate) fn send(
    ep: &mut dyn Endpoint,
    to: usize,
    w: &Wire,
    mut bulk: Vec<u8>,
) -> Result<(), SpmdError> {
    let header =
        postcard::to_allocvec(w).map_err(|e| SpmdError::Protocol(format!("encode: {e}")))?;
    let len =
        u32::try_from(header.len()).map_err(|_| SpmdError::Protocol("header too long".into()))?;
    bulk.extend_from_slice(&header);
    bulk.extend_from_slice(&len.to_le_bytes());
    let to = VnodeId(u32::try_from(to).map_err(|_| SpmdError::Protocol("vnode id".into()))?);
    ep.send(
        to,
        Message::Iter(IterMsg::Halo {
            step: 0,
            iter: 0,
            data: bulk,
        }),
    )
    .map_err(|e| SpmdError::Protocol(e.to_string()))
}

/// A received message: sender, header, bulk.
pub(crate) type Received = (usize, Wire, Vec<u8>);

/// Waits up to `timeout` for a message; `None` on timeout, an error for bytes that are not an
/// SPMD message.
pub(crate) fn recv(
    ep: &mut dyn Endpoint,
    timeout: Duration,
) -> Option<Result<Received, SpmdError>> {
    let env = ep.recv_timeout(timeout)?;
    let from = env.from.0 as usize;
    Some(match env.msg {
        Message::Iter(IterMsg::Halo { data, .. }) => decode(data).map(|(w, b)| (from, w, b)),
        other => Err(SpmdError::Protocol(format!(
            "unexpected message from {}: {other:?}",
            env.from
        ))),
    })
}

fn decode(mut data: Vec<u8>) -> Result<(Wire, Vec<u8>), SpmdError> {
    let bad = || SpmdError::Protocol(format!("a message of {} bytes is cut", data.len()));
    let n = data.len();
    let len_at = n.checked_sub(4).ok_or_else(bad)?;
    let mut lb = [0u8; 4];
    lb.copy_from_slice(&data[len_at..]);
    let hlen = u32::from_le_bytes(lb) as usize;
    let h_at = len_at.checked_sub(hlen).ok_or_else(bad)?;
    let w: Wire = postcard::from_bytes(&data[h_at..len_at])
        .map_err(|e| SpmdError::Protocol(format!("decode: {e}")))?;
    data.truncate(h_at);
    Ok((w, data))
}

/// f64s as little-endian bytes.
pub(crate) fn f64_bytes(v: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 * v.len() + 64);
    append_f64s(&mut out, v);
    out
}

/// Appends `v` as little-endian bytes: one copy on a little-endian machine (checkpoints are
/// 24 bytes per row: this is most of their cost).
pub(crate) fn append_f64s(out: &mut Vec<u8>, v: &[f64]) {
    if cfg!(target_endian = "little") {
        out.extend_from_slice(bytemuck::cast_slice(v));
    } else {
        out.reserve(8 * v.len());
        for x in v {
            out.extend_from_slice(&x.to_bits().to_le_bytes());
        }
    }
}

/// Little-endian bytes as f64s (a trailing partial word is an error).
pub(crate) fn bytes_f64(b: &[u8]) -> Result<Vec<f64>, SpmdError> {
    if !b.len().is_multiple_of(8) {
        return Err(SpmdError::Protocol(format!(
            "{} bytes are not a vector of f64",
            b.len()
        )));
    }
    Ok(b.chunks_exact(8)
        .map(|w| f64::from_bits(u64::from_le_bytes(w.try_into().unwrap_or([0; 8]))))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use veriflow::runtime::transport::{InProcTransport, Transport};

    #[test]
    fn frames_round_trip_and_bad_bytes_are_errors() {
        let t = InProcTransport::new(2);
        let mut a = t.endpoint(VnodeId(0)).unwrap();
        let mut b = t.endpoint(VnodeId(1)).unwrap();
        let w = Wire::Rollback {
            g: 3,
            stamp: 40,
            lost: vec![1, 2],
        };
        send(&mut *a, 1, &w, vec![1, 2, 3]).unwrap();
        let (from, got, bulk) = recv(&mut *b, Duration::from_secs(1)).unwrap().unwrap();
        assert_eq!((from, got, bulk), (0, w, vec![1, 2, 3]));
        assert!(decode(vec![1, 2]).is_err());
        assert!(decode(vec![0, 0, 0, 9, 0, 0, 0]).is_err());
        assert_eq!(
            bytes_f64(&f64_bytes(&[1.5, -0.0])).unwrap()[1].to_bits(),
            (-0.0f64).to_bits()
        );
        assert!(bytes_f64(&[0; 7]).is_err());
    }
}
