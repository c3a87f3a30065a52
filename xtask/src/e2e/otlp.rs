//! An OTLP/HTTP receiver for the harness: POST /v1/metrics, protobuf, gzip or not — what
//! the deployed config sends (`protocol = "http/protobuf"`, `compression = "gzip"`), so the
//! agent in its container pushes exactly as it would to the node's Collector.
use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context, Result};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use prost::Message;

pub struct Receiver {
    pub addr: SocketAddr,
    received: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
}

impl Receiver {
    /// Listens on 127.0.0.1 (any free port); one thread per connection.
    pub fn start() -> Result<Receiver> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding the OTLP receiver")?;
        let addr = listener.local_addr()?;
        let received = Arc::new(Mutex::new(vec![]));
        let r = received.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let r = r.clone();
                std::thread::spawn(move || {
                    if let Err(e) = serve(conn, &r) {
                        eprintln!("e2e: OTLP receiver: {e:#}");
                    }
                });
            }
        });
        Ok(Receiver { addr, received })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far.
    pub fn all(&self) -> Vec<ExportMetricsServiceRequest> {
        self.received.lock().unwrap().clone()
    }
}

/// HTTP/1.1 keep-alive: requests on one connection until it closes.
fn serve(conn: TcpStream, received: &Mutex<Vec<ExportMetricsServiceRequest>>) -> Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut out = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let (mut len, mut gzip, mut chunked) = (0usize, false, false);
        loop {
            let mut h = String::new();
            r.read_line(&mut h)?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap_or((h, ""));
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_ascii_lowercase());
            match k.as_str() {
                "content-length" => len = v.parse().unwrap_or(0),
                "content-encoding" => gzip = v == "gzip",
                "transfer-encoding" => chunked = v.contains("chunked"),
                _ => {}
            }
        }
        let body = if chunked {
            read_chunked(&mut r)?
        } else {
            read_n(&mut r, len)?
        };
        let body = if gzip {
            let mut d = vec![];
            flate2::read::GzDecoder::new(&body[..])
                .read_to_end(&mut d)
                .context("gunzip")?;
            d
        } else {
            body
        };
        let (status, reply) = match ExportMetricsServiceRequest::decode(&body[..]) {
            Ok(req) if path == "/v1/metrics" => {
                received.lock().unwrap().push(req);
                (
                    "200 OK",
                    ExportMetricsServiceResponse::default().encode_to_vec(),
                )
            }
            Ok(_) => ("404 Not Found", vec![]),
            Err(_) => ("400 Bad Request", vec![]),
        };
        write!(
            out,
            "HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\n\r\n",
            reply.len()
        )?;
        out.write_all(&reply)?;
    }
}

fn read_n(r: &mut impl Read, n: usize) -> Result<Vec<u8>> {
    let mut b = vec![0; n];
    r.read_exact(&mut b)?;
    Ok(b)
}

fn read_chunked(r: &mut BufReader<TcpStream>) -> Result<Vec<u8>> {
    let mut body = vec![];
    loop {
        let mut size = String::new();
        r.read_line(&mut size)?;
        let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)?;
        let chunk = read_n(r, n)?;
        body.extend(chunk);
        let mut crlf = String::new();
        r.read_line(&mut crlf)?;
        if n == 0 {
            return Ok(body);
        }
    }
}
