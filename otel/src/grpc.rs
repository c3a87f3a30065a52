//! One unary gRPC call of an already encoded OTLP request over tonic's `Channel` (its
//! connection, TLS and timeout), without tonic's client, which copies the whole message into
//! a buffer of its own first: megabytes a second on a large node, and the room for that copy
//! kept in the heap. The body goes out as it is queued, after the 5-byte message prefix.
use std::{
    convert::Infallible,
    pin::Pin,
    task::{Context, Poll},
};

use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use prost::bytes::Bytes;
use tonic::{
    codegen::{http, Service},
    transport::Channel,
    Code, Status,
};

use crate::settings::OtlpSettings;

/// The request body: the length-prefix, then the message, each sent as it is.
struct Framed {
    prefix: Option<Bytes>,
    message: Option<Bytes>,
    len: u64,
}

impl Framed {
    fn new(compressed: bool, message: Bytes) -> Framed {
        let mut prefix = [0u8; 5];
        prefix[0] = u8::from(compressed);
        prefix[1..].copy_from_slice(&(message.len() as u32).to_be_bytes());
        Framed {
            len: 5 + message.len() as u64,
            prefix: Some(Bytes::copy_from_slice(&prefix)),
            message: Some(message),
        }
    }
}

impl Body for Framed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let next = self.prefix.take().or_else(|| self.message.take());
        Poll::Ready(next.map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.message.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len)
    }
}

/// Calls `path` with `message` (encoded protobuf), gzipped when the settings say so, with
/// their headers as metadata and their timeout; the reply's message is not read (OTLP's
/// partial success is informational). Errors are gRPC statuses, as tonic's client gives.
pub(crate) async fn unary(
    channel: &mut Channel,
    path: &'static str,
    message: Bytes,
    settings: &OtlpSettings,
) -> Result<(), Status> {
    let message = match settings.gzip {
        true => gzip(&message),
        false => message,
    };
    let mut req = http::Request::builder()
        .method(http::Method::POST)
        .uri(path)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        // The user-agent is the channel's (`USER_AGENT_GRPC`, then tonic's own).
        .header("grpc-timeout", format!("{}m", settings.timeout.as_millis()));
    if settings.gzip {
        req = req.header("grpc-encoding", "gzip");
    }
    for (k, v) in &settings.headers {
        let k = http::HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes());
        if let (Ok(k), Ok(v)) = (k, http::HeaderValue::from_str(v)) {
            req = req.header(k, v);
        }
    }
    let req = req
        .body(tonic::body::Body::new(Framed::new(settings.gzip, message)))
        .map_err(|e| Status::internal(format!("building the request: {e}")))?;
    std::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .map_err(|e| Status::unavailable(format!("not ready: {e}")))?;
    let reply = channel
        .call(req)
        .await
        .map_err(|e| Status::from_error(Box::new(e)))?;
    let (parts, body) = reply.into_parts();
    if parts.status != http::StatusCode::OK {
        return Err(from_http(parts.status));
    }
    // A trailers-only reply carries the status in its headers.
    if let Some(s) = Status::from_header_map(&parts.headers) {
        return ok_or(s);
    }
    let body = body.collect().await?;
    match body.trailers().and_then(Status::from_header_map) {
        Some(s) => ok_or(s),
        None => Err(Status::internal("the reply has no grpc-status")),
    }
}

fn ok_or(s: Status) -> Result<(), Status> {
    match s.code() {
        Code::Ok => Ok(()),
        _ => Err(s),
    }
}

/// gRPC's mapping of an HTTP status that is not 200 (doc/http-grpc-status-mapping.md).
pub(crate) fn from_http(status: http::StatusCode) -> Status {
    let code = match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(code, format!("HTTP {status}"))
}

fn gzip(message: &[u8]) -> Bytes {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(message).ok();
    enc.finish().unwrap_or_default().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_is_the_prefix_then_the_message_untouched() {
        let message = Bytes::from(vec![7u8; 300]);
        let mut body = Framed::new(false, message.clone());
        assert_eq!(body.size_hint().exact(), Some(305));
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut frames = vec![];
        while let Poll::Ready(Some(Ok(f))) = Pin::new(&mut body).poll_frame(&mut cx) {
            frames.push(f.into_data().unwrap());
        }
        assert_eq!(frames[0].as_ref(), [0, 0, 0, 1, 44]);
        assert_eq!(
            frames[1].as_ptr(),
            message.as_ptr(),
            "the queued bytes, not a copy"
        );
        assert!(body.is_end_stream());
        assert_eq!(Framed::new(true, message).prefix.unwrap()[0], 1);
    }

    #[test]
    fn http_statuses_map_as_grpc_says() {
        let code = |s: u16| from_http(http::StatusCode::from_u16(s).unwrap()).code();
        assert_eq!(code(503), Code::Unavailable);
        assert_eq!(code(429), Code::Unavailable);
        assert_eq!(code(401), Code::Unauthenticated);
        assert_eq!(code(404), Code::Unimplemented);
        assert_eq!(code(500), Code::Unknown);
    }
}
