//! The online oracle process (issue 20): a trusted member that follows the cluster's jobs,
//! certifies them while they run, and has forgers evicted. Its certifier half, I/O-free but
//! for store reads, is `veriflow_certifier::online`; this is its driver.
//!
//! Rules:
//!
//! 1. It says `Hello::Oracle` with its certificate-signing public key to whichever coordinator
//!    holds the role, and comes back to the next one after a takeover (`coordinator` rules 10
//!    and 11), saying which job it follows; it keeps that job's follower and secret meanwhile.
//! 2. Per job a fresh 32-byte secret from the OS; its commitment (blake3 of it) goes to the
//!    coordinator, and from there to the client, before any task is checked. The secret is
//!    revealed only in the signed certificate.
//! 3. The follower polls the job's store every [`OracleConfig::poll_every`] on a thread of its
//!    own (store calls block); each forger it names is reported at once (`Forged`), and the
//!    coordinator evicts it.
//! 4. When the run ends (`Ended`) it certifies the finished log with what it learned
//!    (`certify_followed`, from the log as followed, correcting: G_F starts with every task of an evicted worker), signs the
//!    certificate with the online record attached, saves it when asked, and sends it with the
//!    terminal outputs of the generation it certified. It keeps that answer and sends it again
//!    if asked again (a new coordinator after a takeover): a correction is written once.
//! 5. A failure of its own (the store, a wrong program) is reported as `Failed` for the job;
//!    the oracle goes on following the next one. A coordinator that refuses it (another
//!    oracle is there) ends it with an error.

use std::path::PathBuf;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use veriflow_certifier::online::{Finding, Follower};
use veriflow_certifier::{certify_followed, NoProgress, Options, OracleKey};
use veriflow_checkpoint::{open_store, Key, Store, StoreSpec};
use veriflow_runtime::Registry;

use crate::error::ClusterError;
use crate::protocol::{FromOracle, Hello, Hosting, ToOracle};
use crate::submit::find;

/// How an oracle process runs.
pub struct OracleConfig {
    /// The program whose tasks `registry` holds: the oracle follows its jobs only.
    pub program: String,
    /// Every coordinator address known.
    pub coordinators: Vec<String>,
    /// The cluster's key (authenticates the links and opens the store).
    pub key: Key,
    /// The oracle's signing key (its public key verifies its certificates).
    pub oracle_key: OracleKey,
    /// The program's tasks, to re-run them.
    pub registry: Arc<Registry>,
    /// Bound on the risk of accepting a forged run.
    pub epsilon: f64,
    /// Assumed bound on the forgery rate.
    pub q: f64,
    /// The spot-check floor of each worker (`online` rule 4).
    pub spot_floor: f64,
    /// The fraction of completed tasks checked ahead for the final draw (`online` rule 2).
    pub draw_ahead: f64,
    /// How often the store is polled.
    pub poll_every: Duration,
    /// Where certificates are saved (`job-<id>.json`), if anywhere.
    pub certificates: Option<PathBuf>,
    /// Stop after the first job followed is over (certified or not).
    pub once: bool,
}

impl std::fmt::Debug for OracleConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OracleConfig")
            .field("coordinators", &self.coordinators)
            .field("epsilon", &self.epsilon)
            .field("q", &self.q)
            .finish_non_exhaustive()
    }
}

/// What the follower thread is told.
enum Cmd {
    Follow {
        job: u64,
        store: String,
        hosts: Vec<Hosting>,
    },
    Hosts(Vec<Hosting>),
    Ended(u64),
    Closed(u64),
}

/// What the follower thread says (sent on to the coordinator, or a line for the log).
enum Said {
    To(FromOracle),
    Note(String),
}

/// Runs an oracle (rules 1-5) until its first job is over (`once`) or it fails; `say` gets its
/// log lines. Returns the number of jobs it followed to their end.
pub fn run_oracle(cfg: OracleConfig, say: &mut dyn FnMut(&str)) -> Result<u64, ClusterError> {
    let rt = crate::client_runtime()?;
    let (cmd_tx, cmd_rx) = std_mpsc::channel::<Cmd>();
    let (said_tx, mut said_rx) = unbounded_channel::<Said>();
    let public_key = cfg.oracle_key.public().to_bytes();
    let program = cfg.program.clone();
    let (addrs, key, once) = (cfg.coordinators.clone(), cfg.key.clone(), cfg.once);
    let thread = std::thread::Builder::new()
        .name("oracle-follower".into())
        .spawn(move || follow_thread(cfg, cmd_rx, said_tx))
        .map_err(|e| ClusterError::Start {
            what: "the oracle's follower",
            source: e,
        })?;
    let result = rt.block_on(async {
        let mut addrs = addrs;
        let mut following: Option<u64> = None;
        let mut store_spec = String::new();
        let mut lost: Option<String> = None;
        let mut ended = 0u64;
        loop {
            let hello = Hello::Oracle {
                program: program.clone(),
                public_key,
                following,
            };
            let (addr, mut reader, mut writer, first) =
                find(&addrs, &key, &hello, lost.as_deref(), |m: &ToOracle| {
                    matches!(m, ToOracle::Standby { .. })
                })
                .await?;
            say(&format!("oracle: following the cluster at {addr}"));
            let (frames_tx, mut frames) = unbounded_channel::<Result<ToOracle, String>>();
            let reading = tokio::spawn(async move {
                loop {
                    let r = reader.recv::<ToOracle>().await.map_err(|e| e.to_string());
                    let end = r.is_err();
                    if frames_tx.send(r).is_err() || end {
                        return;
                    }
                }
            });
            let mut next = Some(first);
            let why = loop {
                let msg = match next.take() {
                    Some(m) => m,
                    None => tokio::select! {
                        f = frames.recv() => match f {
                            Some(Ok(m)) => m,
                            Some(Err(e)) => break format!("{addr}: {e}"),
                            None => break format!("{addr}: the connection ended"),
                        },
                        s = said_rx.recv() => {
                            match s {
                                Some(Said::To(m)) => {
                                    if let Err(e) = writer.send(&m).await {
                                        break format!("{addr}: {e}");
                                    }
                                }
                                Some(Said::Note(line)) => say(&line),
                                None => return Err(ClusterError::Start {
                                    what: "the oracle's follower",
                                    source: std::io::Error::other(
                                        "its thread stopped unexpectedly (a bug: its \
                                         message is above)",
                                    ),
                                }),
                            }
                            continue;
                        }
                    },
                };
                match msg {
                    ToOracle::Welcome {
                        coordinators,
                        store,
                        ..
                    } => {
                        store_spec = store;
                        for c in coordinators {
                            if !addrs.contains(&c) {
                                addrs.push(c);
                            }
                        }
                    }
                    ToOracle::Standby { .. } => break format!("{addr} became a standby"),
                    ToOracle::Refused { reason } => {
                        reading.abort();
                        return Err(ClusterError::Refused { addr, reason });
                    }
                    ToOracle::Follow {
                        job, vnodes, hosts, ..
                    } => {
                        say(&format!("oracle: following job {job} ({vnodes} vnodes)"));
                        following = Some(job);
                        let _ = cmd_tx.send(Cmd::Follow {
                            job,
                            store: store_spec.clone(),
                            hosts,
                        });
                    }
                    ToOracle::Hosts { hosts, .. } => {
                        let _ = cmd_tx.send(Cmd::Hosts(hosts));
                    }
                    ToOracle::Evicted { job, worker } => {
                        say(&format!("oracle: worker {worker} evicted from job {job}"));
                    }
                    ToOracle::Ended { job } => {
                        say(&format!("oracle: job {job} ended; certifying"));
                        let _ = cmd_tx.send(Cmd::Ended(job));
                    }
                    ToOracle::Closed { job } => {
                        following = None;
                        let _ = cmd_tx.send(Cmd::Closed(job));
                        ended += 1;
                        if once {
                            reading.abort();
                            return Ok(ended);
                        }
                    }
                }
            };
            reading.abort();
            say(&format!("oracle: lost the coordinator: {why}"));
            lost = Some(why);
        }
    });
    drop(cmd_tx);
    let _ = thread.join();
    result
}

/// One job followed: its follower, secret and store, and its answer once certified.
struct Job {
    id: u64,
    secret: [u8; 32],
    store: Arc<dyn Store>,
    follower: Follower,
    answer: Option<FromOracle>,
}

/// The follower thread (rules 2-5): store calls and re-runs happen here.
fn follow_thread(cfg: OracleConfig, cmds: std_mpsc::Receiver<Cmd>, said: UnboundedSender<Said>) {
    let send = |m: FromOracle| {
        let _ = said.send(Said::To(m));
    };
    let note = |line: String| {
        let _ = said.send(Said::Note(line));
    };
    let mut job: Option<Job> = None;
    loop {
        let cmd = match cmds.recv_timeout(cfg.poll_every) {
            Ok(c) => Some(c),
            Err(std_mpsc::RecvTimeoutError::Timeout) => None,
            Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
        };
        match cmd {
            Some(Cmd::Follow {
                job: id,
                store,
                hosts,
            }) => {
                if job.as_ref().map(|j| j.id) != Some(id) {
                    job = None;
                    match start(&cfg, id, &store) {
                        Ok(j) => job = Some(j),
                        Err(error) => {
                            send(FromOracle::Failed { job: id, error });
                            continue;
                        }
                    }
                }
                let j = job.as_mut().expect("set above");
                for (v, e, w) in hosts {
                    j.follower.hosted(v, e, w);
                }
                // Rule 2: the commitment before anything is checked (again after a takeover:
                // the same one).
                send(FromOracle::Committed {
                    job: id,
                    commitment: veriflow_certifier::draw::commitment(&j.secret),
                });
            }
            Some(Cmd::Hosts(hosts)) => {
                if let Some(j) = job.as_mut() {
                    for (v, e, w) in hosts {
                        j.follower.hosted(v, e, w);
                    }
                }
            }
            Some(Cmd::Ended(id)) => {
                let Some(j) = job.as_mut().filter(|j| j.id == id) else {
                    send(FromOracle::Failed {
                        job: id,
                        error: "the oracle did not follow this job".to_string(),
                    });
                    continue;
                };
                if j.answer.is_none() {
                    j.answer = Some(certify_job(&cfg, j, &note));
                }
                if let Some(a) = &j.answer {
                    send(a.clone());
                }
            }
            Some(Cmd::Closed(id)) => {
                if job.as_ref().is_some_and(|j| j.id == id) {
                    job = None;
                }
            }
            None => {
                let Some(j) = job.as_mut().filter(|j| j.answer.is_none()) else {
                    continue;
                };
                match j.follower.poll() {
                    Ok(p) => {
                        if p.checked > 0 || !p.findings.is_empty() {
                            tracing::debug!(
                                job = j.id,
                                events = p.events,
                                checked = p.checked,
                                forged = p.findings.len(),
                                "oracle: followed the logs"
                            );
                        }
                        if p.checked > 0 {
                            send(FromOracle::Checked {
                                job: j.id,
                                tasks: p.checked,
                            });
                        }
                        for Finding {
                            incarnation: (vnode, epoch),
                            detection,
                            worker,
                        } in p.findings
                        {
                            note(format!(
                                "oracle: job {}: task {} of vnode {vnode} (epoch {epoch}{}) is \
                                 forged: {}",
                                j.id,
                                detection.task,
                                worker.map(|w| format!(", worker {w}")).unwrap_or_default(),
                                detection.reason
                            ));
                            send(FromOracle::Forged {
                                job: j.id,
                                vnode,
                                epoch,
                                task: detection.task,
                                reason: detection.reason,
                            });
                        }
                    }
                    Err(e) => {
                        // Rule 5: the oracle's own trouble accuses nobody.
                        note(format!("oracle: job {}: cannot follow the logs: {e}", j.id));
                    }
                }
            }
        }
    }
}

/// Rule 2: a job followed from now on.
fn start(cfg: &OracleConfig, id: u64, store: &str) -> Result<Job, String> {
    let spec: StoreSpec = store
        .parse()
        .map_err(|e| format!("the job's store {store:?}: {e}"))?;
    let store = open_store(&spec, Some(&cfg.key))
        .and_then(|s| crate::job_store(&s, id, false))
        .map_err(|e| format!("{spec}: {e}"))?;
    let secret = veriflow_checkpoint::key::random_bytes::<32>();
    let follower = Follower::new(
        store.clone(),
        cfg.registry.clone(),
        &secret,
        cfg.epsilon,
        cfg.q,
        cfg.spot_floor,
    )
    .and_then(|f| f.draw_ahead(cfg.draw_ahead))
    .map_err(|e| e.to_string())?;
    Ok(Job {
        id,
        secret,
        store,
        follower,
        answer: None,
    })
}

/// Rule 4: the certificate of a finished job, or why there is none.
fn certify_job(cfg: &OracleConfig, j: &mut Job, note: &dyn Fn(String)) -> FromOracle {
    let failed = |error: String| FromOracle::Failed { job: j.id, error };
    // What the follower has not read yet is read by the certification itself.
    if let Err(e) = j.follower.poll() {
        note(format!("oracle: job {}: last poll: {e}", j.id));
    }
    let opts = Options {
        epsilon: cfg.epsilon,
        q: cfg.q,
        secret: Some(j.secret),
        correct: true,
        ..Options::default()
    };
    let prior = j.follower.prior();
    // Rule 4: the log as followed, when it is all of it (`online` rule 7).
    let track = match j.follower.final_track() {
        Ok(t) => t,
        Err(e) => {
            note(format!("oracle: job {}: reading the log again: {e}", j.id));
            None
        }
    };
    let followed = match certify_followed(
        j.store.clone(),
        &cfg.registry,
        &opts,
        &prior,
        &NoProgress,
        track,
    ) {
        Ok(c) => c,
        Err(e) => return failed(e.to_string()),
    };
    let mut cert = followed.certificate;
    cert.online = Some(j.follower.record(j.id));
    if let Err(e) = cert.sign(&cfg.oracle_key) {
        return failed(format!("cannot sign the certificate: {e}"));
    }
    let outputs = match followed.outputs {
        Some(o) => o,
        None => return failed("the certified log does not hold the outputs".to_string()),
    };
    let json = cert.to_json();
    if let Some(dir) = &cfg.certificates {
        let path = dir.join(format!("job-{}.json", j.id));
        match std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, &json)) {
            Ok(()) => note(format!("oracle: wrote {}", path.display())),
            Err(e) => note(format!("oracle: cannot write {}: {e}", path.display())),
        }
    }
    note(format!(
        "oracle: job {}: {} (generation {}, {} checked during the run, {} corrections)",
        j.id,
        cert.decision,
        cert.generation,
        j.follower.checked(),
        cert.corrections.len()
    ));
    FromOracle::Certified {
        job: j.id,
        decision: cert.decision.to_string(),
        certificate: json,
        outputs,
    }
}
