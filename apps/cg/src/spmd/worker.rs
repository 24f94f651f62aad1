//! A worker vnode: owns a row block, runs the lock-step CG loop (module rules 1-2), takes its
//! part of checkpoints (rule 3), dies when told to (rule 4), and rolls back or rebuilds its
//! state on the master's word (rules 5-6).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use veriflow::runtime::transport::Endpoint;

use super::wire::{self, Phase, Received, Wire};
use super::{coding, Encoding, Exit, Plan, SpmdError};
use crate::kernel::{self, BlockState};
use crate::matrix::{self, poisson, Csr};
use crate::problem::{exact_solution, ProblemError, Source};

/// How an incarnation starts.
pub(crate) enum Start {
    /// One of the first P workers.
    Fresh,
    /// A spare for a dead worker (rule 6).
    Spare {
        g: u64,
        stamp: u64,
        lost: Vec<u32>,
        table: Vec<(u64, u64)>,
    },
}

/// What to restore before iterating.
enum Todo {
    /// The initial state, rebuilt from the source (`lost`: report Recovered).
    Initial { lost: bool },
    /// This worker's own copy of checkpoint `stamp`.
    Copy(u64),
    /// Rebuild from the encoding (rule 6).
    Rebuild { stamp: u64, lost: Vec<u32> },
}

/// Why the loop stopped short.
enum Interrupt {
    Abort(u64),
    Stop,
    Killed(u64),
    Fatal(SpmdError),
}

impl From<SpmdError> for Interrupt {
    fn from(e: SpmdError) -> Self {
        Interrupt::Fatal(e)
    }
}

/// Stash key: what, generation, iteration, sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Tag {
    Table,
    Halo,
    Partials(Phase),
    Copy,
    Parity,
}

type Key = (Tag, u64, u64, usize);

struct Worker {
    plan: Arc<Plan>,
    me: usize,
    ep: Box<dyn Endpoint>,
    g: u64,
    kills: Vec<u64>,
    rows: Range<usize>,
    a: Csr,
    b: Vec<f64>,
    /// Columns `lo..hi` of p are held (rule 2).
    lo: usize,
    hi: usize,
    /// Who sends me which rows of p, and to whom I send which of mine.
    senders: Vec<(usize, Range<usize>)>,
    receivers: Vec<(usize, Range<usize>)>,
    x: Vec<f64>,
    r: Vec<f64>,
    pwin: Vec<f64>,
    q: Vec<f64>,
    rho: f64,
    threshold: f64,
    k: u64,
    last_ckpt: u64,
    copies: Vec<(u64, Vec<u8>)>,
    /// Buffers of dropped copies, reused by the next checkpoint (no fresh pages to fault in).
    spare: Vec<Vec<u8>>,
    checkpoint_ns: u64,
    stash: HashMap<Key, (Wire, Vec<u8>)>,
}

/// Runs worker `me` until Stop, a kill or a fatal error.
pub(crate) fn run(
    plan: Arc<Plan>,
    me: usize,
    start: Start,
    kills: Vec<u64>,
    mut ep: Box<dyn Endpoint>,
) -> (Exit, Option<Box<dyn Endpoint>>) {
    let rows = plan.rows_of(me);
    let loaded = load_rows(&plan.source, plan.n, rows.clone()).map(|a| {
        let (lo, hi) = window(&a, rows.clone());
        let l = exact_solution(plan.rhs, lo..hi);
        let b = rhs_rows(&a, &l, lo);
        (a, b, lo, hi)
    });
    let (a, b, lo, hi) = match loaded {
        Ok(v) => v,
        Err(e) => {
            let master = plan.master;
            let msg = Wire::Failed {
                message: e.to_string(),
            };
            let _ = wire::send(&mut *ep, master, &msg, Vec::new());
            return (Exit::Failed(e), Some(ep));
        }
    };
    let nrows = rows.len();
    let mut w = Worker {
        plan,
        me,
        ep,
        g: 0,
        kills,
        rows,
        a,
        b,
        lo,
        hi,
        senders: Vec::new(),
        receivers: Vec::new(),
        x: vec![0.0; nrows],
        r: vec![0.0; nrows],
        pwin: vec![0.0; hi - lo],
        q: vec![0.0; nrows],
        rho: 0.0,
        threshold: 0.0,
        k: 0,
        last_ckpt: 0,
        copies: Vec::new(),
        spare: Vec::new(),
        checkpoint_ns: 0,
        stash: HashMap::new(),
    };
    let exit = match w.main(start) {
        Ok(()) | Err(Interrupt::Stop) | Err(Interrupt::Abort(_)) => Exit::Stopped,
        Err(Interrupt::Killed(at)) => {
            // Rule 4: everything but the endpoint is dropped with `w`.
            let copies = std::mem::take(&mut w.copies);
            return (Exit::Killed { at, copies }, Some(w.ep));
        }
        Err(Interrupt::Fatal(e)) => {
            let master = w.plan.master;
            let msg = Wire::Failed {
                message: e.to_string(),
            };
            let _ = wire::send(&mut *w.ep, master, &msg, Vec::new());
            Exit::Failed(e)
        }
    };
    (exit, Some(w.ep))
}

/// Rows `rows` of the matrix, read again from the source (a file is re-read and re-parsed,
/// and must still have its digest; a Poisson grid generates just those rows).
pub(crate) fn load_rows(source: &Source, n: usize, rows: Range<usize>) -> Result<Csr, SpmdError> {
    match source {
        Source::Poisson2d(s) => Ok(poisson::rows(poisson::Grid::D2(*s), rows)),
        Source::Poisson3d(s) => Ok(poisson::rows(poisson::Grid::D3(*s), rows)),
        Source::File { path, digest } => {
            let bytes = std::fs::read(path).map_err(|source| {
                ProblemError::Matrix(matrix::MatrixError::Io {
                    path: path.clone(),
                    source,
                })
            })?;
            let found = blake3::hash(&bytes).to_hex().to_string();
            if found != *digest {
                return Err(ProblemError::Changed {
                    path: path.clone(),
                    expected: digest.clone(),
                    found,
                }
                .into());
            }
            let m = matrix::parse(path, &bytes)
                .map_err(ProblemError::from)?
                .matrix;
            if m.n_rows != n || rows.end > n {
                return Err(SpmdError::Protocol(format!(
                    "{path}: {} rows, the run has {n}",
                    m.n_rows
                )));
            }
            Ok(m.slice_rows(rows))
        }
    }
}

/// The columns `a`'s rows touch, with the rows themselves (rule 2).
fn window(a: &Csr, rows: Range<usize>) -> (usize, usize) {
    let lo = a
        .col
        .iter()
        .map(|&c| c as usize)
        .min()
        .unwrap_or(rows.start);
    let hi = a
        .col
        .iter()
        .map(|&c| c as usize + 1)
        .max()
        .unwrap_or(rows.end);
    (lo.min(rows.start), hi.max(rows.end))
}

/// b = A L for `a`'s rows, with L held for columns `lo..`: the same sums in the same order as
/// [`Csr::mul_vec`], hence the same bits as the whole problem's b.
fn rhs_rows(a: &Csr, l: &[f64], lo: usize) -> Vec<f64> {
    (0..a.n_rows)
        .map(|i| {
            a.view()
                .span(i)
                .map(|k| a.val[k] * l[a.col[k] as usize - lo])
                .sum()
        })
        .collect()
}

/// The exact layout of [`BlockState::to_bytes`] (kernel rule 4), written from the worker's
/// vectors without building a state, with room for a message header after it.
#[cfg(test)]
fn state_bytes(iteration: u64, rho: f64, x: &[f64], r: &[f64], p: &[f64]) -> Vec<u8> {
    let mut out = Vec::new();
    state_bytes_into(&mut out, iteration, rho, x, r, p);
    out
}

/// The state's bytes (`BlockState::to_bytes`' layout) into `out`, reusing its allocation.
fn state_bytes_into(out: &mut Vec<u8>, iteration: u64, rho: f64, x: &[f64], r: &[f64], p: &[f64]) {
    out.clear();
    out.reserve(BlockState::encoded_len(x.len()) + 96);
    out.extend_from_slice(&iteration.to_le_bytes());
    out.extend_from_slice(&rho.to_bits().to_le_bytes());
    out.extend_from_slice(&(x.len() as u64).to_le_bytes());
    for v in [x, r, p] {
        wire::append_f64s(out, v);
    }
}

fn ns(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl Worker {
    fn own(&self) -> Range<usize> {
        self.rows.start - self.lo..self.rows.end - self.lo
    }

    fn send(&mut self, to: usize, w: &Wire, bulk: Vec<u8>) -> Result<(), SpmdError> {
        wire::send(&mut *self.ep, to, w, bulk)
    }

    fn main(&mut self, start: Start) -> Result<(), Interrupt> {
        let mut todo = match start {
            Start::Fresh => {
                let (lo, hi) = (self.lo as u64, self.hi as u64);
                let master = self.plan.master;
                self.send(master, &Wire::Window { lo, hi }, Vec::new())?;
                let (w, _) = self.wait((Tag::Table, 0, 0, master))?;
                let Wire::Table { windows } = w else {
                    return Err(SpmdError::Protocol("not a table".into()).into());
                };
                self.set_table(&windows)?;
                Todo::Initial { lost: false }
            }
            Start::Spare {
                g,
                stamp,
                lost,
                table,
            } => {
                self.g = g;
                self.set_table(&table)?;
                if stamp == 0 {
                    Todo::Initial { lost: true }
                } else {
                    Todo::Rebuild { stamp, lost }
                }
            }
        };
        loop {
            let run = self.restore(todo).and_then(|()| self.iterate());
            match run {
                Ok(()) => {
                    let master = self.plan.master;
                    let done = Wire::Done {
                        g: self.g,
                        k: self.k,
                        rho: self.rho,
                        converged: kernel::converged(self.rho, self.threshold),
                        checkpoint_ns: self.checkpoint_ns,
                        last_stamp: self.last_ckpt,
                    };
                    let x = wire::f64_bytes(&self.x);
                    self.send(master, &done, x)?;
                }
                Err(Interrupt::Abort(g)) => self.halted(g)?,
                Err(e) => return Err(e),
            }
            todo = self.wait_control()?;
        }
    }

    fn halted(&mut self, g: u64) -> Result<(), Interrupt> {
        self.g = g;
        self.stash.retain(|k, _| k.1 >= g);
        let master = self.plan.master;
        self.send(master, &Wire::Halted { g }, Vec::new())?;
        Ok(())
    }

    /// After Done or Halted: wait for the master's Rollback or Stop (rule 6).
    fn wait_control(&mut self) -> Result<Todo, Interrupt> {
        loop {
            match self.next() {
                Err(Interrupt::Abort(g)) => self.halted(g)?,
                Err(e) => return Err(e),
                Ok((_, Wire::Rollback { g, stamp, lost }, _)) if g >= self.g => {
                    self.g = g;
                    self.stash.retain(|k, _| k.1 >= g);
                    let me_lost = lost.contains(&(self.me as u32));
                    return Ok(if stamp == 0 {
                        Todo::Initial { lost: me_lost }
                    } else if me_lost {
                        Todo::Rebuild { stamp, lost }
                    } else {
                        Todo::Copy(stamp)
                    });
                }
                Ok(m) => self.keep(m),
            }
        }
    }

    fn set_table(&mut self, windows: &[(u64, u64)]) -> Result<(), SpmdError> {
        if windows.len() != self.plan.workers {
            return Err(SpmdError::Protocol(format!(
                "a table of {} windows for {} workers",
                windows.len(),
                self.plan.workers
            )));
        }
        let cut = |a: &Range<usize>, b: &Range<usize>| a.start.max(b.start)..a.end.min(b.end);
        let mine = self.lo..self.hi;
        self.senders.clear();
        self.receivers.clear();
        for (v, &(lo, hi)) in windows.iter().enumerate() {
            if v == self.me {
                continue;
            }
            let theirs = self.plan.rows_of(v);
            let get = cut(&mine, &theirs);
            if !get.is_empty() {
                self.senders.push((v, get));
            }
            let give = cut(&(lo as usize..hi as usize), &self.rows);
            if !give.is_empty() {
                self.receivers.push((v, give));
            }
        }
        Ok(())
    }

    /// The next message, with the messages every state answers handled here: Abort and Stop
    /// interrupt, Commit drops old copies (rule 3), Fetch is answered (rule 6).
    fn next(&mut self) -> Result<Received, Interrupt> {
        loop {
            let Some(msg) = wire::recv(&mut *self.ep, Duration::from_millis(100)) else {
                continue;
            };
            let (from, w, bulk) = msg?;
            match w {
                // Strictly newer: an Abort left in the inbox of a dead predecessor is stale (rule 5).
                Wire::Abort { g } if g > self.g => return Err(Interrupt::Abort(g)),
                Wire::Stop => return Err(Interrupt::Stop),
                Wire::Commit { stamp } => {
                    let (keep, old): (Vec<_>, Vec<_>) = std::mem::take(&mut self.copies)
                        .into_iter()
                        .partition(|c| c.0 >= stamp);
                    self.copies = keep;
                    self.spare.extend(old.into_iter().map(|c| c.1));
                    self.spare.truncate(1);
                }
                Wire::Fetch { g, stamp } => {
                    let copy = self
                        .copies
                        .iter()
                        .find(|c| c.0 == stamp)
                        .map(|c| c.1.clone());
                    let Some(bytes) = copy else {
                        return Err(SpmdError::Protocol(format!(
                            "w{} holds no copy of checkpoint {stamp}",
                            self.me
                        ))
                        .into());
                    };
                    let threshold = self.threshold;
                    let reply = Wire::Copy {
                        g,
                        stamp,
                        threshold,
                    };
                    self.send(from, &reply, bytes)?;
                }
                w => return Ok((from, w, bulk)),
            }
        }
    }

    fn key_of(from: usize, w: &Wire) -> Option<Key> {
        match *w {
            Wire::Table { .. } => Some((Tag::Table, 0, 0, from)),
            Wire::Halo { g, k, .. } => Some((Tag::Halo, g, k, from)),
            Wire::Partials { g, k, phase } => Some((Tag::Partials(phase), g, k, from)),
            Wire::Copy { g, stamp, .. } => Some((Tag::Copy, g, stamp, from)),
            Wire::Parity { g, stamp, .. } => Some((Tag::Parity, g, stamp, from)),
            _ => None,
        }
    }

    /// Keeps a message for later if it belongs to this generation or a later one.
    fn keep(&mut self, (from, w, bulk): Received) {
        if let Some(key) = Self::key_of(from, &w) {
            if key.1 >= self.g || key.0 == Tag::Table {
                self.stash.insert(key, (w, bulk));
            }
        }
    }

    /// Waits for the message `key`, keeping others (rule 5: older generations are dropped).
    fn wait(&mut self, key: Key) -> Result<(Wire, Vec<u8>), Interrupt> {
        if let Some(v) = self.stash.remove(&key) {
            return Ok(v);
        }
        loop {
            let (from, w, bulk) = self.next()?;
            if Self::key_of(from, &w) == Some(key) {
                return Ok((w, bulk));
            }
            self.keep((from, w, bulk));
        }
    }

    /// An allgather of per-block partials, summed over all blocks in order (rule 1).
    fn reduce(&mut self, phase: Phase, mine: &[f64]) -> Result<f64, Interrupt> {
        let (g, k) = (self.g, self.k);
        for v in 0..self.plan.workers {
            if v != self.me {
                let w = Wire::Partials { g, k, phase };
                self.send(v, &w, wire::f64_bytes(mine))?;
            }
        }
        let mut all = vec![0.0; self.plan.blocks.blocks];
        for v in 0..self.plan.workers {
            let blocks = self.plan.blocks_of(v);
            let vals = if v == self.me {
                mine.to_vec()
            } else {
                let (_, bulk) = self.wait((Tag::Partials(phase), g, k, v))?;
                wire::bytes_f64(&bulk)?
            };
            if vals.len() != blocks.len() {
                return Err(SpmdError::Protocol(format!(
                    "w{v} sent {} partials for {} blocks",
                    vals.len(),
                    blocks.len()
                ))
                .into());
            }
            all[blocks].copy_from_slice(&vals);
        }
        Ok(kernel::sum_ordered(&all))
    }

    /// My blocks' row ranges, local to my rows.
    fn local_blocks(&self) -> Vec<Range<usize>> {
        self.plan
            .blocks_of(self.me)
            .map(|b| {
                let r = self.plan.blocks.range(b);
                r.start - self.rows.start..r.end - self.rows.start
            })
            .collect()
    }

    fn restore(&mut self, todo: Todo) -> Result<(), Interrupt> {
        let own = self.own();
        match todo {
            Todo::Initial { lost } => {
                self.x.fill(0.0);
                self.r.copy_from_slice(&self.b);
                self.pwin[own].copy_from_slice(&self.b);
                self.k = 0;
                self.last_ckpt = 0;
                self.copies.clear();
                if lost {
                    let master = self.plan.master;
                    let w = Wire::Recovered {
                        g: self.g,
                        stamp: 0,
                    };
                    self.send(master, &w, Vec::new())?;
                }
                let parts: Vec<f64> = self
                    .local_blocks()
                    .into_iter()
                    .map(|l| kernel::dot(&self.b[l.clone()], &self.b[l]))
                    .collect();
                self.rho = self.reduce(Phase::Init, &parts)?;
                self.threshold = self.plan.rtol * self.rho.sqrt();
            }
            Todo::Copy(stamp) => {
                let bytes = self
                    .copies
                    .iter()
                    .find(|c| c.0 == stamp)
                    .map(|c| c.1.clone())
                    .ok_or_else(|| {
                        SpmdError::Protocol(format!("w{} has no copy of {stamp}", self.me))
                    })?;
                self.install(&bytes)?;
                self.copies.retain(|c| c.0 == stamp);
            }
            Todo::Rebuild { stamp, lost } => {
                let bytes = self.rebuild(stamp, &lost)?;
                self.install(&bytes)?;
                self.copies = vec![(stamp, bytes.clone())];
                let master = self.plan.master;
                self.send(master, &Wire::Recovered { g: self.g, stamp }, bytes)?;
            }
        }
        Ok(())
    }

    fn install(&mut self, bytes: &[u8]) -> Result<(), SpmdError> {
        let s = BlockState::from_bytes(bytes)
            .map_err(|e| SpmdError::Decode(format!("w{}: {e}", self.me)))?;
        if s.rows() != self.rows.len() {
            return Err(SpmdError::Decode(format!(
                "w{}: a state of {} rows for {}",
                self.me,
                s.rows(),
                self.rows.len()
            )));
        }
        let own = self.own();
        self.x = s.x;
        self.r = s.r;
        self.pwin[own].copy_from_slice(&s.p);
        self.rho = s.rho;
        self.k = s.iteration;
        self.last_ckpt = s.iteration;
        Ok(())
    }

    /// Rule 6: fetch the survivors' copies and the encoders' parts, decode mine.
    fn rebuild(&mut self, stamp: u64, lost: &[u32]) -> Result<Vec<u8>, Interrupt> {
        let (g, p, k) = (self.g, self.plan.workers, self.plan.encoders);
        let survivors: Vec<usize> = (0..p).filter(|w| !lost.contains(&(*w as u32))).collect();
        for &v in survivors.iter().chain(&(p..p + k).collect::<Vec<_>>()) {
            self.send(v, &Wire::Fetch { g, stamp }, Vec::new())?;
        }
        let mut pieces: Vec<Option<Vec<u8>>> = vec![None; p];
        let mut threshold = None;
        for &v in &survivors {
            let (w, bulk) = self.wait((Tag::Copy, g, stamp, v))?;
            if let Wire::Copy { threshold: t, .. } = w {
                threshold = Some(t);
            }
            pieces[v] = Some(bulk);
        }
        let mut parity: Vec<Option<Vec<u8>>> = vec![None; k];
        for (j, slot) in parity.iter_mut().enumerate() {
            let (w, bulk) = self.wait((Tag::Parity, g, stamp, p + j))?;
            if let Wire::Parity {
                held: true,
                threshold: t,
                ..
            } = w
            {
                threshold = Some(t);
                *slot = Some(bulk);
            }
        }
        self.threshold = threshold
            .ok_or_else(|| SpmdError::Decode(format!("no one holds checkpoint {stamp}")))?;
        let bytes = match (self.plan.encoding, &self.plan.code) {
            (Encoding::FloatSum, _) => {
                let sum = parity[0].as_ref().ok_or_else(|| {
                    SpmdError::Decode(format!("the checksum of checkpoint {stamp} is gone"))
                })?;
                let others: Vec<Vec<u8>> = pieces.iter().flatten().cloned().collect();
                if others.len() + 1 != p {
                    return Err(SpmdError::Decode(format!(
                        "float-sum rebuilds one worker, {} are lost",
                        p - others.len()
                    ))
                    .into());
                }
                coding::rebuild_float_sum(sum, &others, self.rows.len())?
            }
            (_, Some(code)) => {
                let lens: Vec<usize> = (0..p).map(|w| self.plan.piece_len(w)).collect();
                let mut all = coding::rebuild_exact(&**code, pieces, parity, &lens)?;
                all.swap_remove(self.me)
            }
            (e, None) => {
                return Err(SpmdError::Decode(format!("{e}: nothing to rebuild from")).into())
            }
        };
        Ok(bytes)
    }

    /// Rule 3: my part of checkpoint `self.k`.
    fn checkpoint(&mut self) -> Result<(), Interrupt> {
        let t0 = Instant::now();
        let own = self.own();
        let mut bytes = self.spare.pop().unwrap_or_default();
        state_bytes_into(
            &mut bytes,
            self.k,
            self.rho,
            &self.x,
            &self.r,
            &self.pwin[own],
        );
        let (g, stamp, threshold) = (self.g, self.k, self.threshold);
        let (p, k) = (self.plan.workers, self.plan.encoders);
        for j in 0..k {
            let w = Wire::Piece {
                g,
                stamp,
                threshold,
            };
            let mut b = Vec::with_capacity(bytes.len() + 96);
            b.extend_from_slice(&bytes);
            self.send(p + j, &w, b)?;
        }
        self.copies.push((stamp, bytes));
        self.last_ckpt = stamp;
        self.checkpoint_ns += ns(t0);
        Ok(())
    }

    /// Rules 1-4: iterate until CG's test passes or max_iter.
    fn iterate(&mut self) -> Result<(), Interrupt> {
        let blocks = self.local_blocks();
        let own = self.own();
        let mut parts = vec![0.0; blocks.len()];
        loop {
            if self.kills.contains(&self.k) {
                return Err(Interrupt::Killed(self.k));
            }
            if kernel::converged(self.rho, self.threshold) || self.k >= self.plan.max_iter {
                return Ok(());
            }
            if self.plan.every > 0
                && self.k > self.last_ckpt
                && self.k.is_multiple_of(self.plan.every)
            {
                self.checkpoint()?;
            }
            let (g, k) = (self.g, self.k);
            // Rule 2: halos out, halos in.
            for i in 0..self.receivers.len() {
                let (v, rows) = self.receivers[i].clone();
                let vals = wire::f64_bytes(&self.pwin[rows.start - self.lo..rows.end - self.lo]);
                let w = Wire::Halo {
                    g,
                    k,
                    start: rows.start as u64,
                };
                self.send(v, &w, vals)?;
            }
            for i in 0..self.senders.len() {
                let (v, rows) = self.senders[i].clone();
                let (w, bulk) = self.wait((Tag::Halo, g, k, v))?;
                let vals = wire::bytes_f64(&bulk)?;
                if !matches!(w, Wire::Halo { start, .. } if start as usize == rows.start)
                    || vals.len() != rows.len()
                {
                    return Err(SpmdError::Protocol(format!(
                        "w{v} sent a halo that is not rows {rows:?}"
                    ))
                    .into());
                }
                self.pwin[rows.start - self.lo..rows.end - self.lo].copy_from_slice(&vals);
            }
            for (s, l) in parts.iter_mut().zip(&blocks) {
                let global = self.rows.start + l.start..self.rows.start + l.end;
                *s = kernel::spmv_dot(
                    self.a.rows(global),
                    &self.pwin,
                    self.lo,
                    &mut self.q[l.clone()],
                );
            }
            let pq = self.reduce(Phase::Pq, &parts)?;
            let alpha = kernel::alpha(self.rho, pq, self.k).map_err(SpmdError::from)?;
            for (s, l) in parts.iter_mut().zip(&blocks) {
                let p = &self.pwin[own.start + l.start..own.start + l.end];
                *s = kernel::update(
                    &mut self.x[l.clone()],
                    &mut self.r[l.clone()],
                    p,
                    &self.q[l.clone()],
                    alpha,
                );
            }
            let rho_next = self.reduce(Phase::Rr, &parts)?;
            let beta = rho_next / self.rho;
            for l in &blocks {
                kernel::direction(
                    &mut self.pwin[own.start + l.start..own.start + l.end],
                    &self.r[l.clone()],
                    beta,
                );
            }
            self.rho = rho_next;
            self.k += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_bytes_are_the_kernel_layout() {
        let s = BlockState {
            iteration: 7,
            rho: 0.5,
            x: vec![1.0, 2.0],
            r: vec![-3.0, 0.25],
            p: vec![9.0, -0.0],
        };
        assert_eq!(state_bytes(7, 0.5, &s.x, &s.r, &s.p), s.to_bytes());
    }

    #[test]
    fn rows_and_rhs_rebuilt_alone_equal_the_whole_problems() {
        let src = Source::Poisson2d(7);
        let p = crate::problem::problem(&src, crate::problem::Rhs::Random(3)).unwrap();
        let rows = 10..30;
        let a = load_rows(&src, 49, rows.clone()).unwrap();
        assert_eq!(a, p.a.slice_rows(rows.clone()));
        let (lo, hi) = window(&a, rows.clone());
        assert_eq!((lo, hi), (3, 37));
        let l = exact_solution(crate::problem::Rhs::Random(3), lo..hi);
        let b = rhs_rows(&a, &l, lo);
        assert_eq!(b, p.b[rows].to_vec());
    }
}
