//! A transport wrapper that loses and duplicates messages, seeded (for tests of rule 2).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

use super::{Endpoint, Envelope, Message, Transport, TransportError};
use crate::ids::VnodeId;

/// Wraps a transport: each message sent is lost with probability `loss`, and (if not lost)
/// delivered twice with probability `dup`. Each endpoint draws from its own RNG seeded from
/// `seed` and its vnode, so a run's faults depend only on the seed and the order of sends.
pub struct LossyTransport {
    inner: Box<dyn Transport>,
    loss: f64,
    dup: f64,
    seed: u64,
    lost: Arc<AtomicU64>,
    duplicated: Arc<AtomicU64>,
}

impl std::fmt::Debug for LossyTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LossyTransport")
            .field("loss", &self.loss)
            .field("dup", &self.dup)
            .finish()
    }
}

impl LossyTransport {
    /// Wraps `inner`. Probabilities are clamped to [0, 1].
    pub fn new(inner: Box<dyn Transport>, loss: f64, dup: f64, seed: u64) -> Self {
        LossyTransport {
            inner,
            loss: loss.clamp(0.0, 1.0),
            dup: dup.clamp(0.0, 1.0),
            seed,
            lost: Arc::default(),
            duplicated: Arc::default(),
        }
    }

    /// Counters of lost and duplicated messages, shared with every endpoint.
    pub fn counters(&self) -> (Arc<AtomicU64>, Arc<AtomicU64>) {
        (self.lost.clone(), self.duplicated.clone())
    }
}

impl Transport for LossyTransport {
    fn endpoint(&self, me: VnodeId) -> Result<Box<dyn Endpoint>, TransportError> {
        Ok(Box::new(LossyEndpoint {
            inner: self.inner.endpoint(me)?,
            rng: ChaCha8Rng::seed_from_u64(self.seed ^ (u64::from(me.0) << 32)),
            loss: self.loss,
            dup: self.dup,
            lost: self.lost.clone(),
            duplicated: self.duplicated.clone(),
        }))
    }
}

struct LossyEndpoint {
    inner: Box<dyn Endpoint>,
    rng: ChaCha8Rng,
    loss: f64,
    dup: f64,
    lost: Arc<AtomicU64>,
    duplicated: Arc<AtomicU64>,
}

impl Endpoint for LossyEndpoint {
    fn send(&mut self, to: VnodeId, msg: Message) -> Result<(), TransportError> {
        if self.rng.random_bool(self.loss) {
            self.lost.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        if self.rng.random_bool(self.dup) {
            self.duplicated.fetch_add(1, Ordering::Relaxed);
            self.inner.send(to, msg.clone())?;
        }
        self.inner.send(to, msg)
    }

    fn try_recv(&mut self) -> Option<Envelope> {
        self.inner.try_recv()
    }

    fn recv_timeout(&mut self, timeout: Duration) -> Option<Envelope> {
        self.inner.recv_timeout(timeout)
    }

    fn set_epoch(&mut self, epoch: crate::ids::Epoch) {
        self.inner.set_epoch(epoch);
    }
}
