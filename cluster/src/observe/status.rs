//! The status client (`APP status`): asks one coordinator for a snapshot of its cluster
//! ([`Hello::Status`]), read-only, authenticated with the cluster's key like every client.

use veriflow_checkpoint::Key;

use crate::error::ClusterError;
use crate::protocol::{ClusterStatus, Hello, ToSubmit};
use crate::worker::driver::connect_once;

/// The status of the cluster as the coordinator at `addr` sees it. A standby answers with
/// `role` `standby` and the active coordinator in `active`, if it knows it.
pub fn status(addr: &str, key: &Key) -> Result<ClusterStatus, ClusterError> {
    let rt = crate::client_runtime()?;
    rt.block_on(async {
        let conn = connect_once(addr, key).await.map_err(|e| match e {
            e if e.is_refusal() => e,
            e => ClusterError::Unreachable {
                addr: addr.to_string(),
                tries: 1,
                last: e.to_string(),
            },
        })?;
        let (mut reader, mut writer) = conn.into_split();
        writer
            .send(&Hello::Status)
            .await
            .map_err(|e| ClusterError::wire(addr, e))?;
        match reader.recv::<ToSubmit>().await {
            Ok(ToSubmit::Status(s)) => Ok(*s),
            Ok(ToSubmit::Standby { active }) => Ok(ClusterStatus {
                coordinator: addr.to_string(),
                role: "standby".to_string(),
                active,
                ..ClusterStatus::default()
            }),
            Ok(other) => Err(ClusterError::Refused {
                addr: addr.to_string(),
                reason: format!("it answered a status request with {other:?}"),
            }),
            // A coordinator that does not know the key closes the connection at once.
            Err(e) => Err(ClusterError::wire(addr, e)),
        }
    })
}
