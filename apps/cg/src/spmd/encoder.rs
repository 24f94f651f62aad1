//! An encoder vnode (module rule 3): collects the workers' pieces of a checkpoint, encodes them,
//! holds its part of the encoding (or puts it on the store) until a newer checkpoint commits,
//! and serves it to spares (rule 6).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use veriflow::runtime::transport::Endpoint;

use super::wire::{self, Wire};
use super::{coding, Encoding, Exit, Plan, SpmdError};

/// Where an encoding is kept.
enum Held {
    Memory(Vec<u8>),
    Stored(Vec<u8>),
}

/// The threshold and the pieces so far (by worker) of a checkpoint being collected.
type Collecting = (f64, Vec<Option<Vec<u8>>>);

struct Encoder {
    plan: Arc<Plan>,
    me: usize,
    ep: Box<dyn Endpoint>,
    g: u64,
    /// Pieces of checkpoints being collected, by stamp then worker.
    collecting: BTreeMap<u64, Collecting>,
    /// Complete encodings by stamp: threshold and bytes (at most two: rule 3).
    held: BTreeMap<u64, (f64, Held)>,
}

/// Runs encoder vnode `me` until Stop.
pub(crate) fn run(
    plan: Arc<Plan>,
    me: usize,
    ep: Box<dyn Endpoint>,
) -> (Exit, Option<Box<dyn Endpoint>>) {
    let mut e = Encoder {
        plan,
        me,
        ep,
        g: 0,
        collecting: BTreeMap::new(),
        held: BTreeMap::new(),
    };
    let exit = match e.serve() {
        Ok(()) => Exit::Stopped,
        Err(err) => {
            let master = e.plan.master;
            let _ = wire::send(
                &mut *e.ep,
                master,
                &Wire::Failed {
                    message: err.to_string(),
                },
                Vec::new(),
            );
            Exit::Failed(err)
        }
    };
    e.forget_all();
    (exit, Some(e.ep))
}

impl Encoder {
    fn index(&self) -> usize {
        self.me - self.plan.workers
    }

    fn key(&self, stamp: u64) -> Vec<u8> {
        format!("cg-spmd/encoding/{}/{stamp:020}", self.index()).into_bytes()
    }

    fn serve(&mut self) -> Result<(), SpmdError> {
        loop {
            let Some(msg) = wire::recv(&mut *self.ep, Duration::from_millis(100)) else {
                continue;
            };
            let (from, w, bulk) = msg?;
            match w {
                Wire::Piece {
                    g,
                    stamp,
                    threshold,
                } if g == self.g && from < self.plan.workers => {
                    let p = self.plan.workers;
                    let slot = self
                        .collecting
                        .entry(stamp)
                        .or_insert_with(|| (threshold, vec![None; p]));
                    slot.1[from] = Some(bulk);
                    if slot.1.iter().all(Option::is_some) {
                        if let Some((threshold, pieces)) = self.collecting.remove(&stamp) {
                            let pieces: Vec<Vec<u8>> = pieces.into_iter().flatten().collect();
                            self.encode(stamp, threshold, &pieces)?;
                        }
                    }
                }
                Wire::Commit { stamp } => {
                    let old: Vec<u64> = self.held.range(..stamp).map(|(s, _)| *s).collect();
                    for s in old {
                        self.forget(s);
                    }
                }
                Wire::Abort { g } if g > self.g => {
                    self.g = g;
                    self.collecting.clear();
                    let master = self.plan.master;
                    wire::send(&mut *self.ep, master, &Wire::Halted { g }, Vec::new())?;
                }
                Wire::Rollback { g, stamp, .. } if g >= self.g => {
                    self.g = g;
                    self.collecting.clear();
                    let other: Vec<u64> =
                        self.held.keys().copied().filter(|&s| s != stamp).collect();
                    for s in other {
                        self.forget(s);
                    }
                }
                Wire::Fetch { g, stamp } if g == self.g => {
                    let (held, threshold, bytes) = match self.held.get(&stamp) {
                        Some((t, Held::Memory(b))) => (true, *t, b.clone()),
                        Some((t, Held::Stored(key))) => {
                            let store = self.plan.store.as_ref().ok_or_else(|| {
                                SpmdError::Protocol("a stored encoding without a store".into())
                            })?;
                            match store
                                .get(key)
                                .map_err(|e| SpmdError::Store(e.to_string()))?
                            {
                                Some(b) => (true, *t, b),
                                None => (false, *t, Vec::new()),
                            }
                        }
                        None => (false, 0.0, Vec::new()),
                    };
                    let w = Wire::Parity {
                        g,
                        stamp,
                        held,
                        threshold,
                    };
                    wire::send(&mut *self.ep, from, &w, bytes)?;
                }
                Wire::Stop => return Ok(()),
                _ => {}
            }
        }
    }

    /// Encodes one checkpoint and reports it (rule 3).
    fn encode(&mut self, stamp: u64, threshold: f64, pieces: &[Vec<u8>]) -> Result<(), SpmdError> {
        let t0 = Instant::now();
        let lens: Vec<usize> = (0..self.plan.workers)
            .map(|w| self.plan.piece_len(w))
            .collect();
        if let Some((w, p)) = pieces.iter().enumerate().find(|(w, p)| p.len() != lens[*w]) {
            return Err(SpmdError::Protocol(format!(
                "w{w} sent a piece of {} bytes, its rows make {}",
                p.len(),
                lens[w]
            )));
        }
        let mine = match (self.plan.encoding, &self.plan.code) {
            (Encoding::FloatSum, _) => coding::encode_float_sum(pieces, self.plan.max_rows())?,
            (_, Some(code)) => {
                let len = lens.iter().copied().max().unwrap_or(0);
                let mut parity = coding::encode_exact(&**code, pieces, len);
                let j = self.index();
                if j >= parity.len() {
                    return Err(SpmdError::Protocol(format!(
                        "encoder {j} of {}",
                        parity.len()
                    )));
                }
                parity.swap_remove(j)
            }
            (e, None) => return Err(SpmdError::Protocol(format!("{e} has no encoder"))),
        };
        let bytes = mine.len() as u64;
        let held = match &self.plan.store {
            Some(store) => {
                let key = self.key(stamp);
                store
                    .put(&key, &mine)
                    .and_then(|()| store.flush())
                    .map_err(|e| SpmdError::Store(e.to_string()))?;
                Held::Stored(key)
            }
            None => Held::Memory(mine),
        };
        self.held.insert(stamp, (threshold, held));
        let encode_ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let master = self.plan.master;
        let w = Wire::Encoded {
            g: self.g,
            stamp,
            bytes,
            encode_ns,
        };
        wire::send(&mut *self.ep, master, &w, Vec::new())
    }

    fn forget(&mut self, stamp: u64) {
        if let Some((_, Held::Stored(key))) = self.held.remove(&stamp) {
            if let Some(store) = &self.plan.store {
                // A key left behind only costs space; the next run overwrites it.
                let _ = store.delete(&key);
            }
        }
    }

    fn forget_all(&mut self) {
        let all: Vec<u64> = self.held.keys().copied().collect();
        for s in all {
            self.forget(s);
        }
    }
}
