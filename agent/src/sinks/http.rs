//! The local endpoints: health, readiness and the debug views.
use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc, RwLock,
};

use axum::{
    extract::{Query, State as AxState},
    http::StatusCode,
    response::{IntoResponse, Json},
    routing::get,
    Router,
};
use serde::Deserialize;

use crate::{pipeline::Published, process::State, stats::Stats};

#[derive(Clone)]
pub struct AppState {
    pub state: Arc<RwLock<State>>,
    pub stats: Arc<Stats>,
    pub ready: Arc<AtomicBool>,
    pub snapshot: Published,
    /// Set when /metrics is served.
    pub prometheus: Option<Arc<otel::prometheus::PromOptions>>,
}

pub fn router(app: AppState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/debug/processes", get(processes))
        .route("/debug/stats", get(stats))
        .route("/debug/snapshot", get(snapshot))
        .route("/metrics", get(metrics))
        .with_state(app)
}

async fn readyz(AxState(app): AxState<AppState>) -> impl IntoResponse {
    if app.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
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
    Query(q): Query<ProcessesQuery>,
) -> impl IntoResponse {
    let views = app.state.read().unwrap().views(q.all);
    Json(views)
}

async fn stats(AxState(app): AxState<AppState>) -> impl IntoResponse {
    let nvml = app.snapshot.borrow().nvml.clone();
    Json(app.stats.report(&nvml))
}

async fn snapshot(AxState(app): AxState<AppState>) -> impl IntoResponse {
    let snap = app.snapshot.borrow().clone();
    // Serialised outside the lock; the snapshot itself is immutable.
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        serde_json::to_string(&*snap).unwrap_or_default(),
    )
}

async fn metrics(AxState(app): AxState<AppState>) -> axum::response::Response {
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
    let chunks = otel::prometheus::chunks(snap, stats, opts);
    let body = axum::body::Body::from_stream(futures_util::stream::iter(
        chunks.map(Ok::<_, std::convert::Infallible>),
    ));
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}
