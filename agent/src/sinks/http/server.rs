//! Connections: each address accepts at most `max_connections`, and at the cap a new one
//! closes the oldest connection that is not being answered (slow headers, an idle
//! keep-alive, a stalled TLS handshake), so a flood of idle connections cannot keep the
//! kubelet's probes out. Headers must arrive within the header-read timeout and fit in the
//! header limit; requests with a body are refused. All of it runs on one thread of its own.
use std::{
    collections::BTreeMap,
    convert::Infallible,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use axum::{
    body::Body,
    http::{header, HeaderValue, Request, StatusCode},
    response::{IntoResponse, Response},
    Router,
};
use bytes::Bytes;
use http_body::Frame;
use hyper::{body::Incoming, server::conn::http1};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Descriptors kept for everything else the agent opens (eBPF objects, /proc, sockets).
const RESERVED_FDS: u64 = 256;
/// How often a full connection table is logged.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// What an address serves, for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exposure {
    /// Every endpoint (`http.addr`).
    All,
    /// /metrics, /healthz and /readyz (`http.metrics_addr`).
    Metrics,
}

#[derive(Clone, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub max_header_bytes: usize,
}

/// One bound address and what it serves.
pub struct Listener {
    pub socket: std::net::TcpListener,
    pub exposure: Exposure,
    pub router: Router,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub limits: Limits,
}

/// Raises the soft descriptor limit to the hard one, and returns how many connections each
/// of `listeners` addresses may hold: `configured`, or less where the limit is lower.
pub fn connection_budget(configured: u32, listeners: usize) -> (usize, u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit on a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    let spare = lim.rlim_cur.saturating_sub(RESERVED_FDS) / listeners.max(1) as u64;
    ((configured as u64).min(spare).max(1) as usize, lim.rlim_cur)
}

/// Serves every listener on a thread named "http" with its own runtime, until `stop`.
pub fn spawn(
    listeners: Vec<Listener>,
    stop: CancellationToken,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .thread_name("http-blocking")
                // The blocking threads serialise the expensive answers: they yield the CPU
                // to the event loop, so /healthz is answered first.
                .on_thread_start(lower_priority)
                .max_blocking_threads(16)
                .thread_keep_alive(Duration::from_secs(10))
                .build();
            let rt = match rt {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!("http: starting the runtime: {e}");
                    return;
                }
            };
            rt.block_on(async move {
                tokio::spawn(trim_after_bursts(stop.clone()));
                let loops: Vec<_> = listeners
                    .into_iter()
                    .map(|l| tokio::spawn(accept_loop(l, stop.clone())))
                    .collect();
                for l in loops {
                    let _ = l.await;
                }
            });
            rt.shutdown_timeout(Duration::from_secs(1));
        })
}

/// Connections admitted so far, on every address.
static ADMITTED: AtomicU64 = AtomicU64::new(0);

/// Every 10 s after connections came and went: what their buffers used goes back to the
/// system (glibc keeps freed memory otherwise, and RSS stays at a flood's peak).
async fn trim_after_bursts(stop: CancellationToken) {
    let mut seen = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = ADMITTED.load(Ordering::Relaxed);
        if now != seen {
            seen = now;
            super::body::trim_heap();
        }
    }
}

/// nice +10 for the calling thread (Linux: setpriority on a thread id is per thread).
fn lower_priority() {
    // SAFETY: gettid and setpriority on this thread only.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
}

async fn accept_loop(l: Listener, stop: CancellationToken) {
    let addr = l.socket.local_addr().ok();
    let listener = match TcpListener::from_std(l.socket) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(?addr, "http: {e}");
            stop.cancel();
            return;
        }
    };
    let conns = Arc::new(Connections::new(l.limits.max_connections, addr, l.exposure));
    let http = builder(&l.limits);
    let tls = l.tls.map(tokio_rustls::TlsAcceptor::from);
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => break,
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    on_accept_error(&e, &conns).await;
                    continue;
                }
            },
        };
        // All busy being answered: closed at once rather than queued without bound.
        let Some(conn) = conns.admit() else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (http, tls, router) = (http.clone(), tls.clone(), l.router.clone());
        let timeout = l.limits.header_read_timeout;
        let stop = stop.clone();
        tokio::spawn(async move {
            let evicted = conn.evict.clone();
            let work = serve(stream, &conn, http, tls, router, timeout, stop);
            tokio::select! {
                _ = work => {}
                _ = evicted.cancelled() => {}
            }
        });
        // Let the new connection read its request before the next accept: a probe that
        // arrives in a flood is then being answered, not the oldest idle connection that
        // the flood closes to make room.
        tokio::task::yield_now().await;
    }
    // Stopped: each connection finishes its answer (graceful shutdown), briefly.
    let deadline = Instant::now() + Duration::from_secs(2);
    while conns.len() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn builder(limits: &Limits) -> http1::Builder {
    let mut b = http1::Builder::new();
    b.timer(TokioTimer::new())
        // Also starts over while an idle keep-alive connection waits for its next request:
        // it is the idle timeout too.
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes)
        .max_headers(64)
        .keep_alive(true);
    b
}

/// Out of descriptors or memory: close the oldest idle connection to make room, and try
/// again shortly (the pending connection waits in the backlog). Other errors concern only
/// the connection that failed.
async fn on_accept_error(e: &std::io::Error, conns: &Connections) {
    if matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    ) {
        conns.evict_oldest_idle();
        conns.warn(&format!("accept failed ({e})"));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn serve(
    stream: TcpStream,
    conn: &Admitted,
    http: http1::Builder,
    tls: Option<tokio_rustls::TlsAcceptor>,
    router: Router,
    handshake_timeout: Duration,
    stop: CancellationToken,
) {
    let busy = conn.busy.clone();
    match tls {
        None => drive(&http, TokioIo::new(stream), busy, router, &stop).await,
        Some(acceptor) => {
            let handshake = tokio::time::timeout(handshake_timeout, acceptor.accept(stream));
            if let Ok(Ok(s)) = handshake.await {
                drive(&http, TokioIo::new(s), busy, router, &stop).await;
            }
        }
    }
}

async fn drive<I>(
    http: &http1::Builder,
    io: I,
    busy: Arc<AtomicUsize>,
    router: Router,
    stop: &CancellationToken,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let router = router.clone();
        let guard = Busy::new(&busy);
        async move {
            let response = if carries_body(&req) {
                too_large()
            } else {
                let req = req.map(Body::new);
                router.oneshot(req).await.unwrap_or_else(|e| match e {})
            };
            let tracked = response.map(|inner| {
                Body::new(Tracked {
                    inner,
                    _busy: guard,
                })
            });
            Ok::<_, Infallible>(tracked)
        }
    });
    let c = http.serve_connection(io, svc);
    tokio::pin!(c);
    tokio::select! {
        _ = c.as_mut() => {}
        _ = stop.cancelled() => {
            c.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(1), c).await;
        }
    }
}

/// Every endpoint is a GET: a request body is refused before it is read.
fn carries_body(req: &Request<Incoming>) -> bool {
    let h = req.headers();
    let length = h
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    h.contains_key(header::TRANSFER_ENCODING) || length.is_some_and(|n| n > 0)
}

fn too_large() -> Response {
    let mut r = (
        StatusCode::PAYLOAD_TOO_LARGE,
        "these endpoints take no request body\n",
    )
        .into_response();
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// The connections of one address, oldest first.
struct Connections {
    max: usize,
    addr: Option<std::net::SocketAddr>,
    exposure: Exposure,
    inner: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    open: BTreeMap<u64, Entry>,
    last_warn: Option<Instant>,
    closed_since_warn: u64,
}

struct Entry {
    busy: Arc<AtomicUsize>,
    evict: CancellationToken,
}

/// An admitted connection; leaves the table when dropped.
struct Admitted {
    id: u64,
    busy: Arc<AtomicUsize>,
    evict: CancellationToken,
    conns: Arc<Connections>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.conns.inner.lock().unwrap().open.remove(&self.id);
    }
}

impl Connections {
    fn new(max: usize, addr: Option<std::net::SocketAddr>, exposure: Exposure) -> Connections {
        Connections {
            max,
            addr,
            exposure,
            inner: Mutex::default(),
        }
    }

    fn len(&self) -> usize {
        self.inner.lock().unwrap().open.len()
    }

    /// A place for a new connection: at the cap, the oldest idle one is closed for it.
    /// None when every connection is being answered.
    fn admit(self: &Arc<Self>) -> Option<Admitted> {
        let mut t = self.inner.lock().unwrap();
        if t.open.len() >= self.max {
            if !Self::evict_in(&mut t) {
                drop(t);
                self.warn("every connection is being answered: new one refused");
                return None;
            }
            drop(t);
            self.warn("closed the oldest idle connection for a new one");
            t = self.inner.lock().unwrap();
        }
        let id = t.next_id;
        t.next_id += 1;
        ADMITTED.fetch_add(1, Ordering::Relaxed);
        let entry = Entry {
            busy: Arc::new(AtomicUsize::new(0)),
            evict: CancellationToken::new(),
        };
        let admitted = Admitted {
            id,
            busy: entry.busy.clone(),
            evict: entry.evict.clone(),
            conns: self.clone(),
        };
        t.open.insert(id, entry);
        Some(admitted)
    }

    fn evict_oldest_idle(&self) {
        Self::evict_in(&mut self.inner.lock().unwrap());
    }

    fn evict_in(t: &mut Table) -> bool {
        let idle = t
            .open
            .iter()
            .find(|(_, e)| e.busy.load(Ordering::Acquire) == 0)
            .map(|(id, _)| *id);
        let Some(entry) = idle.and_then(|id| t.open.remove(&id)) else {
            return false;
        };
        entry.evict.cancel();
        t.closed_since_warn += 1;
        true
    }

    /// Logged once a minute at most, with how many connections were closed meanwhile.
    fn warn(&self, what: &str) {
        let mut t = self.inner.lock().unwrap();
        if t.last_warn.is_some_and(|at| at.elapsed() < WARN_EVERY) {
            return;
        }
        let closed = std::mem::take(&mut t.closed_since_warn);
        t.last_warn = Some(Instant::now());
        drop(t);
        tracing::warn!(
            addr = ?self.addr,
            serves = ?self.exposure,
            max_connections = self.max,
            closed,
            "http: connection limit reached: {what} (http.max_connections)"
        );
    }
}

/// Requests being answered on a connection: a connection with none is idle.
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn new(count: &Arc<AtomicUsize>) -> Busy {
        count.fetch_add(1, Ordering::AcqRel);
        Busy(count.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that counts as "being answered" until its last byte is written.
struct Tracked {
    inner: Body,
    _busy: Busy,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_oldest_idle_connection_makes_room() {
        let conns = Arc::new(Connections::new(2, None, Exposure::Metrics));
        let a = conns.admit().unwrap();
        let b = conns.admit().unwrap();
        let _busy = Busy::new(&a.busy);
        // a is being answered: b, the oldest idle one, is closed for c.
        let c = conns.admit().unwrap();
        assert!(b.evict.is_cancelled() && !a.evict.is_cancelled());
        drop(b);
        assert_eq!(conns.len(), 2);
        let _busy_c = Busy::new(&c.busy);
        // Both busy: refused.
        assert!(conns.admit().is_none());
        drop(c);
        assert!(conns.admit().is_some());
    }

    #[test]
    fn the_budget_follows_the_descriptor_limit() {
        let (per, limit) = connection_budget(256, 2);
        assert!(limit >= 1024, "{limit}");
        assert_eq!(
            per as u64,
            256.min(limit.saturating_sub(RESERVED_FDS) / 2).max(1)
        );
    }
}
