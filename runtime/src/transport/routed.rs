//! The transport of a cluster member: vnodes hosted here talk through in-process inboxes, the
//! others through a network the caller provides.
//!
//! Rules:
//!
//! 1. Every vnode has at most one inbox in this process, created on first use: a message that
//!    arrives for a vnode before it is hosted here (it is being recovered here) waits in its
//!    inbox and goes to the vnode once it exists (paper 004: held until mapped).
//! 2. A message to a vnode hosted here never leaves the process; any other goes to the
//!    `outbound` function, which routes it by the current vnode map (and holds it while the
//!    vnode is unmapped).
//! 3. A vnode never leaves a live member: vnodes move only away from a process declared dead,
//!    which stops.

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Endpoint, Envelope, Message, Transport, TransportError};
use crate::ids::{Epoch, VnodeId};

/// Where messages for vnodes not hosted here go.
pub type Outbound = Arc<dyn Fn(VnodeId, Envelope) + Send + Sync>;

struct Inbox {
    tx: Sender<Envelope>,
    rx: Option<Receiver<Envelope>>,
}

struct Inner {
    inboxes: Mutex<HashMap<VnodeId, Inbox>>,
    hosted: Mutex<HashSet<VnodeId>>,
    outbound: Outbound,
}

impl Inner {
    fn inbox_tx(&self, v: VnodeId) -> Sender<Envelope> {
        let mut m = self.inboxes.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(v)
            .or_insert_with(|| {
                let (tx, rx) = mpsc::channel();
                Inbox { tx, rx: Some(rx) }
            })
            .tx
            .clone()
    }

    fn is_hosted(&self, v: VnodeId) -> bool {
        self.hosted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&v)
    }
}

/// A member's transport (rules 1-3).
#[derive(Clone)]
pub struct Router {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router").finish_non_exhaustive()
    }
}

impl Router {
    /// A router sending what is not hosted here to `outbound`.
    pub fn new(outbound: Outbound) -> Router {
        Router {
            inner: Arc::new(Inner {
                inboxes: Mutex::new(HashMap::new()),
                hosted: Mutex::new(HashSet::new()),
                outbound,
            }),
        }
    }

    /// A message from the network for vnode `to` (rule 1). Returns false if `to` is not
    /// hosted here (the caller may forward it).
    pub fn deliver(&self, to: VnodeId, env: Envelope) -> bool {
        let hosted = self.inner.is_hosted(to);
        // A closed inbox: the vnode is gone; to its sender, a lost message.
        let _ = self.inner.inbox_tx(to).send(env);
        hosted
    }

    /// Whether `v` is hosted here.
    pub fn hosts(&self, v: VnodeId) -> bool {
        self.inner.is_hosted(v)
    }
}

impl Transport for Router {
    fn endpoint(&self, me: VnodeId) -> Result<Box<dyn Endpoint>, TransportError> {
        self.inner.inbox_tx(me);
        let rx = {
            let mut m = self.inner.inboxes.lock().unwrap_or_else(|p| p.into_inner());
            m.get_mut(&me)
                .and_then(|i| i.rx.take())
                .ok_or(TransportError::InUse(me))?
        };
        self.inner
            .hosted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(me);
        Ok(Box::new(RoutedEndpoint {
            me,
            epoch: Epoch(0),
            inbox: rx,
            inner: self.inner.clone(),
        }))
    }
}

struct RoutedEndpoint {
    me: VnodeId,
    epoch: Epoch,
    inbox: Receiver<Envelope>,
    inner: Arc<Inner>,
}

impl Endpoint for RoutedEndpoint {
    fn send(&mut self, to: VnodeId, msg: Message) -> Result<(), TransportError> {
        let env = Envelope {
            from: self.me,
            epoch: self.epoch,
            msg,
        };
        if self.inner.is_hosted(to) {
            let _ = self.inner.inbox_tx(to).send(env);
        } else {
            (self.inner.outbound)(to, env);
        }
        Ok(())
    }

    fn try_recv(&mut self) -> Option<Envelope> {
        self.inbox.try_recv().ok()
    }

    fn recv_timeout(&mut self, timeout: Duration) -> Option<Envelope> {
        self.inbox.recv_timeout(timeout).ok()
    }

    fn set_epoch(&mut self, epoch: Epoch) {
        self.epoch = epoch;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_stays_local_remote_goes_out_and_early_messages_wait() {
        let out: Arc<Mutex<Vec<(VnodeId, Envelope)>>> = Arc::default();
        let sink = out.clone();
        let r = Router::new(Arc::new(move |to, env| {
            sink.lock().unwrap().push((to, env));
        }));
        // A message for v1 arrives before v1 is hosted: it waits.
        let early = Envelope {
            from: VnodeId(7),
            epoch: Epoch(0),
            msg: Message::StealRequest,
        };
        assert!(!r.deliver(VnodeId(1), early.clone()));
        let mut a = r.endpoint(VnodeId(0)).unwrap();
        let mut b = r.endpoint(VnodeId(1)).unwrap();
        assert_eq!(b.try_recv(), Some(early));
        a.send(VnodeId(1), Message::StealNone).unwrap();
        assert_eq!(b.try_recv().map(|e| e.msg), Some(Message::StealNone));
        a.send(VnodeId(5), Message::StealRequest).unwrap();
        assert_eq!(out.lock().unwrap().len(), 1, "v5 is remote");
        assert!(r.endpoint(VnodeId(0)).is_err(), "one endpoint per vnode");
    }
}
