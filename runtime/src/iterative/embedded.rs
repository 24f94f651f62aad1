//! Embedded iterative runs: the vnodes' nodes on a pool of threads in this process
//! (`pool.rs`), over the in-process transport (optionally lossy), with seeded vnode kills and
//! replacements.
//!
//! Rules:
//!
//! 1. A killed vnode loses all its memory; its inbox survives (messages to a vnode that is not
//!    hosted right now wait for its replacement, as the routed transport of cluster mode does).
//! 2. The supervisor plays the part of cluster mode's coordinator and failure detector: it sees
//!    a vnode die, waits [`Embedded::replace_after`] (the detection delay), and starts a
//!    replacement with the next epoch, which restores from backups (module rule 6).
//! 3. Kills are drawn from [`IterKills::seed`]; a kill waits until every vnode is up and ready
//!    (module rule 6: a replacement holds fresh backups of the vnodes it backs up), so one
//!    replacement restores at a time and no kill finds a vnode's backups half rebuilt.
//! 4. The run ends when every vnode has reported its final state; the supervisor then stops all.
//! 5. The nodes run on [`Embedded::threads`] workers (default min(cores, vnodes)) that take
//!    first the nodes whose neighbours' halos are fresh (`pool.rs` rules 1-5), not on a thread
//!    per vnode: more threads than cores made asynchronous vnodes iterate on stale halos. A
//!    kill or the stop pokes the nodes concerned, so a parked node sees it at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

use super::conv::spanning_tree;
use super::node::{make_node, Control, Exit, ExitMsg, Incarnation, Node, NodeStats};
use super::pool::Pool;
use super::{BlockFactory, IterConfig, IterError, IterReport};
use crate::ids::{Epoch, VnodeId};
use crate::transport::{Endpoint, InProcTransport, LossyTransport, Transport};

/// Random vnode kills during an embedded run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IterKills {
    /// A kill every this long (after the previous replacement is up).
    pub every: Duration,
    /// At most this many kills.
    pub count: u32,
    /// Seed of the choice of victims.
    pub seed: u64,
}

/// Options of an embedded run.
#[derive(Clone, Debug)]
pub struct Embedded {
    /// Probability that any message is lost.
    pub loss: f64,
    /// Seed of the losses.
    pub seed: u64,
    /// Vnode kills.
    pub kills: Option<IterKills>,
    /// Detection delay before a replacement starts (rule 2).
    pub replace_after: Duration,
    /// Worker threads of the pool (rule 5); 0: min(cores, vnodes).
    pub threads: usize,
}

impl Default for Embedded {
    fn default() -> Self {
        Embedded {
            loss: 0.0,
            seed: 0,
            kills: None,
            replace_after: Duration::from_millis(20),
            threads: 0,
        }
    }
}

/// Runs the blocks `factory` makes on a pool of threads, until global convergence of the last
/// step (rules 1-5).
pub fn run_embedded(
    cfg: IterConfig,
    factory: BlockFactory,
    opts: &Embedded,
) -> Result<IterReport, IterError> {
    cfg.validate()?;
    if !(0.0..1.0).contains(&opts.loss) {
        return Err(IterError::Config(format!(
            "message loss {} must be in [0, 1)",
            opts.loss
        )));
    }
    let n = cfg.neighbours.len();
    let tree = spanning_tree(&cfg.neighbours);
    let cfg = Arc::new(cfg);
    let transport: Box<dyn Transport> = if opts.loss > 0.0 {
        Box::new(LossyTransport::new(
            Box::new(InProcTransport::new(n as u32)),
            opts.loss,
            0.0,
            opts.seed,
        ))
    } else {
        Box::new(InProcTransport::new(n as u32))
    };
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = mpsc::channel();
    let (exit_tx, exit_rx) = mpsc::channel::<ExitMsg>();
    let mut controls: Vec<Arc<Control>> = Vec::with_capacity(n);
    let mut epochs = vec![Epoch(0); n];
    let mut alive = vec![true; n];
    let mut stats = vec![NodeStats::default(); n];
    let mut states: Vec<Option<(u64, Vec<u8>)>> = vec![None; n];
    let mut replace_at: Vec<Option<(Instant, Box<dyn Endpoint>)>> = (0..n).map(|_| None).collect();
    let mut running = 0usize;
    let threads = match opts.threads {
        0 => std::thread::available_parallelism()
            .map_or(1, |c| c.get())
            .min(n),
        t => t,
    };
    let exits = exit_tx;
    let pool: Pool<Node> = Pool::new(
        n,
        threads,
        Box::new(move |v, node: Option<Node>, exit| {
            let (s, ep) = node.map_or((NodeStats::default(), None), |node| {
                let (s, ep) = node.into_parts();
                (s, Some(ep))
            });
            let _ = exits.send((v, exit, s, ep));
        }),
    )?;
    let spawn = |v: VnodeId,
                 epoch: Epoch,
                 ep: Box<dyn Endpoint>,
                 restore: bool,
                 ctl: Arc<Control>|
     -> Result<(), IterError> {
        let node = make_node(
            Incarnation {
                vnode: v,
                epoch,
                restore,
            },
            ep,
            &factory,
            &cfg,
            ctl,
            &tree,
            pool.now(),
        )?;
        pool.add(v, node)
    };
    let control = || {
        Arc::new(Control {
            kill: AtomicBool::new(false),
            stop: stop.clone(),
            done: done_tx.clone(),
            ready: AtomicBool::new(false),
        })
    };
    let mut failure: Option<IterError> = None;
    for i in 0..n {
        let v = VnodeId(i as u32);
        let ctl = control();
        controls.push(ctl.clone());
        let ep = pool.doorbell(
            transport
                .endpoint(v)
                .map_err(|e| IterError::Config(e.to_string()))?,
        );
        if let Err(e) = spawn(v, Epoch(0), ep, false, ctl) {
            failure = Some(e);
            break;
        }
        running += 1;
    }
    let mut rng = opts.kills.map(|k| ChaCha8Rng::seed_from_u64(k.seed));
    let mut kills_left = opts.kills.map_or(0, |k| k.count);
    let mut next_kill = opts.kills.map(|k| start + k.every);
    let mut replacements = 0u64;
    while running > 0 || replace_at.iter().any(Option::is_some) {
        while let Ok((v, steps, state)) = done_rx.try_recv() {
            states[v.0 as usize] = Some((steps, state));
        }
        if (failure.is_some() || states.iter().all(Option::is_some))
            && !stop.swap(true, Ordering::Relaxed)
        {
            pool.poke_all(); // rule 5
        }
        let now = Instant::now();
        // Rule 3.
        if let (Some(k), Some(rng), Some(at)) = (opts.kills, rng.as_mut(), next_kill) {
            if now >= at
                && kills_left > 0
                && alive.iter().all(|&a| a)
                && controls.iter().all(|c| c.ready.load(Ordering::Relaxed))
                && !stop.load(Ordering::Relaxed)
            {
                let victim = rng.random_range(0..n);
                controls[victim].kill.store(true, Ordering::Relaxed);
                pool.poke(VnodeId(victim as u32)); // rule 5
                alive[victim] = false;
                kills_left -= 1;
                next_kill = Some(now + k.every);
            }
        }
        // Rule 2.
        for i in 0..n {
            if replace_at[i].as_ref().is_some_and(|(t, _)| now >= *t) {
                let (_, ep) = replace_at[i].take().expect("checked");
                if stop.load(Ordering::Relaxed) {
                    continue;
                }
                epochs[i] = Epoch(epochs[i].0 + 1);
                let ctl = control();
                controls[i] = ctl.clone();
                match spawn(VnodeId(i as u32), epochs[i], ep, true, ctl) {
                    Ok(()) => {
                        running += 1;
                        alive[i] = true;
                        replacements += 1;
                    }
                    Err(e) => failure = failure.or(Some(e)),
                }
            }
        }
        match exit_rx.recv_timeout(Duration::from_millis(2)) {
            Ok((v, exit, s, ep)) => {
                running -= 1;
                stats[v.0 as usize].add(&s);
                match exit {
                    Exit::Stopped => {}
                    Exit::Killed => {
                        if let (false, Some(ep)) = (stop.load(Ordering::Relaxed), ep) {
                            replace_at[v.0 as usize] =
                                Some((Instant::now() + opts.replace_after, ep));
                        }
                    }
                    Exit::Failed(e) => failure = failure.or(Some(e)),
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    let mut out = Vec::with_capacity(n);
    let mut steps = 0;
    for (i, s) in states.into_iter().enumerate() {
        let (st, state) = s.ok_or(IterError::Panicked(VnodeId(i as u32)))?;
        steps = st;
        out.push(state);
    }
    Ok(IterReport {
        states: out,
        steps,
        vnodes: stats,
        replacements,
        elapsed_s: start.elapsed().as_secs_f64(),
    })
}
