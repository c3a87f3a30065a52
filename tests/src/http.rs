//! A minimal HTTP/1.1 GET, so the tests need no client stack of their own.
use std::{
    io::{Read, Write},
    net::TcpStream,
    time::Duration,
};

pub fn get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    get_on(s, addr, path)
}

/// The same over a unix socket (the Docker API's, say).
pub fn get_unix(sock: &std::path::Path, path: &str) -> std::io::Result<(u16, String)> {
    let s = std::os::unix::net::UnixStream::connect(sock)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    get_on(s, "localhost", path)
}

/// One GET on a fresh connection, which the reply closes.
fn get_on(mut s: impl Read + Write, host: &str, path: &str) -> std::io::Result<(u16, String)> {
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no header end"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status"))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(len.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}
