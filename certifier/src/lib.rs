//! veriflow-certifier: probabilistic certification of a finished run, with correction of
//! forged tasks (paper 001 §V: Proposition 2, Fig. 4-5, Algorithm 1).
//!
//! The pieces, each with its rules in its module docs:
//!
//! - [`sample`]: how many tasks to check (N_{ε,q}, f(n), hypergeometric, q̂);
//! - [`track`]: G from the logs, G_S, the structural check, Merkle roots;
//! - [`oracle`]: O_e, re-running one task from its record;
//! - [`correct`]: Algorithm 1's correction (G_F re-executed, a new log generation);
//! - [`certificate`]: the signed JSON verdict and its verification;
//! - [`signing`]: the oracle's Ed25519 key pair, its key files and fingerprints.
//!
//! Rules of [`certify`]:
//!
//! 1. Only a finished run is certified. G_S is computed for the chosen outputs (all terminal
//!    outputs by default) and checked structurally first: any structural error is a REJECT
//!    naming the task and edge (correction does not apply: the logs contradict each other).
//! 2. The tasks of G_S are drawn uniformly without replacement, in ascending priority: a keyed
//!    hash of each task id ([`draw`]). The key comes from the seed given, or else from a seed
//!    derived from the log digest, ε, q and the outputs — so no worker can know the draw before
//!    its results are in the log — or from an online oracle's secret ([`online`]); the seed (or
//!    the revealed secret) is recorded in the certificate, so anyone can redo the draw.
//! 3. Checks run in parallel batches and are *counted in draw order*, so the outcome does not
//!    depend on the number of threads. ACCEPT after k = min(⌈f(n)⌉, n) clean checks (k = n with
//!    `full`).
//! 4. Without `correct`, a forged task makes the verdict REJECT; the k draws are all checked so
//!    that the certificate names every forged task the sample found.
//! 5. With `correct` (Algorithm 1): a detection adds the task and its successors to G_F, restarts
//!    the count of clean checks, and G_F is re-executed on the oracle on another thread while the
//!    checking of G_C goes on (draws that fall in G_F are skipped). When the count is reached,
//!    the corrected values are written as a new generation of the log (the original kept) and
//!    the new generation is certified again, up to [`Options::max_generations`] times.
//! 6. What an online oracle learned during the run ([`Prior`]) enters the first pass only as
//!    facts the log itself supports: a task it found clean is not re-run if its content (its
//!    Merkle leaf) is unchanged; tasks it found forged are detections; tasks it distrusts (run
//!    by a worker it caught) are each checked, apart from the draw, and those forged are
//!    detections too. Detections start G_F with their successors. The draw and the count of
//!    rule 3 are the same as without it, so the ε, q guarantee is unchanged.

pub mod certificate;
pub mod correct;
pub mod draw;
pub mod online;
pub mod oracle;
pub mod sample;
pub mod signing;
pub mod track;

use std::collections::HashSet;
use std::sync::mpsc;
use std::sync::Arc;

use rayon::prelude::*;
use veriflow_checkpoint::Store;
use veriflow_runtime::log::{write_generation, LogError, LogReader, RunStatus};
use veriflow_runtime::{DataId, Registry, RunError, TaskId, VnodeId};

pub use certificate::{
    Certificate, CorrectionRecord, Decision, OnlineRecord, VerifyError, VnodeCount, WorkerRecord,
};
pub use correct::CorrectError;
pub use draw::{DrawKey, Draws};
pub use oracle::{Detection, Verdict};
pub use sample::SampleError;
pub use signing::{OracleKey, OraclePublicKey, PublicKeyError};
pub use track::{StructuralError, Track};

use track::Ix;

/// What to certify and how.
#[derive(Clone, Debug)]
pub struct Options {
    /// Bound on the risk of accepting a forged run.
    pub epsilon: f64,
    /// Assumed bound on the forgery rate.
    pub q: f64,
    /// Terminal outputs to certify (`None`: all of them).
    pub outputs: Option<Vec<DataId>>,
    /// Seed of the draw (`None`: derived from the log digest, rule 2). Each generation is drawn
    /// with a key of this seed and its number (`draw` rule 3).
    pub seed: Option<u64>,
    /// An online oracle's secret, revealed: the draw's key comes from it instead of a seed.
    pub secret: Option<[u8; 32]>,
    /// Correct forged tasks (rule 5).
    pub correct: bool,
    /// Re-run every task of G_S.
    pub full: bool,
    /// Most generations a correction may write.
    pub max_generations: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            epsilon: 0.05,
            q: 0.01,
            outputs: None,
            seed: None,
            secret: None,
            correct: false,
            full: false,
            max_generations: 8,
        }
    }
}

/// What a certifier reports while it works (a progress bar, a log line).
pub trait Progress: Sync {
    /// A pass over `generation` starts and will count `k` clean checks.
    fn pass(&self, _generation: u32, _k: u64) {}
    /// One check counted (clean or forged).
    fn checked(&self) {}
    /// A correction of `tasks` tasks (G_F) starts.
    fn correcting(&self, _tasks: u64) {}
    /// One task re-run by the correction.
    fn corrected(&self) {}
}

/// Reports nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;
impl Progress for NoProgress {}

/// Why certification could not reach a verdict.
#[derive(Debug, thiserror::Error)]
pub enum CertifyError {
    /// The log cannot be read.
    #[error(transparent)]
    Log(#[from] LogError),
    /// ε or q out of range.
    #[error(transparent)]
    Sample(#[from] SampleError),
    /// The registry cannot re-run a logged task: this is not the program that ran.
    #[error("the oracle cannot run this log: {0} (certify with the app that ran it)")]
    Program(RunError),
    /// The run did not finish.
    #[error("the run in this log has not finished ({0}): only a finished run can be certified")]
    NotFinished(String),
    /// An output asked for is not a terminal output of the run.
    #[error("{0} is not a terminal output of this run (see `inspect` for the outputs)")]
    UnknownOutput(DataId),
    /// Correction failed; the log is unchanged.
    #[error("correction failed: {0}")]
    Correct(#[from] CorrectError),
}

/// Certifies the run in `store` with the oracle's `registry` (rules 1-5). The certificate is
/// returned unsigned: sign it with [`Certificate::sign`] and the oracle's [`OracleKey`].
pub fn certify(
    store: Arc<dyn Store>,
    registry: &Registry,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<Certificate, CertifyError> {
    certify_with(store, registry, opts, &Prior::default(), progress)
}

/// What an online oracle learned while the run ran (rule 6).
#[derive(Clone, Debug, Default)]
pub struct Prior {
    /// Merkle leaves (`Track::leaf`) of the tasks it found clean.
    pub clean: HashSet<[u8; 32]>,
    /// Tasks it found forged, with what it found.
    pub forged: Vec<(TaskId, Detection)>,
    /// Tasks to check one by one, apart from the draw (every task a caught worker ran).
    pub distrusted: Vec<TaskId>,
}

/// [`certify`] with what an online oracle learned during the run (rule 6).
pub fn certify_with(
    store: Arc<dyn Store>,
    registry: &Registry,
    opts: &Options,
    prior: &Prior,
    progress: &dyn Progress,
) -> Result<Certificate, CertifyError> {
    certify_from(store, registry, opts, prior, progress, None).map(|(cert, _)| cert)
}

/// What [`certify_followed`] gives the online oracle.
#[derive(Debug)]
pub struct Followed {
    /// The certificate (unsigned).
    pub certificate: Certificate,
    /// The terminal outputs of the generation certified, in the manifest's order, if every
    /// one is in its log.
    pub outputs: Option<Vec<Vec<u8>>>,
}

/// [`certify_with`] for an online oracle: `track` is the log as it followed it
/// ([`online::Follower::final_track`]: every segment of the store read), so the first pass does
/// not read the log again; the terminal outputs come from the track certified.
pub fn certify_followed(
    store: Arc<dyn Store>,
    registry: &Registry,
    opts: &Options,
    prior: &Prior,
    progress: &dyn Progress,
    track: Option<Track>,
) -> Result<Followed, CertifyError> {
    let (certificate, track) = certify_from(store, registry, opts, prior, progress, track)?;
    Ok(Followed {
        certificate,
        outputs: track.terminal_values()?,
    })
}

/// Rules 1-6, starting from `followed`, the current generation already read, if given; with
/// the track of the generation certified.
fn certify_from(
    store: Arc<dyn Store>,
    registry: &Registry,
    opts: &Options,
    prior: &Prior,
    progress: &dyn Progress,
    mut followed: Option<Track>,
) -> Result<(Certificate, Track), CertifyError> {
    let n_eps_q = sample::n_eps_q(opts.epsilon, opts.q)?;
    let mut corrections: Vec<CorrectionRecord> = Vec::new();
    let later = Prior {
        clean: prior.clean.clone(),
        ..Prior::default()
    };
    let mut first = true;
    loop {
        let reader = LogReader::latest(store.clone())?;
        let loading = std::time::Instant::now();
        let track = match followed.take() {
            // Its manifest is the one read when following began: the run's end is in this one.
            Some(mut t) if t.generation == reader.generation() => {
                t.manifest = reader.manifest()?;
                t
            }
            _ => Track::load_from(&reader)?,
        };
        tracing::info!(
            generation = track.generation,
            tasks = track.len(),
            elapsed_s = loading.elapsed().as_secs_f64(),
            "certify: log loaded"
        );
        match &track.manifest.status {
            RunStatus::Finished => {}
            RunStatus::Running => {
                return Err(CertifyError::NotFinished("still running or crashed".into()))
            }
            RunStatus::Failed(e) => return Err(CertifyError::NotFinished(format!("failed: {e}"))),
            RunStatus::Interrupted => {
                return Err(CertifyError::NotFinished(
                    "interrupted: finish it with `run --resume` first".into(),
                ))
            }
        }
        let outputs = match &opts.outputs {
            None => track.terminal().to_vec(),
            Some(list) => {
                if let Some(d) = list.iter().find(|d| !track.terminal().contains(d)) {
                    return Err(CertifyError::UnknownOutput(*d));
                }
                list.clone()
            }
        };
        // Rule 6: detections and distrust apply to the run's own log; clean verdicts hold
        // wherever a task's content is unchanged.
        let this_prior = if first { prior } else { &later };
        first = false;
        let outcome = pass(&track, registry, opts, &outputs, this_prior, progress)?;
        let mut cert = outcome.certificate(&track, opts, n_eps_q, &outputs);
        cert.corrections = corrections.clone();
        let can_correct =
            opts.correct && cert.structural.is_empty() && track.generation < opts.max_generations;
        if !can_correct {
            return Ok((cert, track));
        }
        let (in_gf, redone) = match outcome.correction {
            Some(c) => c?,
            None => return Ok((cert, track)),
        };
        if !in_gf.iter().any(|&b| b) {
            return Ok((cert, track));
        }
        let logs = correct::next_generation(&reader, &track, &in_gf, &redone)?;
        let mut manifest = track.manifest.clone();
        let next = track.generation + 1;
        write_generation(&*store, &mut manifest, next, &logs)?;
        tracing::info!(
            generation = next,
            invalidated = in_gf.iter().filter(|&&b| b).count(),
            re_executed = redone.len(),
            "certify: corrected generation written"
        );
        corrections.push(CorrectionRecord {
            generation: next,
            detected: cert.detections.clone(),
            invalidated: in_gf.iter().filter(|&&b| b).count() as u64,
            re_executed: redone.len() as u64,
        });
    }
}

type CorrectionResult = Result<(Vec<bool>, Vec<correct::Redone>), CorrectError>;

/// The result of certifying one generation.
struct PassOutcome {
    gs: Vec<Ix>,
    k: u64,
    seed: u64,
    seed_source: &'static str,
    checked: Vec<Ix>,
    forged: Vec<(Ix, Detection)>,
    structural: Vec<StructuralError>,
    merkle_root: [u8; 32],
    log_digest: [u8; 32],
    correction: Option<CorrectionResult>,
}

fn derive_seed(log_digest: &[u8; 32], opts: &Options, outputs: &[DataId]) -> u64 {
    let mut h = blake3::Hasher::new_derive_key("veriflow certifier sample seed v1");
    h.update(log_digest);
    h.update(&opts.epsilon.to_le_bytes());
    h.update(&opts.q.to_le_bytes());
    h.update(&[u8::from(opts.full)]);
    for d in outputs {
        h.update(&d.0.to_le_bytes());
    }
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.finalize().as_bytes()[..8]);
    u64::from_le_bytes(b)
}

/// Rules 2-5 on one generation.
fn pass(
    track: &Track,
    registry: &Registry,
    opts: &Options,
    outputs: &[DataId],
    prior: &Prior,
    progress: &dyn Progress,
) -> Result<PassOutcome, CertifyError> {
    let phase = std::time::Instant::now();
    let (gs, mut structural) = track.terminal_subgraph(outputs);
    structural.extend(track.structural_check(&gs));
    let leaves = track.leaves();
    let (merkle_root, log_digest) = track.roots_of(&gs, &leaves);
    tracing::info!(
        generation = track.generation,
        terminal_subgraph = gs.len(),
        structural_errors = structural.len(),
        elapsed_s = phase.elapsed().as_secs_f64(),
        "certify: terminal subgraph, structural check and Merkle root"
    );
    // Rule 6: tasks found clean online are known by their leaves.
    let leaves = (!prior.clean.is_empty()).then_some(leaves);
    let n = gs.len() as u64;
    let k = if opts.full {
        n
    } else {
        sample::sample_size(opts.epsilon, opts.q, n)?
    };
    let (seed, seed_source) = match (&opts.secret, opts.seed) {
        (Some(_), _) => (0, "oracle secret"),
        (None, Some(s)) => (s, "given"),
        (None, None) => (derive_seed(&log_digest, opts, outputs), "log digest"),
    };
    let key = match &opts.secret {
        Some(secret) => DrawKey::from_secret(secret, track.generation),
        None => DrawKey::from_seed(seed, track.generation),
    };
    let mut out = PassOutcome {
        gs,
        k,
        seed,
        seed_source,
        checked: Vec::new(),
        forged: Vec::new(),
        structural,
        merkle_root,
        log_digest,
        correction: None,
    };
    if !out.structural.is_empty() {
        return Ok(out);
    }
    progress.pass(track.generation, k);
    let draws = Draws::of_track(track, &out.gs, &key);
    let (tx, rx) = mpsc::channel::<Vec<bool>>();
    let known = |t: Ix| {
        leaves
            .as_ref()
            .is_some_and(|l| prior.clean.contains(&l[t as usize]))
    };
    // Rule 6: the oracle's detections, and every task it distrusts checked (apart from the
    // draw); the forged ones start G_F.
    let mut found: Vec<(Ix, Detection)> = prior
        .forged
        .iter()
        .filter_map(|(id, d)| Some((track.index_of(*id)?, d.clone())))
        .collect();
    let mut suspects: Vec<Ix> = prior
        .distrusted
        .iter()
        .filter_map(|id| track.index_of(*id))
        .filter(|&t| !known(t) && !found.iter().any(|(f, _)| *f == t))
        .collect();
    suspects.sort_unstable();
    suspects.dedup();
    let verdicts: Vec<(Ix, Result<Verdict, RunError>)> = suspects
        .par_iter()
        .map(|&t| (t, oracle::check(track, registry, t)))
        .collect();
    for (t, v) in verdicts {
        if let Verdict::Forged(d) = v.map_err(CertifyError::Program)? {
            found.push((t, d));
        }
    }
    let mut gf: Option<correct::Closure> = None;
    for (t, d) in found {
        out.forged.push((t, d));
        if opts.correct {
            gf.get_or_insert_with(|| correct::Closure::new(track))
                .add(track, t);
        }
    }
    if let Some(c) = &gf {
        let _ = tx.send(c.marks().to_vec());
    }
    let checking = std::thread::scope(|scope| -> Result<Option<CorrectionResult>, CertifyError> {
        let corrector = opts.correct.then(|| {
            scope.spawn(move || -> CorrectionResult {
                // Rule 5: each message is the whole G_F so far; re-run the latest one.
                let mut last: Option<CorrectionResult> = None;
                while let Ok(mut in_gf) = rx.recv() {
                    while let Ok(newer) = rx.try_recv() {
                        in_gf = newer;
                    }
                    progress.correcting(in_gf.iter().filter(|&&b| b).count() as u64);
                    let redone =
                        correct::reexecute(track, registry, &in_gf, &|_| progress.corrected());
                    last = Some(redone.map(|r| (in_gf, r)));
                }
                last.unwrap_or_else(|| Ok((vec![false; track.len()], Vec::new())))
            })
        });
        let result = check_loop(
            track,
            registry,
            opts,
            &mut out,
            Checking {
                draws,
                gf,
                known: &known,
            },
            progress,
            &tx,
        );
        drop(tx);
        let correction = corrector.map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(CorrectError::Internal("its thread panicked".to_string())))
        });
        result.map(|()| correction)
    })?;
    out.correction = checking;
    tracing::info!(
        generation = track.generation,
        drawn = k,
        checked = out.checked.len(),
        forged = out.forged.len(),
        elapsed_s = phase.elapsed().as_secs_f64(),
        "certify: re-executions done"
    );
    Ok(out)
}

/// Where a pass's checking starts: the draw, G_F so far, and which tasks are known clean.
struct Checking<'a> {
    draws: Draws,
    gf: Option<correct::Closure>,
    known: &'a (dyn Fn(Ix) -> bool + Sync),
}

fn check_loop(
    track: &Track,
    registry: &Registry,
    opts: &Options,
    out: &mut PassOutcome,
    start: Checking<'_>,
    progress: &dyn Progress,
    tx: &mpsc::Sender<Vec<bool>>,
) -> Result<(), CertifyError> {
    let batch = (rayon::current_num_threads() * 8).max(16);
    let Checking {
        mut draws,
        mut gf,
        known,
    } = start;
    let no_gf = vec![false; track.len()];
    let mut counted: u64 = 0; // clean checks since the last detection (rule 5), or all checks
    'outer: loop {
        let mut picks: Vec<Ix> = Vec::with_capacity(batch);
        let in_gf = gf.as_ref().map_or(&no_gf[..], |c| c.marks());
        while picks.len() < batch {
            let Some(i) = draws.next() else { break };
            let t = out.gs[i];
            if !in_gf[t as usize] {
                picks.push(t);
            }
        }
        if picks.is_empty() {
            break;
        }
        let verdicts: Vec<Result<Verdict, RunError>> = picks
            .par_iter()
            .map(|&t| {
                if known(t) {
                    Ok(Verdict::Clean)
                } else {
                    oracle::check(track, registry, t)
                }
            })
            .collect();
        for (t, v) in picks.into_iter().zip(verdicts) {
            if gf.as_ref().is_some_and(|c| c.marks()[t as usize]) {
                continue; // fell into G_F after it was drawn
            }
            let v = v.map_err(CertifyError::Program)?;
            out.checked.push(t);
            progress.checked();
            match v {
                Verdict::Clean => counted += 1,
                Verdict::Forged(d) => {
                    out.forged.push((t, d));
                    if opts.correct {
                        let c = gf.get_or_insert_with(|| correct::Closure::new(track));
                        c.add(track, t);
                        let _ = tx.send(c.marks().to_vec());
                        counted = 0;
                    } else {
                        counted += 1;
                    }
                }
            }
            if counted >= out.k {
                break 'outer;
            }
        }
    }
    Ok(())
}

impl PassOutcome {
    fn certificate(
        &self,
        track: &Track,
        opts: &Options,
        n_eps_q: f64,
        outputs: &[DataId],
    ) -> Certificate {
        let decision = if self.structural.is_empty() && self.forged.is_empty() {
            Decision::Accept
        } else {
            Decision::Reject
        };
        let mut per: std::collections::BTreeMap<u32, VnodeCount> = Default::default();
        let vnode_of = |t: Ix| track.vnode(t).unwrap_or(VnodeId(0)).0;
        for &t in &self.gs {
            let v = vnode_of(t);
            per.entry(v)
                .or_insert_with(|| VnodeCount {
                    vnode: v,
                    tasks: 0,
                    checked: 0,
                    detections: 0,
                })
                .tasks += 1;
        }
        for &t in &self.checked {
            if let Some(c) = per.get_mut(&vnode_of(t)) {
                c.checked += 1;
            }
        }
        for (t, _) in &self.forged {
            if let Some(c) = per.get_mut(&vnode_of(*t)) {
                c.detections += 1;
            }
        }
        // Detections an online oracle made (rule 6) were not drawn here: only this pass's
        // checks count.
        let forged: HashSet<Ix> = self.forged.iter().map(|(t, _)| *t).collect();
        let clean = self.checked.iter().filter(|t| !forged.contains(t)).count() as u64;
        Certificate {
            format: certificate::FORMAT.to_string(),
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            program: track.manifest.program.clone(),
            root: format!("{:#}", track.manifest.root),
            generation: track.generation,
            decision,
            epsilon: opts.epsilon,
            q: opts.q,
            n: self.gs.len() as u64,
            k: self.k,
            n_eps_q,
            full: opts.full,
            seed: self.seed,
            seed_source: self.seed_source.to_string(),
            outputs: outputs.iter().map(|d| format!("{d:#}")).collect(),
            checked: self
                .checked
                .iter()
                .map(|&t| format!("{:#}", track.id(t)))
                .collect(),
            detections: self.forged.iter().map(|(_, d)| d.clone()).collect(),
            structural: self.structural.clone(),
            corrections: Vec::new(),
            per_vnode: per.into_values().collect(),
            q_hat: sample::q_hat(opts.epsilon, clean.min(self.k)),
            merkle_root: veriflow_checkpoint::hex::encode(&self.merkle_root),
            log_digest: veriflow_checkpoint::hex::encode(&self.log_digest),
            commitment: opts
                .secret
                .map(|s| veriflow_checkpoint::hex::encode(&draw::commitment(&s))),
            secret: opts.secret.map(|s| veriflow_checkpoint::hex::encode(&s)),
            online: None,
            signature_scheme: None,
            public_key: None,
            signature: None,
            mac: None,
        }
    }
}
