//! The terminal outputs of a finished run, read back from its logs.

use super::{values, Event, LogError, LogReader};

/// The encoded terminal outputs of the run in `reader`'s logs, in the manifest's order, or
/// `None` if one of them is in no log (the run has not produced it durably). A finished run's
/// outputs are durable: termination waits for every value to be acknowledged, and a value is
/// acknowledged once its event is durable. The cluster's coordinator reads them so when the
/// member that held vnode 0 is lost as the job ends.
pub fn terminal_outputs(reader: &LogReader) -> Result<Option<Vec<Vec<u8>>>, LogError> {
    let manifest = reader.manifest()?;
    let mut found: Vec<Option<Vec<u8>>> = vec![None; manifest.terminal.len()];
    for log in reader.read_all()? {
        for e in log.events {
            let outputs = match e.event {
                Event::Completed { outputs, .. } => outputs,
                Event::Returned { output } | Event::Input { output } => vec![output],
                _ => continue,
            };
            for o in outputs {
                if let Some(i) = manifest.terminal.iter().position(|&t| t == o.data) {
                    if found[i].is_none() {
                        // Rule 10 of `log/mod.rs`: a large output is in the value store.
                        found[i] = Some(values::resolve(&**reader.store(), o.value)?);
                    }
                }
            }
        }
    }
    Ok(found.into_iter().collect())
}
