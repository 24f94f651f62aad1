//! The in-process transport: one channel per vnode.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Mutex;
use std::time::Duration;

use super::{Endpoint, Envelope, Message, Transport, TransportError};
use crate::ids::{Epoch, VnodeId};

/// Channels between the vnodes of one process (reliable and ordered).
#[derive(Debug)]
pub struct InProcTransport {
    senders: Vec<Sender<Envelope>>,
    receivers: Mutex<Vec<Option<Receiver<Envelope>>>>,
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
        }))
    }
}

struct InProcEndpoint {
    me: VnodeId,
    epoch: Epoch,
    peers: Vec<Sender<Envelope>>,
    inbox: Receiver<Envelope>,
}

impl Endpoint for InProcEndpoint {
    fn send(&mut self, to: VnodeId, msg: Message) -> Result<(), TransportError> {
        let tx = self
            .peers
            .get(to.0 as usize)
            .ok_or(TransportError::NoRoute(to))?;
        // A closed inbox means the peer has shut down: to the sender, a lost message (rule 2).
        let _ = tx.send(Envelope {
            from: self.me,
            epoch: self.epoch,
            msg,
        });
        Ok(())
    }

    fn try_recv(&mut self) -> Option<Envelope> {
        self.inbox.try_recv().ok()
    }

    fn recv_timeout(&mut self, timeout: Duration) -> Option<Envelope> {
        // Timeout or disconnected: nothing to deliver either way.
        self.inbox.recv_timeout(timeout).ok()
    }

    fn set_epoch(&mut self, epoch: Epoch) {
        self.epoch = epoch;
    }
}
