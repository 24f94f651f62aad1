//! The coordinator's web dashboard (`APP coordinator --dashboard ADDR`): an axum server with
//! the page, its vendored chart library (uPlot, `assets/uplot/`), the state as JSON
//! (`/state`), live updates as server-sent events (`/events`) and Prometheus `/metrics`.
//!
//! Rules (besides `observe` rules 1-4):
//! 1. One sampler asks the driver for an observation every `SAMPLE_EVERY`, folds it into
//!    the [`History`], and sends every page the same update; a page that connects first gets
//!    the whole state, then the updates (numbered: it drops one it already has).
//! 2. Read-only: every route is a GET; nothing a request carries reaches the coordinator.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::stream::{self, Stream};
use serde_json::{json, Value};
use tokio::sync::broadcast;

use super::history::{History, Sample, TimelineEvent};
use super::metrics::{self, Scrape};
use super::{Observation, SAMPLE_EVERY};
use crate::coordinator::driver::Observer;

/// Why a dashboard cannot be served.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)] // fields are named for what they carry
pub enum DashboardError {
    /// The address does not parse or resolve.
    #[error("dashboard address {addr}: {reason}")]
    Address { addr: String, reason: String },
    /// A non-loopback address without the flag that allows it (`observe` rule 4).
    #[error(
        "dashboard address {addr} is not a loopback address: the dashboard shows the whole \
         cluster to anyone with its token; pass --dashboard-public to serve it there anyway"
    )]
    NotLoopback { addr: String },
    /// The address cannot be bound.
    #[error("cannot serve the dashboard on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// A bound dashboard listener and its access token, ready to be served by a coordinator
/// (`coordinator::serve_observed`).
pub struct Dashboard {
    listener: std::net::TcpListener,
    addr: SocketAddr,
    token: String,
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret: never in a log line.
        f.debug_struct("Dashboard")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Dashboard {
    /// Binds `addr` (a loopback address unless `public`) and draws a fresh token.
    pub fn bind(addr: &str, public: bool) -> Result<Dashboard, DashboardError> {
        use std::net::ToSocketAddrs as _;
        let resolved: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| DashboardError::Address {
                addr: addr.to_string(),
                reason: e.to_string(),
            })?
            .collect();
        let Some(&first) = resolved.first() else {
            return Err(DashboardError::Address {
                addr: addr.to_string(),
                reason: "it names no address".to_string(),
            });
        };
        if !public && !resolved.iter().all(|a| a.ip().is_loopback()) {
            return Err(DashboardError::NotLoopback {
                addr: addr.to_string(),
            });
        }
        let bind = |e| DashboardError::Bind {
            addr: addr.to_string(),
            source: e,
        };
        let listener = std::net::TcpListener::bind(first).map_err(bind)?;
        listener.set_nonblocking(true).map_err(bind)?;
        let addr = listener.local_addr().map_err(bind)?;
        let token =
            veriflow_checkpoint::hex::encode(&veriflow_checkpoint::key::random_bytes::<16>());
        Ok(Dashboard {
            listener,
            addr,
            token,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The token every request must carry (`observe` rule 4).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The page's address, token included.
    pub fn url(&self) -> String {
        format!("http://{}/?token={}", self.addr, self.token)
    }

    /// Serves until the process ends (rule 1); `observer` asks the coordinator's driver.
    pub(crate) async fn run(self, observer: Observer) {
        let (updates, _) = broadcast::channel(64);
        let shared = Arc::new(Shared {
            token: blake3::hash(self.token.as_bytes()),
            history: Mutex::new((History::default(), Observation::default())),
            updates,
        });
        tokio::spawn(sample(shared.clone(), observer));
        let app = Router::new()
            .route("/", get(page))
            .route("/assets/uPlot.iife.min.js", get(uplot_js))
            .route("/assets/uPlot.min.css", get(uplot_css))
            .route("/assets/dashboard.js", get(dashboard_js))
            .route("/state", get(state))
            .route("/events", get(events))
            .route("/metrics", get(prometheus))
            .layer(middleware::from_fn_with_state(shared.clone(), authorize))
            .with_state(shared);
        let listener = match tokio::net::TcpListener::from_std(self.listener) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("coordinator: the dashboard cannot serve: {e}");
                return;
            }
        };
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("coordinator: the dashboard stopped: {e}");
        }
    }
}

struct Shared {
    token: blake3::Hash,
    /// The history and the last observation.
    history: Mutex<(History, Observation)>,
    updates: broadcast::Sender<Arc<str>>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, (History, Observation)> {
        self.history.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The whole state, as a page's first message and `/state`.
    fn full(&self) -> Value {
        let g = self.lock();
        let (h, obs) = &*g;
        message(
            true,
            obs,
            h,
            &h.samples.iter().cloned().collect::<Vec<_>>(),
            &h.events.iter().cloned().collect::<Vec<_>>(),
        )
    }

    fn scrape(&self) -> Scrape {
        let g = self.lock();
        let (h, obs) = &*g;
        let count = |f: fn(&crate::protocol::JobStatus) -> bool| {
            i64::try_from(obs.status.jobs.iter().filter(|j| f(j)).count()).unwrap_or(i64::MAX)
        };
        Scrape {
            counters: h.counters.clone(),
            workers: obs.workers.clone(),
            workers_alive: i64::try_from(obs.status.workers.len()).unwrap_or(i64::MAX),
            vnodes: i64::try_from(obs.status.jobs.iter().map(|j| j.map.len()).sum::<usize>())
                .unwrap_or(i64::MAX),
            coordinator: obs.status.counters.clone(),
            jobs_running: count(|j| !j.ended() && j.state != "queued"),
            jobs_queued: count(|j| j.state == "queued"),
            tasks_per_s: h.samples.back().map_or(0.0, |s| s.tasks_per_s),
        }
    }
}

/// One message to the page: the state now, and the samples and events it adds.
fn message(
    full: bool,
    obs: &Observation,
    h: &History,
    samples: &[Sample],
    events: &[TimelineEvent],
) -> Value {
    let workers: BTreeMap<String, Value> = obs
        .workers
        .iter()
        .map(|(id, w)| {
            (
                id.to_string(),
                json!({
                    "steals": w.runtime.steals,
                    "log_bytes": w.runtime.log_bytes,
                    "commits": w.runtime.commits,
                }),
            )
        })
        .collect();
    json!({
        "full": full,
        "status": obs.status,
        "counters": h.counters,
        "samples": samples,
        "events": events,
        "worker_counters": workers,
        // The online oracle's last verdict, null without one.
        "certification": obs.oracle.certified.as_ref().map(|(job, decision)| {
            json!({ "job": job, "decision": decision })
        }),
    })
}

/// Rule 1: the sampler.
async fn sample(shared: Arc<Shared>, observer: Observer) {
    let start = Instant::now();
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let obs = observer.observe().await;
        let t = start.elapsed().as_secs_f64();
        let text: Arc<str> = {
            let mut g = shared.lock();
            let (h, last) = &mut *g;
            let (sample, events) = h.fold(t, &obs);
            *last = obs;
            message(false, last, h, &[sample], &events)
                .to_string()
                .into()
        };
        // No page open is not an error.
        let _ = shared.updates.send(text);
    }
}

/// `observe` rule 4: the token, as `?token=` or `Authorization: Bearer`, on every request.
async fn authorize(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let from_query = req.uri().query().and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("token="))
            .map(str::to_string)
    });
    let from_header = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    let ok = from_query
        .or(from_header)
        .is_some_and(|t| blake3::hash(t.as_bytes()) == shared.token);
    if !ok {
        return (
            StatusCode::UNAUTHORIZED,
            "401: this dashboard needs the token the coordinator printed at start \
             (?token=... or Authorization: Bearer ...)\n",
        )
            .into_response();
    }
    next.run(req).await
}

fn with_type(body: impl Into<Body>, content_type: &'static str) -> Response {
    let mut r = Response::new(body.into());
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

async fn page(req: Request) -> Response {
    // The token is hex (checked by `authorize`): safe inside the page's URLs as it is.
    let token = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("token=")))
        .unwrap_or("");
    let html = include_str!("assets/index.html").replace("{{TOKEN}}", token);
    with_type(html, "text/html; charset=utf-8")
}

async fn uplot_js() -> Response {
    with_type(
        include_str!("assets/uplot/uPlot.iife.min.js"),
        "text/javascript; charset=utf-8",
    )
}

async fn uplot_css() -> Response {
    with_type(
        include_str!("assets/uplot/uPlot.min.css"),
        "text/css; charset=utf-8",
    )
}

async fn dashboard_js() -> Response {
    with_type(
        include_str!("assets/dashboard.js"),
        "text/javascript; charset=utf-8",
    )
}

async fn state(State(shared): State<Arc<Shared>>) -> Response {
    with_type(shared.full().to_string(), "application/json")
}

async fn prometheus(State(shared): State<Arc<Shared>>) -> Response {
    match metrics::encode(shared.scrape()) {
        Ok(text) => with_type(
            text,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n").into_response(),
    }
}

/// Rule 1: the whole state first, then every update; a page that fell behind gets the whole
/// state again.
async fn events(
    State(shared): State<Arc<Shared>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let rx = shared.updates.subscribe();
    let first = shared.full().to_string();
    let s = stream::unfold(
        (Some(first), rx, shared),
        |(first, mut rx, shared)| async move {
            if let Some(f) = first {
                return Some((Ok(Event::default().data(f)), (None, rx, shared)));
            }
            let data = match rx.recv().await {
                Ok(text) => text.to_string(),
                Err(broadcast::error::RecvError::Lagged(_)) => shared.full().to_string(),
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            Some((Ok(Event::default().data(data)), (None, rx, shared)))
        },
    );
    Sse::new(s).keep_alive(KeepAlive::default())
}
