//! The oracle's elementary check O_e (paper 001 §V, Fig. 5): one task re-run alone from its
//! logged record.
//!
//! Rules:
//!
//! 1. A replayed task runs in the calling thread with no vnode, no log and no scheduler: the
//!    children it spawns are recorded as [`Declared`] records (arguments encoded exactly as a
//!    run logs them), never run.
//! 2. Its inputs are the logged bytes, decoded by the task's own types; its outputs are encoded
//!    by the same codec as a run's, with the same digest, so equal bytes mean equal values.
//! 3. Whatever goes wrong (unknown name, undecodable arguments or inputs, an error or a panic in
//!    the body, an output neither written nor delegated) is a [`RunError`] naming the task,
//!    never a panic in the caller.
//! 4. A task does not know it is replayed: [`Ctx::vnode`] answers
//!    [`VnodeId::ORACLE`](crate::VnodeId::ORACLE).

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::codec::Digest;
use crate::error::{panic_message, RunError};
use crate::exec::core::TaskSpec;
use crate::log::{Declared, Output};
use crate::task::value::Value;
use crate::task::{Ctx, Host, Registry};

/// What a replayed task did (rule 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replayed {
    /// The values it wrote itself, in the order it wrote them.
    pub outputs: Vec<Output>,
    /// The children it declared, in spawn order.
    pub children: Vec<Declared>,
}

#[derive(Default)]
pub(crate) struct Replayer {
    children: Vec<Declared>,
}

impl Replayer {
    pub(crate) fn declare(&mut self, mut spec: TaskSpec) -> Result<(), RunError> {
        let args = spec.take_args()?;
        self.children.push(spec.record(args));
        Ok(())
    }
}

/// Re-runs the task of `record` with arguments `args` (its record's, read from the value store
/// when the log names them by digest) on `inputs` (its input values as logged, in input order).
pub fn replay(
    registry: &Registry,
    record: &Declared,
    args: &[u8],
    inputs: &[Vec<u8>],
) -> Result<Replayed, RunError> {
    let kind = registry
        .get(&record.name)
        .ok_or_else(|| RunError::UnknownTaskName {
            name: record.name.to_string(),
            context: format!("the record of task {}", record.task),
        })?;
    if inputs.len() != record.inputs.len() {
        return Err(RunError::InputDecode {
            task: kind.name().to_string(),
            id: record.task,
            input: inputs.len().min(record.inputs.len()),
            reason: format!(
                "{} input values for {} inputs",
                inputs.len(),
                record.inputs.len()
            ),
        });
    }
    let mut body = kind.decode(args).map_err(|e| RunError::TaskFailed {
        task: kind.name().to_string(),
        id: record.task,
        message: format!("its logged arguments do not decode: {e}"),
    })?;
    let values: Vec<Value> = inputs.iter().map(|b| Value::bytes(b.clone())).collect();
    let mut replayer = Replayer::default();
    let name = kind.name();
    let mut ctx = Ctx::new(
        Host::Replay(registry, &mut replayer),
        record.task,
        name,
        &record.outputs,
    );
    match catch_unwind(AssertUnwindSafe(|| body.run(&mut ctx, values))) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(payload) => {
            return Err(RunError::TaskPanicked {
                task: name.to_string(),
                id: record.task,
                message: panic_message(&*payload),
            })
        }
    }
    ctx.check_finished()?;
    let writes = std::mem::take(&mut ctx.writes);
    drop(ctx);
    let mut outputs = Vec::with_capacity(writes.len());
    for (i, value) in writes {
        let bytes = value.encode().map_err(|e| RunError::Encode {
            what: format!("output {i} of task {}", record.task),
            reason: e.to_string(),
        })?;
        outputs.push(Output {
            data: record.outputs[i],
            digest: Digest::of(&bytes),
            value: bytes.into(),
        });
    }
    Ok(Replayed {
        outputs,
        children: replayer.children,
    })
}
