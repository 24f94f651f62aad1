//! The coordinator's tokio driver: connections in, frames out, store calls on a blocking
//! thread, and timers, around the [`Coordinator`] state machine (rule 1 of `coordinator`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::task::AbortHandle;
use veriflow_checkpoint::wire::{Connection, DEFAULT_MAX_FRAME};
use veriflow_checkpoint::{Key, Store};
use veriflow_runtime::detect::FdParams;
use veriflow_runtime::log::{terminal_outputs, LogReader, Manifest, RunStatus};
use veriflow_runtime::{Clock, SystemClock};

use super::{Action, ClientId, Config, Coordinator, Event, Joining};
use crate::error::ClusterError;
use crate::protocol::{Hello, ToCoord, ToSubmit, ToWorker, WorkerId};

/// How a coordinator process runs.
#[derive(Clone)]
pub struct CoordinatorConfig {
    /// The program (app) this cluster runs.
    pub program: String,
    /// The cluster's key.
    pub key: Key,
    /// The store every member logs into, as a spec.
    pub store_spec: String,
    /// The same store, opened here.
    pub store: Arc<dyn Store>,
    /// The failure detector's parameters (paper 004 §4), sent to every worker too.
    pub fd: FdParams,
}

impl std::fmt::Debug for CoordinatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatorConfig")
            .field("program", &self.program)
            .field("store", &self.store_spec)
            .finish_non_exhaustive()
    }
}

/// Most connections open at once: a cluster of a few hundred workers and clients fits, a
/// flood of key holders does not exhaust the process (rule 7).
const MAX_CONNECTIONS: usize = 4096;

/// Largest frame a worker or client may send the coordinator: reports carry the terminal
/// outputs and an iterative run's final states, so this stays the wire's default.
const MAX_FRAME: usize = DEFAULT_MAX_FRAME;

enum Input {
    Event(Event),
    WorkerConn {
        id: WorkerId,
        tx: UnboundedSender<ToWorker>,
        reader: AbortHandle,
    },
    ClientConn {
        id: ClientId,
        tx: UnboundedSender<ToSubmit>,
    },
}

/// Serves forever on `listener`.
pub async fn serve(listener: TcpListener, cfg: CoordinatorConfig) -> Result<(), ClusterError> {
    let mut secret = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut secret);
    let core = Coordinator::new(Config::new(&cfg.program, &cfg.store_spec, cfg.fd, secret));
    let (tx, rx) = unbounded_channel();
    tokio::spawn(actor(core, rx, tx.clone(), cfg.store.clone()));
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut next_id: u32 = 1;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of descriptors, most often: back off instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if open.load(std::sync::atomic::Ordering::SeqCst) >= MAX_CONNECTIONS {
            eprintln!("coordinator: refused a connection from {peer}: {MAX_CONNECTIONS} open");
            continue;
        }
        let _ = stream.set_nodelay(true);
        let id = next_id;
        next_id = next_id.checked_add(1).unwrap_or(1);
        let (tx, key, open) = (tx.clone(), cfg.key.clone(), open.clone());
        open.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::spawn(async move {
            connection(stream, peer.to_string(), id, key, tx).await;
            open.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        });
    }
}

async fn connection(
    stream: TcpStream,
    peer: String,
    id: WorkerId,
    key: Key,
    events: UnboundedSender<Input>,
) {
    let conn = match Connection::server(stream, &key, MAX_FRAME).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("refused a connection from {peer}: {e}");
            eprintln!("coordinator: refused a connection from {peer}: {e}");
            return;
        }
    };
    let (mut reader, mut writer) = conn.into_split();
    let hello: Hello = match reader.recv().await {
        Ok(h) => h,
        Err(e) => {
            eprintln!("coordinator: dropped {peer}: {e}");
            return;
        }
    };
    match hello {
        Hello::Worker {
            program,
            peer_addr,
            threads,
            spare,
        } => {
            let (tx, mut rx) = unbounded_channel::<ToWorker>();
            let events2 = events.clone();
            let reading = tokio::spawn(async move {
                let reason = loop {
                    match reader.recv::<ToCoord>().await {
                        Ok(msg) => {
                            if events2
                                .send(Input::Event(Event::FromWorker { worker: id, msg }))
                                .is_err()
                            {
                                return;
                            }
                        }
                        Err(e) => break e.to_string(),
                    }
                };
                let _ = events2.send(Input::Event(Event::Closed { worker: id, reason }));
            });
            let _ = events.send(Input::WorkerConn {
                id,
                tx,
                reader: reading.abort_handle(),
            });
            let _ = events.send(Input::Event(Event::Joined {
                worker: id,
                hello: Joining {
                    program,
                    peer_addr,
                    threads,
                    spare,
                },
            }));
            // Writes until the coordinator drops this worker (then the channel closes).
            while let Some(m) = rx.recv().await {
                if writer.send(&m).await.is_err() {
                    break;
                }
            }
        }
        Hello::Submit { program, job } => {
            let client = ClientId::from(id);
            let (tx, mut rx) = unbounded_channel::<ToSubmit>();
            let _ = events.send(Input::ClientConn { id: client, tx });
            let _ = events.send(Input::Event(Event::Submit {
                client,
                program,
                job,
            }));
            while let Some(m) = rx.recv().await {
                let last = matches!(m, ToSubmit::Finished { .. } | ToSubmit::Failed { .. });
                if writer.send(&m).await.is_err() || last {
                    break;
                }
            }
        }
    }
}

/// Owns the state machine: feeds it events and timer ticks, carries out its actions.
async fn actor(
    mut core: Coordinator,
    mut rx: UnboundedReceiver<Input>,
    me: UnboundedSender<Input>,
    store: Arc<dyn Store>,
) {
    let clock = SystemClock::default();
    let mut workers: HashMap<WorkerId, (UnboundedSender<ToWorker>, AbortHandle)> = HashMap::new();
    let mut clients: HashMap<ClientId, UnboundedSender<ToSubmit>> = HashMap::new();
    loop {
        let wait = core.next_deadline().saturating_sub(clock.now());
        let event = match tokio::time::timeout(wait.max(Duration::from_millis(1)), rx.recv()).await
        {
            Ok(None) => return,
            Ok(Some(Input::WorkerConn { id, tx, reader })) => {
                workers.insert(id, (tx, reader));
                continue;
            }
            Ok(Some(Input::ClientConn { id, tx })) => {
                clients.insert(id, tx);
                continue;
            }
            Ok(Some(Input::Event(ev))) => ev,
            Err(_) => Event::Tick,
        };
        for action in core.on_event(clock.now(), event) {
            match action {
                Action::ToWorker { worker, msg } => {
                    if let Some((tx, _)) = workers.get(&worker) {
                        let _ = tx.send(msg);
                    }
                }
                Action::Disconnect { worker } => {
                    // The writer flushes what was queued (a refusal), then the channel ends.
                    if let Some((_, reader)) = workers.remove(&worker) {
                        reader.abort();
                    }
                }
                Action::ToClient { client, msg } => {
                    let last = matches!(msg, ToSubmit::Finished { .. } | ToSubmit::Failed { .. });
                    if let Some(tx) = clients.get(&client) {
                        let _ = tx.send(msg);
                    }
                    if last {
                        clients.remove(&client);
                    }
                }
                Action::CheckStore { job } => {
                    let (store, me) = (store.clone(), me.clone());
                    tokio::task::spawn_blocking(move || {
                        let result = Manifest::load(&*store)
                            .map(|m| m.is_some())
                            .map_err(|e| e.to_string());
                        let _ = me.send(Input::Event(Event::StoreChecked { job, result }));
                    });
                }
                Action::ReadOutputs { job } => {
                    let (store, me) = (store.clone(), me.clone());
                    tokio::task::spawn_blocking(move || {
                        let result = read_outputs(store);
                        let _ = me.send(Input::Event(Event::OutputsRead { job, result }));
                    });
                }
                Action::RecordFinished { job } => {
                    let (store, me) = (store.clone(), me.clone());
                    tokio::task::spawn_blocking(move || {
                        let result = record_finished(&*store);
                        let _ = me.send(Input::Event(Event::Recorded { job, result }));
                    });
                }
                Action::Note(line) => eprintln!("coordinator: {line}"),
            }
        }
    }
}

/// The terminal outputs from the logs (rule 6).
pub(crate) fn read_outputs(store: Arc<dyn Store>) -> Result<Option<Vec<Vec<u8>>>, String> {
    LogReader::latest(store)
        .and_then(|r| terminal_outputs(&r))
        .map_err(|e| e.to_string())
}

/// Records the run as finished in the manifest (rule 6) and returns its root; a run without a
/// log (`--no-checkpoint`) has no manifest and no root. A store that cannot record it fails the
/// job: a log left `Running` would refuse `certify` later.
pub(crate) fn record_finished(store: &dyn Store) -> Result<String, String> {
    match Manifest::load(store) {
        Ok(Some(mut m)) => {
            m.status = RunStatus::Finished;
            m.store(store)
                .map(|()| format!("{:#}", m.root))
                .map_err(|e| format!("the job finished but the store did not record it: {e}"))
        }
        Ok(None) => Ok(String::new()),
        Err(e) => Err(format!(
            "the job finished but its manifest cannot be read: {e}"
        )),
    }
}
