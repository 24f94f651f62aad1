//! Certificates: the certifier's verdict as a JSON file a user keeps, authenticated with the
//! oracle's key and tied to one log by a Merkle root.
//!
//! Rules:
//!
//! 1. The MAC is a keyed blake3 over the certificate's canonical JSON with `mac` empty (field
//!    order fixed by the struct, floats written so they read back exactly).
//! 2. Verifying checks the MAC first (a changed byte anywhere, or another key, fails), then
//!    recomputes G_S from the log for the certificate's outputs and compares Merkle roots (a
//!    certificate checked against another log, or a log changed since, fails).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use veriflow_checkpoint::{Key, Store};
use veriflow_runtime::log::{LogError, LogReader};
use veriflow_runtime::DataId;

use crate::oracle::Detection;
use crate::track::{StructuralError, Track};

/// The format tag of certificates this version writes.
pub const FORMAT: &str = "veriflow-certificate/1";
const MAC_CONTEXT: &str = "veriflow certificate mac v1";

/// ACCEPT or REJECT.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Decision {
    /// k clean checks, no structural error.
    Accept,
    /// A forgery or a structural error was found (and not corrected).
    Reject,
}

impl std::fmt::Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Decision::Accept => "ACCEPT",
            Decision::Reject => "REJECT",
        })
    }
}

/// One round of Algorithm 1's correction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CorrectionRecord {
    /// The generation the correction wrote.
    pub generation: u32,
    /// Forged tasks found in the generation before it.
    pub detected: Vec<Detection>,
    /// Tasks in G_F (forged tasks and successors) dropped from the log.
    pub invalidated: u64,
    /// Tasks the oracle re-ran.
    pub re_executed: u64,
}

/// Counts for one vnode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VnodeCount {
    /// The vnode (4294967295 is the oracle).
    pub vnode: u32,
    /// Tasks of G_S it ran.
    pub tasks: u64,
    /// Of them, checked by the oracle.
    pub checked: u64,
    /// Of them, found forged.
    pub detections: u64,
}

/// The certifier's verdict (DESIGN.md "Certification").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Certificate {
    /// [`FORMAT`].
    pub format: String,
    /// veriflow version of the certifier.
    pub tool_version: String,
    /// Program of the run.
    pub program: String,
    /// Root task of the run.
    pub root: String,
    /// Log generation certified.
    pub generation: u32,
    /// The verdict.
    pub decision: Decision,
    /// Bound on the risk of accepting a forged run.
    pub epsilon: f64,
    /// Assumed bound on the forgery rate.
    pub q: f64,
    /// Tasks in G_S.
    pub n: u64,
    /// Checks required: min(⌈f(n)⌉, n), or n with `full`.
    pub k: u64,
    /// N_{ε,q}.
    pub n_eps_q: f64,
    /// Whether every task was re-run (full duplication).
    pub full: bool,
    /// Seed of the draw.
    pub seed: u64,
    /// Where the seed came from: "log digest" or "given".
    pub seed_source: String,
    /// Terminal outputs certified.
    pub outputs: Vec<String>,
    /// Tasks checked, in draw order.
    pub checked: Vec<String>,
    /// Forged tasks found in this generation.
    pub detections: Vec<Detection>,
    /// Structural errors found in G_S.
    pub structural: Vec<StructuralError>,
    /// Corrections made before this generation.
    pub corrections: Vec<CorrectionRecord>,
    /// Per-vnode counts.
    pub per_vnode: Vec<VnodeCount>,
    /// After k clean checks, fewer than q̂ of the tasks are forged, at confidence 1 - ε.
    pub q_hat: f64,
    /// Merkle root over G_S's task records.
    pub merkle_root: String,
    /// Merkle root over all of G.
    pub log_digest: String,
    /// Keyed blake3 MAC (hex) under the oracle's key (rule 1).
    pub mac: String,
}

/// Why a certificate does not verify.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// Not a certificate.
    #[error("not a veriflow certificate: {0}")]
    Malformed(String),
    /// The MAC fails.
    #[error("the certificate's MAC does not match: it was changed after signing, or signed with another key")]
    BadMac,
    /// The log is not the one certified.
    #[error("the certificate does not belong to this log: {0}")]
    OtherLog(String),
    /// The log cannot be read.
    #[error(transparent)]
    Log(#[from] LogError),
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Certificate {
    fn mac_of(&self, key: &Key) -> Result<String, serde_json::Error> {
        let mut unsigned = self.clone();
        unsigned.mac = String::new();
        let bytes = serde_json::to_vec(&unsigned)?;
        Ok(hex(&key.mac(MAC_CONTEXT, &bytes)))
    }

    /// Signs with `key` (rule 1).
    pub fn sign(&mut self, key: &Key) -> Result<(), serde_json::Error> {
        self.mac = self.mac_of(key)?;
        Ok(())
    }

    /// The certificate as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// Reads a certificate from JSON.
    pub fn from_json(text: &str) -> Result<Certificate, VerifyError> {
        let c: Certificate =
            serde_json::from_str(text).map_err(|e| VerifyError::Malformed(e.to_string()))?;
        if c.format != FORMAT {
            return Err(VerifyError::Malformed(format!(
                "format {:?}, this version reads {FORMAT:?}",
                c.format
            )));
        }
        Ok(c)
    }

    /// Rule 2: checks the MAC under `key`, then that the certificate belongs to the log in
    /// `store`.
    pub fn verify(&self, key: &Key, store: Arc<dyn Store>) -> Result<(), VerifyError> {
        let expect = self
            .mac_of(key)
            .map_err(|e| VerifyError::Malformed(e.to_string()))?;
        let same = self.mac.len() == expect.len()
            && blake3::hash(self.mac.as_bytes()) == blake3::hash(expect.as_bytes());
        if !same {
            return Err(VerifyError::BadMac);
        }
        let reader = LogReader::at_generation(store, self.generation);
        let track = Track::load_from(&reader)?;
        if format!("{:#}", track.manifest.root) != self.root {
            return Err(VerifyError::OtherLog(format!(
                "it certifies root {}, the log holds root {:#}",
                self.root, track.manifest.root
            )));
        }
        let outputs = self
            .outputs
            .iter()
            .map(|s| s.parse::<DataId>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| VerifyError::Malformed(e.to_string()))?;
        let (gs, _) = track.terminal_subgraph(&outputs);
        let root = hex(&track.merkle_root(&gs));
        if root != self.merkle_root {
            return Err(VerifyError::OtherLog(format!(
                "G_S of the log has Merkle root {root}, the certificate says {}",
                self.merkle_root
            )));
        }
        Ok(())
    }
}
