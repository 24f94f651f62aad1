//! What goes wrong in cluster mode, grouped by what the caller should do.

use veriflow_checkpoint::wire::WireError;

/// An error of a cluster role's driver or client.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    // Unreachable or gone: the cluster or the address is wrong, or a peer died.
    /// The coordinator could not be reached at all.
    #[error("coordinator {addr} unreachable after {tries} tries ({last}); is it running, and is the address right?")]
    Unreachable {
        /// Its address.
        addr: String,
        /// Connection attempts made.
        tries: u32,
        /// The last attempt's error.
        last: String,
    },
    /// The connection to the coordinator was lost.
    #[error("lost the coordinator {0}")]
    CoordinatorLost(String),
    /// This coordinator lost its role to one of a newer term, or could not keep it.
    #[error("this coordinator stepped down: {0}")]
    Deposed(String),
    /// The coordinator's journal or lease could not be read or written.
    #[error("{0}")]
    Journal(#[from] crate::coordinator::journal::JournalError),
    /// A network error on a connection.
    #[error("{addr}: {source}")]
    Net {
        /// The other end.
        addr: String,
        /// The error.
        source: std::io::Error,
    },
    /// A framing or authentication error on a connection.
    #[error("{addr}: {source}")]
    Wire {
        /// The other end.
        addr: String,
        /// The error.
        source: WireError,
    },

    // Refused: fix the configuration (key, program, limits).
    /// The coordinator refused what was asked of a job (a cancel of a job that ended).
    #[error("coordinator {addr}: {error}")]
    Job {
        /// The coordinator.
        addr: String,
        /// Why.
        error: String,
    },
    /// The coordinator refused us.
    #[error("coordinator {addr} refused us: {reason}")]
    Refused {
        /// Its address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The address is another kind of veriflow server (a checkpoint server, a worker's peer
    /// port) than the one this end wanted.
    #[error("{addr} is {found}, not {expected}")]
    WrongServer {
        /// The address.
        addr: String,
        /// What this end wanted there.
        expected: veriflow_checkpoint::wire::Role,
        /// What answered.
        found: veriflow_checkpoint::wire::Role,
    },
    /// The store could not be opened.
    #[error("cannot open the store {spec}: {reason}")]
    Store {
        /// Its spec.
        spec: String,
        /// Why.
        reason: String,
    },

    // Local resources.
    /// Could not listen on an address.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// The error.
        source: std::io::Error,
    },
    /// Could not start a thread or runtime.
    #[error("cannot start {what}: {source}")]
    Start {
        /// What.
        what: &'static str,
        /// The error.
        source: std::io::Error,
    },
}

impl ClusterError {
    pub(crate) fn net(addr: &str, source: std::io::Error) -> Self {
        ClusterError::Net {
            addr: addr.to_string(),
            source,
        }
    }

    pub(crate) fn wire(addr: &str, source: WireError) -> Self {
        match source {
            WireError::WrongRole { expected, found } => ClusterError::WrongServer {
                addr: addr.to_string(),
                expected,
                found,
            },
            source => ClusterError::Wire {
                addr: addr.to_string(),
                source,
            },
        }
    }

    /// A refusal that trying again, or another address of the same list, would not change:
    /// a coordinator said no, or the address is another kind of server.
    pub(crate) fn is_refusal(&self) -> bool {
        matches!(
            self,
            ClusterError::Refused { .. } | ClusterError::WrongServer { .. }
        )
    }
}
