//! The submitting client: sends a job to a coordinator and follows it to its end.

use veriflow_checkpoint::Key;

use crate::error::ClusterError;
use crate::protocol::{Hello, JobSpec, ToSubmit};
use crate::worker::connect_coordinator;

/// Submits `job` to the coordinator at `addr` and follows it to the end; `on_event` sees every
/// message on the way (progress, lost workers). Returns the last one (`Finished` or `Failed`).
pub fn submit(
    addr: &str,
    key: &Key,
    program: &str,
    job: JobSpec,
    on_event: &mut dyn FnMut(&ToSubmit),
) -> Result<ToSubmit, ClusterError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ClusterError::Start {
            what: "the network",
            source: e,
        })?;
    rt.block_on(async {
        let conn = connect_coordinator(addr, key).await?;
        let (mut reader, mut writer) = conn.into_split();
        writer
            .send(&Hello::Submit {
                program: program.to_string(),
                job,
            })
            .await
            .map_err(|e| ClusterError::wire(addr, e))?;
        loop {
            let msg: ToSubmit = reader.recv().await.map_err(|e| {
                ClusterError::CoordinatorLost(format!("{addr} during the job: {e}"))
            })?;
            on_event(&msg);
            if matches!(msg, ToSubmit::Finished { .. } | ToSubmit::Failed { .. }) {
                return Ok(msg);
            }
        }
    })
}
