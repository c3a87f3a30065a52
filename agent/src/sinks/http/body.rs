//! What keeps an expensive answer's memory bounded: a few at a time per address (the
//! gate), each with a deadline, JSON written in chunks as the client reads them rather than
//! built whole, and the heap trimmed once the last one is done.
use std::{
    convert::Infallible,
    future::Future,
    io::Write,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    body::Body,
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use http_body::Frame;
use serde::Serialize;
use tokio::{
    sync::{mpsc, OwnedSemaphorePermit, Semaphore},
    time::{Instant, Sleep},
};

/// Bytes of JSON per chunk: big enough to keep syscalls few, small enough not to matter.
const CHUNK: usize = 32 << 10;

/// Expensive requests (/metrics, /debug/*) on one address: `permits` at a time, each done
/// within `timeout` of its headers, waiting for a turn included.
#[derive(Clone)]
pub struct Gate {
    permits: Arc<Semaphore>,
    size: usize,
    pub timeout: Duration,
}

/// A turn at the gate, shared by the answer's body and the work behind it (a blocking
/// serialiser): the next request waits until both are done, so a client that leaves early
/// does not let more work start than the gate allows.
#[derive(Clone)]
pub struct Turn {
    _held: Arc<Held>,
    pub deadline: Instant,
}

struct Held {
    permit: Option<OwnedSemaphorePermit>,
    gate: Gate,
}

impl Gate {
    pub fn new(size: usize, timeout: Duration) -> Gate {
        Gate {
            permits: Arc::new(Semaphore::new(size)),
            size,
            timeout,
        }
    }

    /// Waits for a turn until the request's deadline; None when it passed.
    pub async fn enter(&self, deadline: Instant) -> Option<Turn> {
        let permit = tokio::time::timeout_at(deadline, self.permits.clone().acquire_owned())
            .await
            .ok()?
            .ok()?;
        let held = Held {
            permit: Some(permit),
            gate: self.clone(),
        };
        Some(Turn {
            _held: Arc::new(held),
            deadline,
        })
    }

    pub fn busy(&self) -> Response {
        let mut r = (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "busy: {} expensive requests are being answered on this address and this one \
                 waited {:?}; retry later\n",
                self.size, self.timeout
            ),
        )
            .into_response();
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        r
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        drop(self.permit.take());
        // The last expensive answer is done: hand the pages its buffers used back to the
        // system. glibc keeps freed memory in its arenas otherwise, and RSS stays at the peak.
        if self.gate.permits.available_permits() == self.gate.size {
            trim_heap();
        }
    }
}

#[cfg(target_env = "gnu")]
pub(super) fn trim_heap() {
    // SAFETY: malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
}

#[cfg(not(target_env = "gnu"))]
pub(super) fn trim_heap() {}

/// A response body that keeps its turn until the last byte is written, and is abandoned
/// (the connection closed) when the deadline passes first.
struct Guarded {
    inner: Body,
    sleep: Pin<Box<Sleep>>,
    _turn: Turn,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if self.sleep.as_mut().poll(cx).is_ready() {
            let e = std::io::Error::new(std::io::ErrorKind::TimedOut, "answer not read in time");
            return Poll::Ready(Some(Err(axum::Error::new(e))));
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// `response` with its body bound to `turn`.
pub fn guarded(response: Response, turn: Turn) -> Response {
    let sleep = Box::pin(tokio::time::sleep_until(turn.deadline));
    response.map(|inner| {
        Body::new(Guarded {
            inner,
            sleep,
            _turn: turn,
        })
    })
}

/// JSON of what `produce` returns, serialised on a blocking thread (holding `turn`) into
/// chunks that are sent as the client reads: one chunk in hand and two queued, never the
/// whole document.
pub fn json_stream<T, F>(turn: Turn, produce: F) -> Response
where
    T: Serialize,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Bytes>(2);
    tokio::task::spawn_blocking(move || {
        let _turn = turn;
        let value = produce();
        let mut w = ChunkWriter {
            tx,
            buf: Vec::with_capacity(CHUNK),
        };
        // An error means the client left (the receiver is gone): nothing more to do.
        if serde_json::to_writer(&mut w, &value).is_ok() {
            let _ = w.flush();
        }
    });
    let body = Body::new(ChannelBody { rx });
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

/// Text made in pieces by `produce` on a blocking thread (holding `turn`), sent as the client
/// reads: one piece in hand and two queued, never the whole text.
pub fn text_stream<I, F>(turn: Turn, content_type: &'static str, produce: F) -> Response
where
    I: Iterator<Item = String>,
    F: FnOnce() -> I + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Bytes>(2);
    tokio::task::spawn_blocking(move || {
        let _turn = turn;
        for piece in produce() {
            // An error means the client left: stop making the rest.
            if tx.blocking_send(Bytes::from(piece)).is_err() {
                break;
            }
        }
    });
    let body = Body::new(ChannelBody { rx });
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
        body,
    )
        .into_response()
}

struct ChunkWriter {
    tx: mpsc::Sender<Bytes>,
    buf: Vec<u8>,
}

impl ChunkWriter {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        self.tx
            .blocking_send(Bytes::from(chunk))
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn json_streams_in_chunks_and_parses_whole() {
        let rows: Vec<u32> = (0..100_000).collect();
        let expect = rows.clone();
        let gate = Gate::new(1, Duration::from_secs(5));
        let turn = gate.enter(Instant::now() + gate.timeout).await.unwrap();
        let resp = json_stream(turn.clone(), move || rows);
        drop(turn);
        // The serialiser holds the turn until it is done.
        assert!(gate.enter(Instant::now()).await.is_none());
        let mut body = resp.into_body();
        let (mut frames, mut all) = (0, Vec::new());
        while let Some(f) = body.frame().await {
            let data = f.unwrap().into_data().unwrap();
            assert!(data.len() <= CHUNK + 16, "{}", data.len());
            all.extend_from_slice(&data);
            frames += 1;
        }
        assert!(frames > 10, "{frames} frames");
        assert_eq!(serde_json::from_slice::<Vec<u32>>(&all).unwrap(), expect);
        drop(body);
        tokio::task::yield_now().await;
        assert!(gate.enter(Instant::now() + gate.timeout).await.is_some());
    }

    #[tokio::test]
    async fn the_gate_admits_its_size_and_times_out_the_rest() {
        let gate = Gate::new(2, Duration::from_millis(50));
        let soon = || Instant::now() + Duration::from_millis(50);
        let a = gate.enter(soon()).await.unwrap();
        let _b = gate.enter(soon()).await.unwrap();
        assert!(gate.enter(soon()).await.is_none());
        drop(a);
        assert!(gate.enter(soon()).await.is_some());
    }
}
