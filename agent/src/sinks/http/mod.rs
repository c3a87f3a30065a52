//! The HTTP endpoints. Two addresses: `http.addr` (loopback) serves every endpoint;
//! `http.metrics_addr` serves /metrics, /healthz and /readyz only, optionally over TLS and
//! with credentials for /metrics. Both run on a thread of their own (server.rs), so a
//! flood of requests never delays the pipeline, and the health endpoints never wait behind
//! the expensive ones (body.rs).
mod auth;
mod body;
mod server;

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, RwLock,
    },
    time::{Duration, Instant},
};

use axum::{
    extract::{Extension, Query, Request, State as AxState},
    http::StatusCode,
    middleware::{self, Next},
    response::{IntoResponse, Json, Response},
    routing::get,
    Router,
};
use serde::{Deserialize, Serialize};

use self::body::Turn;
pub use self::{
    auth::Auth,
    body::Gate,
    server::{connection_budget, spawn, Exposure, Limits, Listener},
};
use crate::{pipeline::Published, process::State, stats::Stats};

/// Longer than this without the agent's main loop running and /healthz fails, so that the
/// liveness probe restarts an agent whose event loop is stuck (the HTTP thread would
/// otherwise answer for it).
const STALE: Duration = Duration::from_secs(30);

#[derive(Clone)]
pub struct AppState {
    pub state: Arc<RwLock<State>>,
    pub stats: Arc<Stats>,
    pub ready: Arc<AtomicBool>,
    pub snapshot: Published,
    /// Set when /metrics is served.
    pub prometheus: Option<Arc<otel::prometheus::PromOptions>>,
    pub heartbeat: Arc<Heartbeat>,
}

/// When the agent's main loop last ran.
pub struct Heartbeat {
    base: Instant,
    last_ms: AtomicU64,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Heartbeat {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }
}

impl Heartbeat {
    pub fn beat(&self) {
        let ms = self.base.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn age(&self) -> Duration {
        let now = self.base.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// Every endpoint, for `http.addr`.
pub fn full_router(app: AppState, gate: Gate) -> Router {
    let expensive = Router::new()
        .route("/debug/processes", get(processes))
        .route("/debug/snapshot", get(snapshot))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(gate, expensive));
    health()
        .route("/debug/stats", get(stats))
        .merge(expensive)
        .with_state(app)
}

/// /metrics (behind `auth` when set), /healthz and /readyz, for `http.metrics_addr`.
pub fn metrics_router(app: AppState, gate: Gate, auth: Option<Arc<Auth>>) -> Router {
    let mut metrics = Router::new()
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(gate, expensive));
    if let Some(auth) = auth {
        // Outermost: a request without credentials never takes a turn at the gate.
        metrics = metrics.route_layer(middleware::from_fn_with_state(auth, auth::require));
    }
    health()
        .merge(metrics)
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "only /metrics, /healthz and /readyz are served on this address; /debug/* is \
                 on http.addr (loopback)\n",
            )
        })
        .with_state(app)
}

/// /healthz and /readyz: answered at once, never behind the gate.
fn health() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

/// A turn at the gate, then the handler, all within the gate's timeout; the answer's body
/// keeps the turn until it is written.
async fn expensive(AxState(gate): AxState<Gate>, mut req: Request, next: Next) -> Response {
    let deadline = tokio::time::Instant::now() + gate.timeout;
    let Some(turn) = gate.enter(deadline).await else {
        return gate.busy();
    };
    // For the handler's blocking work, which keeps the turn too.
    req.extensions_mut().insert(turn.clone());
    match tokio::time::timeout_at(deadline, next.run(req)).await {
        Ok(response) => body::guarded(response, turn),
        Err(_) => gate.busy(),
    }
}

async fn healthz(AxState(app): AxState<AppState>) -> Response {
    let age = app.heartbeat.age();
    if age > STALE {
        let msg = format!("the agent's main loop has not run for {}s\n", age.as_secs());
        return (StatusCode::SERVICE_UNAVAILABLE, msg).into_response();
    }
    "ok\n".into_response()
}

async fn readyz(AxState(app): AxState<AppState>) -> Response {
    if app.heartbeat.age() > STALE {
        return (StatusCode::SERVICE_UNAVAILABLE, "stalled\n").into_response();
    }
    if app.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response()
    }
}

#[derive(Deserialize)]
struct ProcessesQuery {
    /// Include exited processes still kept as tombstones.
    #[serde(default)]
    all: bool,
}

async fn processes(
    AxState(app): AxState<AppState>,
    Extension(turn): Extension<Turn>,
    Query(q): Query<ProcessesQuery>,
) -> Response {
    body::json_stream(turn, move || app.state.read().unwrap().views(q.all))
}

#[derive(Deserialize)]
struct StatsQuery {
    /// Also read the allocator's live heap (`heap_bytes`): it walks the allocator's free
    /// lists under their locks, so only a caller that wants it pays for it.
    #[serde(default)]
    heap: bool,
}

async fn stats(AxState(app): AxState<AppState>, Query(q): Query<StatsQuery>) -> impl IntoResponse {
    let nvml = app.snapshot.borrow().nvml.clone();
    let mut stats = app.stats.report(&nvml);
    if q.heap {
        stats.heap_bytes = crate::stats::heap_bytes();
    }
    Json(stats)
}

/// An `Arc`'d value serialised as the value itself.
struct Shared<T>(Arc<T>);

impl<T: Serialize> Serialize for Shared<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

async fn snapshot(AxState(app): AxState<AppState>, Extension(turn): Extension<Turn>) -> Response {
    // The snapshot is immutable: serialised outside any lock.
    let snap = app.snapshot.borrow().clone();
    body::json_stream(turn, move || Shared(snap))
}

async fn metrics(AxState(app): AxState<AppState>, Extension(turn): Extension<Turn>) -> Response {
    let Some(opts) = app.prometheus.clone() else {
        return (
            StatusCode::NOT_FOUND,
            "/metrics is off: start with --prometheus\n",
        )
            .into_response();
    };
    let snap = app.snapshot.borrow().clone();
    let stats = app.stats.report(&snap.nvml);
    // Streamed: made a family at a time as the client reads.
    body::text_stream(
        turn,
        "text/plain; version=0.0.4; charset=utf-8",
        move || otel::prometheus::chunks(snap, stats, opts),
    )
}
