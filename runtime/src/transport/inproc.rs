//! The in-process transport: one channel per vnode.
//!
//! Beside each inbox, a count of the messages sent to it and not yet received: a sender raises
//! it after its message is in the channel, so `try_recv` on an empty inbox, which a vnode calls
//! between any two tasks (`exec/vnode.rs` rule 1), is one load instead of a channel receive.
//! A message whose count is not raised yet is received at the next look.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Endpoint, Envelope, Message, Transport, TransportError};
use crate::ids::{Epoch, VnodeId};
use crate::util::Padded;

/// Channels between the vnodes of one process (reliable and ordered).
#[derive(Debug)]
pub struct InProcTransport {
    senders: Vec<Sender<Envelope>>,
    receivers: Mutex<Vec<Option<Receiver<Envelope>>>>,
    /// Per inbox: messages sent and not yet received (module doc).
    pending: Arc<[Padded<AtomicUsize>]>,
}

impl InProcTransport {
    /// A network of `vnodes` vnodes.
    pub fn new(vnodes: u32) -> Self {
        let (senders, receivers) = (0..vnodes)
            .map(|_| {
                let (tx, rx) = mpsc::channel();
                (tx, Some(rx))
            })
            .unzip();
        InProcTransport {
            senders,
            receivers: Mutex::new(receivers),
            pending: (0..vnodes).map(|_| Padded(AtomicUsize::new(0))).collect(),
        }
    }
}

impl Transport for InProcTransport {
    fn endpoint(&self, me: VnodeId) -> Result<Box<dyn Endpoint>, TransportError> {
        let mut rx = self.receivers.lock().unwrap_or_else(|p| p.into_inner());
        let slot = rx
            .get_mut(me.0 as usize)
            .ok_or(TransportError::NoRoute(me))?;
        let inbox = slot.take().ok_or(TransportError::InUse(me))?;
        Ok(Box::new(InProcEndpoint {
            me,
            epoch: Epoch(0),
            peers: self.senders.clone(),
            inbox,
            pending: self.pending.clone(),
        }))
    }
}

struct InProcEndpoint {
    me: VnodeId,
    epoch: Epoch,
    peers: Vec<Sender<Envelope>>,
    inbox: Receiver<Envelope>,
    pending: Arc<[Padded<AtomicUsize>]>,
}

impl InProcEndpoint {
    /// Counts a message received (it may come before its sender counted it: the count then
    /// wraps below zero for a moment, which only means "look").
    fn received(&self, env: Option<Envelope>) -> Option<Envelope> {
        if env.is_some() {
            self.pending[self.me.0 as usize]
                .0
                .fetch_sub(1, Ordering::AcqRel);
        }
        env
    }
}

impl Endpoint for InProcEndpoint {
    fn send(&mut self, to: VnodeId, msg: Message) -> Result<(), TransportError> {
        let tx = self
            .peers
            .get(to.0 as usize)
            .ok_or(TransportError::NoRoute(to))?;
        // A closed inbox means the peer has shut down: to the sender, a lost message (rule 2).
        let sent = tx.send(Envelope {
            from: self.me,
            epoch: self.epoch,
            msg,
        });
        if sent.is_ok() {
            self.pending[to.0 as usize].0.fetch_add(1, Ordering::AcqRel);
        }
        Ok(())
    }

    fn try_recv(&mut self) -> Option<Envelope> {
        if self.pending[self.me.0 as usize].0.load(Ordering::Acquire) == 0 {
            return None;
        }
        let env = self.inbox.try_recv().ok();
        self.received(env)
    }

    fn recv_timeout(&mut self, timeout: Duration) -> Option<Envelope> {
        // Timeout or disconnected: nothing to deliver either way.
        let env = self.inbox.recv_timeout(timeout).ok();
        self.received(env)
    }

    fn set_epoch(&mut self, epoch: Epoch) {
        self.epoch = epoch;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every message sent is received by `try_recv`, also after one was taken by
    /// `recv_timeout`, and an empty inbox answers `None` (module doc).
    #[test]
    fn try_recv_sees_every_message_and_the_count_returns_to_zero() {
        let t = InProcTransport::new(2);
        let mut a = t.endpoint(VnodeId(0)).unwrap();
        let mut b = t.endpoint(VnodeId(1)).unwrap();
        assert!(b.try_recv().is_none());
        for _ in 0..3 {
            a.send(VnodeId(1), Message::StealRequest).unwrap();
        }
        assert!(b.recv_timeout(Duration::from_millis(10)).is_some());
        assert!(b.try_recv().is_some());
        assert!(b.try_recv().is_some());
        assert!(b.try_recv().is_none());
        assert_eq!(t.pending[1].0.load(Ordering::SeqCst), 0);
        b.send(VnodeId(0), Message::StealNone).unwrap();
        assert!(matches!(
            a.try_recv().map(|e| e.msg),
            Some(Message::StealNone)
        ));
        assert_eq!(t.pending[0].0.load(Ordering::SeqCst), 0);
    }
}
