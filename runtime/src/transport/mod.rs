//! How vnodes talk: messages addressed to vnodes, behind the [`Transport`] trait.
//!
//! Rules:
//!
//! 1. Messages are addressed to vnodes, never to processes.
//! 2. Delivery may lose, delay or duplicate messages: the protocol above resends what matters
//!    until acknowledged and ignores duplicates (`exec/vnode.rs`). The in-process transport
//!    happens to be reliable and ordered; tests wrap it in [`LossyTransport`].
//! 3. Every envelope carries the sender's epoch, so messages from a vnode declared dead can be
//!    told apart from its replacement's.

mod inproc;
mod lossy;
mod routed;

use serde::{Deserialize, Serialize};
use std::time::Duration;

pub use inproc::InProcTransport;
pub use lossy::LossyTransport;
pub use routed::{Outbound, Router};

use crate::codec::Digest;
use crate::ids::{DataId, Epoch, TaskId, VnodeId};
use crate::log::Declared;
use crate::task::value::Value;

/// A message of the vnode protocol (`exec/vnode.rs`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Message {
    /// An idle vnode asks for a ready task.
    StealRequest,
    /// The victim has no ready task to give.
    StealNone,
    /// The victim gives a ready task, with its input values (resent until [`Message::AdoptAck`]).
    StealGrant {
        /// The task's declaration.
        record: Declared,
        /// Input values, in input order: typed between the vnodes of one process, bytes on a
        /// wire (`task/value.rs`).
        inputs: Vec<Value>,
        /// Their digests as the victim logged them (empty without a log): the thief logs them
        /// with its `Started` instead of hashing the values again (values from a wire are
        /// hashed all the same).
        digests: Vec<Digest>,
    },
    /// The thief has durably adopted `task`.
    AdoptAck {
        /// The task.
        task: TaskId,
    },
    /// An output of a stolen task goes home (resent until [`Message::ReturnAck`]).
    Returned {
        /// The data object.
        data: DataId,
        /// Its value: typed between the vnodes of one process, bytes on a wire.
        value: Value,
        /// blake3 of the value's encoding, as the thief logged it (`None` without a log). A
        /// value that arrives as bytes is checked against it.
        digest: Option<Digest>,
    },
    /// The victim has durably received `data`.
    ReturnAck {
        /// The data object.
        data: DataId,
    },
    /// A message of iterative mode (`iterative/`).
    Iter(crate::iterative::IterMsg),
}

/// A message with its sender (rule 3).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// Sending vnode.
    pub from: VnodeId,
    /// Sender's epoch.
    pub epoch: Epoch,
    /// The message.
    pub msg: Message,
}

/// Sending failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransportError {
    /// No such vnode in this transport.
    #[error("no route to {0}")]
    NoRoute(VnodeId),
    /// The endpoint for this vnode was already taken.
    #[error("the endpoint of {0} is already in use")]
    InUse(VnodeId),
}

/// One vnode's connection to the others.
pub trait Endpoint: Send {
    /// Sends `msg` to vnode `to` (rule 2: it may be lost).
    fn send(&mut self, to: VnodeId, msg: Message) -> Result<(), TransportError>;
    /// A message if one is waiting.
    fn try_recv(&mut self) -> Option<Envelope>;
    /// Waits up to `timeout` for a message.
    fn recv_timeout(&mut self, timeout: Duration) -> Option<Envelope>;
    /// The epoch stamped on every message sent from now on (rule 3).
    fn set_epoch(&mut self, epoch: Epoch);
}

/// A network of vnodes.
pub trait Transport: Send + Sync {
    /// The endpoint of vnode `me` (each taken once).
    fn endpoint(&self, me: VnodeId) -> Result<Box<dyn Endpoint>, TransportError>;
}
