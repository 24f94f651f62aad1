//! The run manifest: one framed record per log store saying which run it holds.

use serde::{Deserialize, Serialize};
use veriflow_checkpoint::Store;

use super::watermark::{watermark_prefix, Watermark};
use super::LogError;
use crate::codec;
use crate::ids::{DataId, TaskId, VnodeId};

/// Watermarks per store batch in [`Manifest::store_new`]: 4096 records of ~60 bytes, far
/// below any store's batch limit.
const WATERMARKS_PER_BATCH: usize = 4096;

/// Store key of the manifest.
pub const MANIFEST_KEY: &[u8] = b"manifest";
/// Runs whose large values, and large task arguments, are stored apart from their events
/// (rule 10 of `log/mod.rs`, [`crate::log::Payload`]), with task and data ids from `ids.rs`'
/// derivation 2, in a store whose local engine may keep those values as files beside its
/// database (the checkpoint crate's `sled_store.rs` rule 7: a veriflow of VFM3 reading such a
/// store would find its values missing and call them lost; it refuses this magic instead).
const MANIFEST_MAGIC: [u8; 4] = *b"VFM4";
/// Runs whose task arguments are all inline in their `Declared` events: their segments decode
/// differently (the arguments have no inline/stored tag), so they are refused by name.
const MANIFEST_MAGIC_3: [u8; 4] = *b"VFM3";
/// Runs of derivation 2 whose values are all inline in their events: their segments decode
/// differently (an output's value has no inline/stored tag), so they are refused by name.
const MANIFEST_MAGIC_2: [u8; 4] = *b"VFM2";
/// Runs of derivation 1: their ids cannot be re-created by this version (a resumed task would
/// spawn children of other ids, and the certifier would find every re-run parent forged), so
/// they are refused by name.
const MANIFEST_MAGIC_1: [u8; 4] = *b"VFMF";
const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// Where a run stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunStatus {
    /// Started and not known to have ended (a crash leaves this).
    Running,
    /// Every task completed.
    Finished,
    /// Stopped by an error.
    Failed(String),
    /// Stopped on request before the end (Ctrl-C): the log is durable, resume finishes it
    /// (rule 7 of `exec/mod.rs`). Last, so that older manifests read the same.
    Interrupted,
}

/// What run a log store holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Program (app) name.
    pub program: String,
    /// Root task.
    pub root: TaskId,
    /// Root task's registered name.
    pub root_name: String,
    /// Root task's encoded arguments.
    pub root_args: Vec<u8>,
    /// Program inputs.
    pub inputs: Vec<DataId>,
    /// Terminal outputs S (the root's outputs).
    pub terminal: Vec<DataId>,
    /// Number of vnodes.
    pub vnodes: u32,
    /// Seed of the run.
    pub seed: u64,
    /// Status.
    pub status: RunStatus,
    /// veriflow version that wrote it.
    pub tool_version: String,
    /// Current log generation: 0 is the run's own log; the certifier writes generation g + 1
    /// when it corrects forged tasks, and keeps the older ones.
    pub generation: u32,
}

impl Manifest {
    /// Writes the manifest and flushes.
    pub fn store(&self, store: &dyn Store) -> Result<(), LogError> {
        let bytes = codec::encode(self).map_err(|e| LogError::Encode(e.to_string()))?;
        store.put(MANIFEST_KEY, &codec::frame(MANIFEST_MAGIC, &bytes))?;
        store.flush()?;
        Ok(())
    }

    /// Writes the manifest of a new run, after an empty durable watermark for each vnode it
    /// lists that has none yet (rule 8 of `log/mod.rs`): from then on a vnode whose log is
    /// wholly lost is noticed. Flushes.
    pub fn store_new(&self, store: &dyn Store) -> Result<(), LogError> {
        let mut batch = Vec::new();
        for v in 0..self.vnodes {
            if store.last_under(&watermark_prefix(VnodeId(v)))?.is_none() {
                let wm = Watermark {
                    vnode: VnodeId(v),
                    last: None,
                };
                batch.push((wm.key(), wm.encode()?));
            }
            // Bounded batches (a checkpoint server takes one frame each).
            if batch.len() >= WATERMARKS_PER_BATCH {
                store.put_batch(&std::mem::take(&mut batch))?;
            }
        }
        if !batch.is_empty() {
            store.put_batch(&batch)?;
        }
        self.store(store)
    }

    /// Reads the manifest; `Ok(None)` when there is none.
    pub fn load(store: &dyn Store) -> Result<Option<Manifest>, LogError> {
        let Some(bytes) = store.get(MANIFEST_KEY)? else {
            return Ok(None);
        };
        if bytes.starts_with(&MANIFEST_MAGIC_1) {
            return Err(LogError::NotALog(
                "its manifest is of an older veriflow, whose task ids are derived differently \
                 (id derivation 1, before 2026-11-26): inspect, resume and certify it with that \
                 version"
                    .to_string(),
            ));
        }
        if bytes.starts_with(&MANIFEST_MAGIC_2) {
            return Err(LogError::NotALog(
                "its manifest is of an older veriflow, whose logs hold every value inline in its \
                 event (log format VFM2, before values were stored apart by digest, 2026-11-26): \
                 inspect, resume and certify it with that version"
                    .to_string(),
            ));
        }
        if bytes.starts_with(&MANIFEST_MAGIC_3) {
            return Err(LogError::NotALog(
                "its manifest is of an older veriflow, whose logs hold every task's arguments \
                 inline in its event (log format VFM3, before large arguments were stored apart \
                 by digest, 2026-11-26): inspect, resume and certify it with that version"
                    .to_string(),
            ));
        }
        // A later format is a later digit (VFMF, the first, is refused above).
        if bytes.len() >= 4
            && bytes[..3] == MANIFEST_MAGIC[..3]
            && bytes[3].is_ascii_digit()
            && bytes[3] > MANIFEST_MAGIC[3]
        {
            return Err(LogError::NotALog(format!(
                "its manifest is of a newer veriflow (log format {}, this one reads up to {}): \
                 inspect, resume and certify it with that version",
                String::from_utf8_lossy(&bytes[..4]),
                String::from_utf8_lossy(&MANIFEST_MAGIC)
            )));
        }
        let payload = codec::unframe(MANIFEST_MAGIC, &bytes, MAX_MANIFEST_BYTES)
            .map_err(|e| LogError::NotALog(format!("manifest: {e}")))?;
        codec::decode(payload)
            .map(Some)
            .map_err(|e| LogError::NotALog(format!("manifest does not decode: {e}")))
    }
}
