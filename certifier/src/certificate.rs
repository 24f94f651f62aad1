//! Certificates: the certifier's verdict as a JSON file a user keeps, signed by the oracle with
//! Ed25519 so that anyone holding its public key can check it, and tied to one log by a Merkle
//! root.
//!
//! Rules:
//!
//! 1. A certificate of format [`FORMAT`] is signed with the oracle's Ed25519 key
//!    (`signing.rs`) over [`SIGNATURE_CONTEXT`], a zero byte, and the certificate's canonical
//!    JSON without its `signature` field (field order fixed by the struct, floats written so
//!    they read back exactly). Every other field is signed, `signature_scheme` ("ed25519") and
//!    `public_key` (the oracle's public key, hex) included; a field the struct does not know is
//!    refused when reading, so nothing unsigned can ride along.
//! 2. Verifying against a public key: the certificate's `public_key` must be that key (else it
//!    was signed by another oracle, and both fingerprints are named), and the signature must
//!    verify under it (strict RFC 8032 verification). The key a certificate carries only says
//!    which key signed it; it is never trusted by itself. With the oracle's secret key instead,
//!    its public key is derived and used the same way.
//! 3. Old certificates, of format [`LEGACY_FORMAT`], carry a keyed-blake3 MAC (over their
//!    canonical JSON with `mac` empty) instead of a signature. They still verify with the
//!    oracle's secret key, as before (the same key file: rule 1 of `signing.rs`); against a
//!    public key they are refused with [`VerifyError::LegacyMac`], which names the format and
//!    says what to do. No new MAC certificate is ever made.
//! 4. After the seal, verifying recomputes G_S from the log for the certificate's outputs and
//!    compares Merkle roots (a certificate checked against another log, or a log changed since,
//!    fails). For a certificate of format [`FORMAT`] it also redoes the draw (`draw.rs`) from
//!    the seed or the revealed secret: the tasks checked must come in draw order, and when the
//!    generation certified had no detection they must be exactly its first draws. So a
//!    certifier cannot pick which tasks to check.
//! 5. An online oracle's certificate carries the commitment it published before the run and
//!    the secret, revealed; blake3 of the secret must be the commitment. Its `online` record
//!    (per worker: tasks run, checked, found forged, the bound reached, evicted or not) is
//!    signed with the rest.
//! 6. Certificates of [`PREVIOUS_FORMAT`] (signed, drawn by a Fisher-Yates shuffle before
//!    draws became keyed priorities) verify by rules 1, 2 and 4 without the draw.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use veriflow_checkpoint::hex;
use veriflow_checkpoint::Store;
use veriflow_runtime::log::{LogError, LogReader};
use veriflow_runtime::DataId;

use crate::draw::{DrawKey, Draws};
use crate::oracle::Detection;
use crate::signing::{OracleKey, OraclePublicKey, SCHEME};
use crate::track::{Ix, StructuralError, Track};

/// The format tag of certificates this version writes: signed with Ed25519 (rule 1), drawn by
/// keyed priorities (rule 4).
pub const FORMAT: &str = "veriflow-certificate/3";
/// Signed certificates drawn by a shuffle (rule 6).
pub const PREVIOUS_FORMAT: &str = "veriflow-certificate/2";
/// The format tag of old certificates, sealed with a keyed-blake3 MAC (rule 3).
pub const LEGACY_FORMAT: &str = "veriflow-certificate/1";
/// What a signature signs first (rule 1): a signature made for anything else never verifies a
/// certificate.
pub const SIGNATURE_CONTEXT: &str = "veriflow certificate ed25519 v2";
/// The MAC context of format-1 certificates (rule 3).
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

/// One worker, as an online oracle saw it (rule 5).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerRecord {
    /// The worker's id in the cluster.
    pub worker: u32,
    /// The vnode incarnations it hosted: (vnode, epoch).
    pub incarnations: Vec<(u32, u64)>,
    /// Tasks it completed that the oracle read.
    pub tasks: u64,
    /// Of them, checked by the oracle during the run.
    pub checked: u64,
    /// Of them, found forged.
    pub forged: u64,
    /// Its spot-check rate when the run ended (`online.rs` rule 4).
    pub spot_rate: f64,
    /// After its clean checks, its forgery rate is below this at confidence 1 - ε (1 when
    /// nothing of it was checked).
    pub q_hat: f64,
    /// Whether it was evicted from the job for forging.
    pub evicted: bool,
}

/// What an online oracle saw while the run ran (rule 5).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnlineRecord {
    /// The cluster's job.
    pub job: u64,
    /// Tasks the oracle checked while the run ran.
    pub checked: u64,
    /// Forged tasks it found then.
    pub detections: Vec<Detection>,
    /// The lowest spot-check rate of any worker (`online.rs` rule 4).
    pub spot_floor: f64,
    /// Per worker.
    pub workers: Vec<WorkerRecord>,
}

/// The certifier's verdict (DESIGN.md "Certification").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// Online oracles: blake3 of the secret the draw came from, published before the run
    /// (rule 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commitment: Option<String>,
    /// Online oracles: that secret, revealed (hex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Online oracles: what the oracle saw while the run ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub online: Option<OnlineRecord>,
    /// How it is signed: "ed25519" (rule 1); absent from format-1 certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature_scheme: Option<String>,
    /// The public key (hex) of the oracle that signed it (rules 1-2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    /// The Ed25519 signature (hex, 64 bytes) over the rest (rule 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// Format 1 only: keyed blake3 MAC (hex) under the oracle's key (rule 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

/// Why a certificate does not verify.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// Not a certificate.
    #[error("not a veriflow certificate: {0}")]
    Malformed(String),
    /// The Ed25519 signature fails (rule 1).
    #[error("the certificate's Ed25519 signature does not verify: it was changed after signing")]
    BadSignature,
    /// The certificate was signed by another oracle key than the one trusted (rule 2).
    #[error(
        "the certificate was signed by oracle key {signed_by}, not by the key given ({trusted})"
    )]
    OtherKey {
        /// Fingerprint of the key the certificate names.
        signed_by: String,
        /// Fingerprint of the key the caller trusts.
        trusted: String,
    },
    /// A format-1 certificate checked against a public key (rule 3).
    #[error("this is a {LEGACY_FORMAT} certificate, sealed with a keyed-blake3 MAC before certificates were signed: only the oracle's secret key can verify it (--oracle-key FILE, not --public-key), or certify the log again for a signed certificate")]
    LegacyMac,
    /// The format-1 MAC fails (rule 3).
    #[error("the certificate's MAC does not match: it was changed after signing, or signed with another key")]
    BadMac,
    /// The tasks checked are not the draw of the certificate's seed (rule 4).
    #[error("the certificate's checks are not its own draw: {0}")]
    WrongDraw(String),
    /// The log is not the one certified.
    #[error("the certificate does not belong to this log: {0}")]
    OtherLog(String),
    /// The log cannot be read.
    #[error(transparent)]
    Log(#[from] LogError),
}

impl Certificate {
    /// The bytes rule 1 signs: the context, a zero byte, the JSON without `signature`.
    fn signed_bytes(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut unsigned = self.clone();
        unsigned.signature = None;
        let mut bytes = Vec::with_capacity(4096);
        bytes.extend_from_slice(SIGNATURE_CONTEXT.as_bytes());
        bytes.push(0);
        serde_json::to_writer(&mut bytes, &unsigned)?;
        Ok(bytes)
    }

    /// The format-1 MAC (rule 3): over the JSON with `mac` empty.
    fn legacy_mac_of(&self, key: &OracleKey) -> Result<String, serde_json::Error> {
        let mut unsigned = self.clone();
        unsigned.mac = Some(String::new());
        let bytes = serde_json::to_vec(&unsigned)?;
        Ok(hex::encode(&key.mac_key().mac(MAC_CONTEXT, &bytes)))
    }

    /// Signs with the oracle's `key` (rule 1), as format [`FORMAT`].
    pub fn sign(&mut self, key: &OracleKey) -> Result<(), serde_json::Error> {
        self.format = FORMAT.to_string();
        self.mac = None;
        self.signature_scheme = Some(SCHEME.to_string());
        self.public_key = Some(key.public().to_hex());
        let signature = key.sign(&self.signed_bytes()?);
        self.signature = Some(hex::encode(&signature.to_bytes()));
        Ok(())
    }

    /// The certificate as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// Reads a certificate from JSON: format [`FORMAT`] with its signature fields, or
    /// [`LEGACY_FORMAT`] with its MAC.
    pub fn from_json(text: &str) -> Result<Certificate, VerifyError> {
        let c: Certificate =
            serde_json::from_str(text).map_err(|e| VerifyError::Malformed(e.to_string()))?;
        let malformed = |m: String| Err(VerifyError::Malformed(m));
        match c.format.as_str() {
            FORMAT | PREVIOUS_FORMAT => {
                if c.mac.is_some() {
                    return malformed(format!("a {FORMAT} certificate has no MAC"));
                }
                match c.signature_scheme.as_deref() {
                    Some(SCHEME) => {}
                    Some(other) => {
                        return malformed(format!(
                            "signature scheme {other:?}, this version reads {SCHEME:?}"
                        ))
                    }
                    None => return malformed("no signature_scheme".to_string()),
                }
                if c.public_key.is_none() || c.signature.is_none() {
                    return malformed("no public_key or no signature".to_string());
                }
                // One spelling only: an upper-case digit would decode to the same signature,
                // so a certificate changed that way would still verify (a property test found
                // it).
                let lower_hex = |h: &Option<String>| {
                    h.as_deref().is_some_and(|h| {
                        h.bytes()
                            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                    })
                };
                if !lower_hex(&c.public_key) || !lower_hex(&c.signature) {
                    return malformed(
                        "public_key and signature must be lower-case hex".to_string(),
                    );
                }
            }
            LEGACY_FORMAT => {
                if c.mac.is_none()
                    || c.signature.is_some()
                    || c.public_key.is_some()
                    || c.signature_scheme.is_some()
                {
                    return malformed(format!(
                        "a {LEGACY_FORMAT} certificate has a MAC and no signature"
                    ));
                }
            }
            other => {
                return malformed(format!(
                    "format {other:?}, this version reads {FORMAT:?} (and {PREVIOUS_FORMAT:?}, \
                     {LEGACY_FORMAT:?})"
                ))
            }
        }
        match (&c.commitment, &c.secret) {
            (None, None) => {}
            (Some(com), Some(sec)) => {
                let sec = hex::decode::<32>(sec)
                    .map_err(|_| VerifyError::Malformed("a secret of 32 bytes in hex".into()))?;
                if hex::encode(&crate::draw::commitment(&sec)) != *com {
                    return malformed(
                        "the revealed secret is not the one committed to before the run (rule 5)"
                            .to_string(),
                    );
                }
            }
            _ => return malformed("a commitment without its secret, or the reverse".to_string()),
        }
        Ok(c)
    }

    /// The secret an online oracle revealed (rule 5), if any.
    pub fn revealed_secret(&self) -> Option<[u8; 32]> {
        self.secret
            .as_deref()
            .and_then(|h| hex::decode::<32>(h).ok())
    }

    /// Whether this is an old MAC certificate (rule 3).
    pub fn is_legacy(&self) -> bool {
        self.format == LEGACY_FORMAT
    }

    /// The public key the certificate says signed it (rule 2: not a reason to trust it).
    pub fn signer(&self) -> Option<OraclePublicKey> {
        self.public_key
            .as_deref()
            .and_then(|h| OraclePublicKey::from_hex(h).ok())
    }

    /// Rule 2 then rule 4: checks the signature under `trusted`, the oracle's public key, then
    /// that the certificate belongs to the log in `store`. A format-1 certificate is refused
    /// ([`VerifyError::LegacyMac`], rule 3).
    pub fn verify(
        &self,
        trusted: &OraclePublicKey,
        store: Arc<dyn Store>,
    ) -> Result<(), VerifyError> {
        self.check_signature(trusted)?;
        self.check_log(store)
    }

    /// Rules 2-4 with the oracle's secret key: a signed certificate is checked under its public
    /// key, a format-1 certificate by its MAC; then the log.
    pub fn verify_with_secret(
        &self,
        key: &OracleKey,
        store: Arc<dyn Store>,
    ) -> Result<(), VerifyError> {
        if self.is_legacy() {
            let expect = self
                .legacy_mac_of(key)
                .map_err(|e| VerifyError::Malformed(e.to_string()))?;
            let mac = self.mac.as_deref().unwrap_or_default();
            // Compared as digests: the time taken does not tell how many digits matched.
            let same = mac.len() == expect.len()
                && blake3::hash(mac.as_bytes()) == blake3::hash(expect.as_bytes());
            if !same {
                return Err(VerifyError::BadMac);
            }
        } else {
            self.check_signature(&key.public())?;
        }
        self.check_log(store)
    }

    /// Rule 2.
    fn check_signature(&self, trusted: &OraclePublicKey) -> Result<(), VerifyError> {
        if self.is_legacy() {
            return Err(VerifyError::LegacyMac);
        }
        let named = self.public_key.as_deref().unwrap_or_default();
        if named != trusted.to_hex() {
            return Err(VerifyError::OtherKey {
                signed_by: match self.signer() {
                    Some(k) => k.fingerprint(),
                    None => format!("{named:?} (not a valid key)"),
                },
                trusted: trusted.fingerprint(),
            });
        }
        let signature = self
            .signature
            .as_deref()
            .ok_or(VerifyError::BadSignature)
            .and_then(|h| hex::decode::<64>(h).map_err(|_| VerifyError::BadSignature))?;
        let signature = ed25519_dalek::Signature::from_bytes(&signature);
        let bytes = self
            .signed_bytes()
            .map_err(|e| VerifyError::Malformed(e.to_string()))?;
        if !trusted.verify(&bytes, &signature) {
            return Err(VerifyError::BadSignature);
        }
        Ok(())
    }

    /// Rule 4.
    fn check_log(&self, store: Arc<dyn Store>) -> Result<(), VerifyError> {
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
        let root = hex::encode(&track.merkle_root(&gs));
        if root != self.merkle_root {
            return Err(VerifyError::OtherLog(format!(
                "G_S of the log has Merkle root {root}, the certificate says {}",
                self.merkle_root
            )));
        }
        if self.format == FORMAT {
            self.check_draw(&track, &gs)?;
        }
        Ok(())
    }

    /// Rule 4: the tasks checked are the draw's, in its order.
    fn check_draw(&self, track: &Track, gs: &[Ix]) -> Result<(), VerifyError> {
        let key = match self.revealed_secret() {
            Some(secret) => DrawKey::from_secret(&secret, self.generation),
            None => DrawKey::from_seed(self.seed, self.generation),
        };
        let order: Vec<String> = Draws::of_track(track, gs, &key)
            .map(|i| format!("{:#}", track.id(gs[i])))
            .collect();
        let wrong = |what: String| Err(VerifyError::WrongDraw(what));
        if self.detections.is_empty() && self.structural.is_empty() {
            if order.len() < self.checked.len() || order[..self.checked.len()] != self.checked[..] {
                return wrong(format!(
                    "the {} tasks checked are not the first {} the seed draws",
                    self.checked.len(),
                    self.checked.len()
                ));
            }
            return Ok(());
        }
        // With detections, tasks that fell into G_F are skipped: the checked ones are a
        // subsequence of the draw.
        let mut next = order.iter();
        for t in &self.checked {
            if !next.any(|o| o == t) {
                return wrong(format!("task {t} is checked out of the draw's order"));
            }
        }
        Ok(())
    }
}
