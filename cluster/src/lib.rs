//! veriflow's cluster mode: the same programs across OS processes (HyperQueue's server /
//! worker / submit split). A [`coordinator`] (paper 001's fault-tolerance module), [`worker`]s
//! hosting vnodes, a submitting client ([`submit()`]), and checkpoint servers holding the logs.
//!
//! Every role is an I/O-free state machine ([`coordinator::Coordinator`],
//! [`worker::WorkerCore`]) that takes events at an explicit time and returns actions; thin
//! tokio drivers ([`coordinator::serve`], [`worker::run_worker`]) turn the actions into TCP
//! frames, threads and store calls, and the deterministic simulator ([`sim`]) turns them into
//! deliveries on one thread, in an order and with faults drawn from a seed. [`alloc`] gets
//! workers from a resource manager (Slurm).

pub mod alloc;
pub mod coordinator;
mod error;
pub mod observe;
pub mod oracle;
pub mod protocol;
pub mod sim;
mod submit;
pub mod worker;

pub use error::ClusterError;
pub use observe::status;
pub use submit::{cancel, submit};

/// The name of job `id`'s logs in the cluster's store (`--run job-N` for `inspect` and
/// `certify`): each job logs under its own namespace (`veriflow_checkpoint::Namespaced`), so
/// one store holds every job of a coordinator, while its journal and lease stay at the top.
pub fn job_run_name(id: u64) -> String {
    format!("job-{id}")
}

/// The view of job `id`'s logs in `store`; `create` also registers it (the coordinator does,
/// as the job starts), so that `run_names` lists it.
pub fn job_store(
    store: &std::sync::Arc<dyn veriflow_checkpoint::Store>,
    id: u64,
    create: bool,
) -> Result<std::sync::Arc<dyn veriflow_checkpoint::Store>, veriflow_checkpoint::StoreError> {
    let name = job_run_name(id);
    let view = if create {
        veriflow_checkpoint::Namespaced::create(store.clone(), &name)?
    } else {
        veriflow_checkpoint::Namespaced::new(store.clone(), &name)?
    };
    Ok(std::sync::Arc::new(view))
}

/// The one-thread tokio runtime a client (`submit`, `status`) talks to a coordinator on.
pub(crate) fn client_runtime() -> Result<tokio::runtime::Runtime, ClusterError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ClusterError::Start {
            what: "the network",
            source: e,
        })
}

/// The failure detector's parameters of the unit tests: paper 004's shape in milliseconds.
#[cfg(test)]
pub(crate) fn test_fd() -> veriflow_runtime::detect::FdParams {
    veriflow_runtime::detect::FdParams {
        interval: std::time::Duration::from_millis(100),
        timeout: std::time::Duration::from_millis(200),
        insurance: std::time::Duration::from_millis(500),
        broken: std::time::Duration::from_millis(200),
        k: 2,
    }
}
