//! The Docker Engine API on plain Docker hosts: container id -> name (and the kubelet's
//! labels where dockershim-era nodes set them). A minimal HTTP/1.1 GET over the unix socket.
use std::path::Path;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use gpu_model::Name;

use super::ContainerNames;

pub async fn inspect(socket: &Path, id: &str) -> Result<Option<ContainerNames>, String> {
    let mut s = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        tokio::net::UnixStream::connect(socket),
    )
    .await
    .map_err(|_| "connect timed out".to_string())?
    .map_err(|e| e.to_string())?;
    let req =
        format!("GET /containers/{id}/json HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .map_err(|_| "read timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("malformed response")?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("no status")?;
    if status == 404 {
        return Ok(None);
    }
    if status != 200 {
        return Err(format!("HTTP {status}"));
    }
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    let labels = &v["Config"]["Labels"];
    let label = |k: &str| labels[k].as_str().filter(|s| !s.is_empty()).map(Name::from);
    Ok(Some(ContainerNames {
        pod_name: label("io.kubernetes.pod.name"),
        namespace: label("io.kubernetes.pod.namespace"),
        container_name: label("io.kubernetes.container.name")
            .or_else(|| v["Name"].as_str().map(|n| n.trim_start_matches('/').into())),
        pod_uid: label("io.kubernetes.pod.uid"),
        runtime: Some("docker"),
        workload: None,
    }))
}

/// `GET /_ping`: whether the Engine answers, so that its status is `ok` only after a call.
pub async fn ping(socket: &Path) -> Result<(), String> {
    let mut s = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        tokio::net::UnixStream::connect(socket),
    )
    .await
    .map_err(|_| "connect timed out".to_string())?
    .map_err(|e| e.to_string())?;
    s.write_all(b"GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .map_err(|_| "read timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let head = String::from_utf8_lossy(&buf);
    match head.split_whitespace().nth(1) {
        Some("200") => Ok(()),
        Some(code) => Err(format!("/_ping: HTTP {code}")),
        None => Err("/_ping: malformed response".into()),
    }
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
