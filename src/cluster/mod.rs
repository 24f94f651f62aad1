//! Cluster mode: the same programs across OS processes (HyperQueue's server / worker / submit
//! split): a [`coordinator`] (paper 001's fault-tolerance module), [`worker`]s hosting vnodes,
//! a submitting client, and checkpoint servers holding the logs. `APP cluster` starts all of
//! them on loopback for one job.

pub(crate) mod coordinator;
pub(crate) mod protocol;
pub(crate) mod worker;

use veriflow_checkpoint::Key;

use protocol::{Hello, JobSpec, ToSubmit};

/// Submits `job` to the coordinator at `addr` and follows it to the end; `on_event` sees every
/// message on the way (progress, lost workers). Returns the last one (`Finished` or `Failed`).
pub(crate) fn submit(
    addr: &str,
    key: &Key,
    program: &str,
    job: JobSpec,
    on_event: &mut dyn FnMut(&ToSubmit),
) -> Result<ToSubmit, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the network: {e}"))?;
    rt.block_on(async {
        let conn = worker::connect_coordinator(addr, key).await?;
        let (mut reader, mut writer) = conn.into_split();
        writer
            .send(&Hello::Submit {
                program: program.to_string(),
                job,
            })
            .await
            .map_err(|e| format!("coordinator {addr}: {e}"))?;
        loop {
            let msg: ToSubmit = reader
                .recv()
                .await
                .map_err(|e| format!("lost the coordinator {addr} during the job: {e}"))?;
            on_event(&msg);
            if matches!(msg, ToSubmit::Finished { .. } | ToSubmit::Failed { .. }) {
                return Ok(msg);
            }
        }
    })
}
