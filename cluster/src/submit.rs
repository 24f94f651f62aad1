//! The submitting client: sends a job to a coordinator and follows it to its end, across a
//! takeover (`coordinator` rule 10).

use std::time::{Duration, Instant};

use veriflow_checkpoint::Key;

use crate::error::ClusterError;
use crate::protocol::{Hello, JobSpec, ToSubmit};
use crate::worker::driver::connect_once;

/// How long the client looks for a coordinator after losing one: a standby takes over within
/// its lease's expiry plus the members' return.
const PATIENCE: Duration = Duration::from_secs(60);
/// How long it looks for one at first: a typo in an address is reported in seconds.
const FIRST_PATIENCE: Duration = Duration::from_secs(15);

/// Submits `job` to whichever of the coordinators at `addrs` holds the role, and follows it
/// to the end; `on_event` sees every message on the way (progress, lost workers, a takeover).
/// If the coordinator is lost, the client finds its successor and follows the job there.
/// Returns the last message (`Finished` or `Failed`).
pub fn submit(
    addrs: &[String],
    key: &Key,
    program: &str,
    job: JobSpec,
    on_event: &mut dyn FnMut(&ToSubmit),
) -> Result<ToSubmit, ClusterError> {
    let rt = crate::client_runtime()?;
    rt.block_on(async {
        // The job's id once a coordinator accepted it: after that, the client attaches.
        let mut accepted: Option<u64> = None;
        let mut lost: Option<String> = None;
        loop {
            let hello = match accepted {
                Some(job) => Hello::Attach { job },
                None => Hello::Submit {
                    program: program.to_string(),
                    job: job.clone(),
                },
            };
            let (addr, mut reader, _writer, first) =
                find(addrs, key, &hello, lost.as_deref(), |m: &ToSubmit| {
                    matches!(m, ToSubmit::Standby { .. })
                })
                .await?;
            let mut next = Some(first);
            loop {
                let msg: ToSubmit = match next.take() {
                    Some(m) => m,
                    None => match reader.recv().await {
                        Ok(m) => m,
                        Err(e) => {
                            lost = Some(format!("{addr} during the job: {e}"));
                            break;
                        }
                    },
                };
                if let ToSubmit::Standby { .. } = msg {
                    lost = Some(format!("{addr} became a standby"));
                    break;
                }
                if let ToSubmit::Accepted { job, .. } | ToSubmit::Queued { job, .. } = msg {
                    accepted = Some(job);
                }
                on_event(&msg);
                if matches!(msg, ToSubmit::Finished { .. } | ToSubmit::Failed { .. }) {
                    return Ok(msg);
                }
            }
        }
    })
}

/// Cancels job `job` at whichever of the coordinators at `addrs` holds the role
/// (`coordinator` rule 12): returns the state it was cancelled in (`queued`, `running`, ...);
/// a job that ended already, or that the coordinator does not know, is [`ClusterError::Job`].
pub fn cancel(addrs: &[String], key: &Key, job: u64) -> Result<String, ClusterError> {
    let rt = crate::client_runtime()?;
    rt.block_on(async {
        let (addr, _reader, _writer, answer) =
            find(addrs, key, &Hello::Cancel { job }, None, |m: &ToSubmit| {
                matches!(m, ToSubmit::Standby { .. })
            })
            .await?;
        match answer {
            ToSubmit::Cancelled { was, .. } => Ok(was),
            ToSubmit::Failed { error } => Err(ClusterError::Job { addr, error }),
            other => Err(ClusterError::Refused {
                addr,
                reason: format!("it answered a cancel with {other:?}"),
            }),
        }
    })
}

pub(crate) type Reader = veriflow_checkpoint::wire::WireReader<tokio::net::tcp::OwnedReadHalf>;
pub(crate) type Writer = veriflow_checkpoint::wire::WireWriter<tokio::net::tcp::OwnedWriteHalf>;

/// Says `hello` to each coordinator in turn until one that holds the role takes it (its first
/// answer is not a standby's, as `standby` tells); a client lost its coordinator (`lost`) looks
/// for [`PATIENCE`], a new one for [`FIRST_PATIENCE`].
pub(crate) async fn find<T: serde::de::DeserializeOwned>(
    addrs: &[String],
    key: &Key,
    hello: &Hello,
    lost: Option<&str>,
    standby: impl Fn(&T) -> bool,
) -> Result<(String, Reader, Writer, T), ClusterError> {
    if addrs.is_empty() {
        return Err(ClusterError::Refused {
            addr: String::new(),
            reason: "no coordinator address given".to_string(),
        });
    }
    let start = Instant::now();
    let mut delay = Duration::from_millis(50);
    let mut last = String::new();
    let mut tries = 0u32;
    loop {
        for addr in addrs {
            tries += 1;
            let conn = match connect_once(addr, key).await {
                Ok(c) => c,
                Err(e) if e.is_refusal() => return Err(e),
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let (mut reader, mut writer) = conn.into_split();
            if let Err(e) = writer.send(hello).await {
                last = format!("{addr}: {e}");
                continue;
            }
            match reader.recv::<T>().await {
                Ok(m) if standby(&m) => last = format!("{addr} is a standby"),
                // The writer stays open with the reader: the coordinator reads a closed
                // connection as the client leaving.
                Ok(first) => return Ok((addr.clone(), reader, writer, first)),
                Err(e) => last = format!("{addr}: {e}"),
            }
        }
        let patience = if lost.is_some() {
            PATIENCE
        } else {
            FIRST_PATIENCE
        };
        if start.elapsed() >= patience {
            return Err(match lost {
                Some(l) => ClusterError::CoordinatorLost(format!(
                    "{l}, and no coordinator took the job over within {patience:?} ({last})"
                )),
                None => ClusterError::Unreachable {
                    addr: addrs.join(","),
                    tries,
                    last,
                },
            });
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(1));
    }
}
