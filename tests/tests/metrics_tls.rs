//! /metrics over TLS with credentials, scraped by a real Prometheus (Debian's, on PATH when
//! `cargo xtask test` runs as root; without it this fails, it does not skip). Certificates
//! come from the openssl command line; the agent runs without eBPF, on 127.0.0.1 only.
//!
//! One agent serves TLS with basic authentication (a bcrypt hash) and a bearer token;
//! another requires a client certificate. Prometheus scrapes both with the right
//! credentials (up = 1) and without (up = 0, and why); a rustls client checks the answers
//! themselves.
#[path = "http_hardening/hardening.rs"]
#[allow(dead_code)]
mod hardening;

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::Path,
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use base64::Engine;
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName};
use tests::{http, prom::Prometheus, TempDir as Dir};

const PASSWORD: &str = "correct horse battery staple";
const TOKEN: &str = "gpu-agent-test-token-4f1c";

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("openssl is needed (`apt-get install openssl`): {e}"));
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by it.
fn certificates() -> Dir {
    let dir = Dir::new("gpu-agent-tls");
    let d = &dir.0;
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let ca = [
        &["req", "-x509"][..],
        &ec,
        &["-days", "2", "-subj", "/CN=gpu-agent test CA"],
    ];
    openssl(
        d,
        &[ca.concat(), vec!["-keyout", "ca.key", "-out", "ca.crt"]].concat(),
    );
    for (name, ext) in [
        (
            "server",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        ),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ] {
        std::fs::write(d.join(format!("{name}.ext")), ext).unwrap();
        let (key, csr, crt, extfile) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.ext"),
        );
        let subj = format!("/CN=gpu-agent test {name}");
        openssl(
            d,
            &[
                &["req"][..],
                &ec,
                &["-subj", &subj, "-keyout", &key, "-out", &csr],
            ]
            .concat(),
        );
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &extfile,
                "-out",
                &crt,
            ],
        );
    }
    dir
}

fn path(dir: &Dir, file: &str) -> String {
    dir.0.join(file).display().to_string()
}

/// A rustls client: GET `path` on `addr` trusting `dir`'s CA, with a client certificate and
/// an Authorization header when given. (status, headers and body) or the TLS/IO error.
fn tls_get(
    dir: &Dir,
    addr: &str,
    path_: &str,
    client_cert: bool,
    authorization: Option<&str>,
) -> Result<(u16, String), String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(dir.0.join("ca.crt")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = if client_cert {
        let certs: Vec<_> = CertificateDer::pem_file_iter(dir.0.join("client.crt"))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = PrivateKeyDer::from_pem_file(dir.0.join("client.key")).unwrap();
        builder.with_client_auth_cert(certs, key).unwrap()
    } else {
        builder.with_no_client_auth()
    };
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let sock = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut tls = rustls::StreamOwned::new(conn, sock);
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    write!(
        tls,
        "GET {path_} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Connection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    match tls.read_to_end(&mut buf) {
        Ok(_) => {}
        // Some servers close without close_notify; what was read counts.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !buf.is_empty() => {}
        Err(e) => return Err(e.to_string()),
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {text:?}"))?;
    Ok((status, text))
}

/// A scrape job for `addr` over TLS trusting `dir`'s CA, with `extra` YAML (credentials).
fn job(name: &str, dir: &Dir, addr: &str, extra: &str) -> String {
    format!(
        "  - job_name: {name}\n    scheme: https\n    tls_config:\n      ca_file: {}\n{extra}    \
         static_configs:\n      - targets: ['{addr}']\n",
        path(dir, "ca.crt")
    )
}

fn start_agent(config: &str) -> hardening::Started {
    hardening::start_with(config, &["--no-ebpf", "--prometheus"], None)
}

#[test]
fn prometheus_scrapes_over_tls_with_credentials_and_is_refused_without() {
    let dir = certificates();
    std::fs::write(dir.0.join("token"), format!("{TOKEN}\n")).unwrap();
    let hash = bcrypt::hash(PASSWORD, 5).unwrap();
    let tls = format!(
        "[http.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
        path(&dir, "server.crt"),
        path(&dir, "server.key")
    );
    let base = "[nvml]\nenabled = false\n[http]\nmetrics_addr = \"127.0.0.1:0\"\n";
    let auth = start_agent(&format!(
        "{base}{tls}[http.auth]\nbasic_auth_users = {{ prom = \"{hash}\" }}\n\
         bearer_token_file = \"{}\"\n",
        path(&dir, "token")
    ));
    let mtls = start_agent(&format!(
        "{base}{tls}client_ca_file = \"{}\"\n",
        path(&dir, "ca.crt")
    ));
    let (a, m) = (auth.metrics.as_str(), mtls.metrics.as_str());

    // The answers themselves, through rustls.
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("prom:{PASSWORD}"))
    );
    let (s, text) = tls_get(&dir, a, "/metrics", false, None).unwrap();
    assert_eq!(s, 401, "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("www-authenticate: basic realm=\"gpu-agent\""),
        "{text}"
    );
    let (s, text) = tls_get(&dir, a, "/metrics", false, Some(&basic)).unwrap();
    assert!(s == 200 && text.contains("gpu_agent_"), "{text}");
    let (s, _) = tls_get(&dir, a, "/metrics", false, Some(&format!("Bearer {TOKEN}"))).unwrap();
    assert_eq!(s, 200);
    let (s, _) = tls_get(&dir, a, "/metrics", false, Some("Bearer nope")).unwrap();
    assert_eq!(s, 401);
    // The probes need no credentials; /debug stays off this address.
    assert_eq!(tls_get(&dir, a, "/healthz", false, None).unwrap().0, 200);
    assert_eq!(tls_get(&dir, a, "/readyz", false, None).unwrap().0, 200);
    assert_eq!(
        tls_get(&dir, a, "/debug/stats", false, Some(&basic))
            .unwrap()
            .0,
        404
    );
    // Plain HTTP on the TLS address gets nothing.
    assert!(http::get(a, "/healthz").map_or(true, |(s, _)| s != 200));
    // The mTLS agent: a client certificate signed by the CA, or no connection.
    assert_eq!(tls_get(&dir, m, "/metrics", true, None).unwrap().0, 200);
    let refused = tls_get(&dir, m, "/metrics", false, None);
    assert!(refused.is_err(), "{refused:?}");
    // The loopback address stays plain HTTP and needs no credentials.
    assert_eq!(http::get(&auth.agent.addr, "/metrics").unwrap().0, 200);

    // A real Prometheus, as an SRE would configure it.
    let wrong = "    basic_auth:\n      username: prom\n      password: wrong\n";
    let jobs = [
        job(
            "basic",
            &dir,
            a,
            &format!("    basic_auth:\n      username: prom\n      password: {PASSWORD}\n"),
        ),
        job(
            "bearer",
            &dir,
            a,
            &format!("    authorization:\n      credentials: {TOKEN}\n"),
        ),
        job("anonymous", &dir, a, ""),
        job("wrong_password", &dir, a, wrong),
        job(
            "client_cert",
            &dir,
            m,
            &format!(
                "    tls_config:\n      ca_file: {}\n      cert_file: {}\n      key_file: {}\n",
                path(&dir, "ca.crt"),
                path(&dir, "client.crt"),
                path(&dir, "client.key")
            ),
        ),
        job("no_client_cert", &dir, m, ""),
    ];
    // client_cert sets its own tls_config: drop the default one from that job.
    let jobs: Vec<String> = jobs
        .into_iter()
        .map(|j| {
            if j.contains("cert_file") {
                j.replacen(
                    &format!("    tls_config:\n      ca_file: {}\n", path(&dir, "ca.crt")),
                    "",
                    1,
                )
            } else {
                j
            }
        })
        .collect();
    let prom = Prometheus::start_with(&jobs.concat());
    let want = [
        ("basic", "up", ""),
        ("bearer", "up", ""),
        ("anonymous", "down", "401"),
        ("wrong_password", "down", "401"),
        ("client_cert", "up", ""),
        ("no_client_cert", "down", "certificate"),
    ];
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut last = vec![];
    while Instant::now() < deadline {
        last = prom.targets();
        let ok = want.iter().all(|(job, health, why)| {
            last.iter()
                .any(|(j, h, e)| j == job && h == health && e.contains(why))
        });
        if ok {
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!(
        "Prometheus targets never became {want:?}\nlast: {last:#?}\nprometheus log:\n{}\n\
         agent log:\n{}",
        prom.log(),
        auth.agent.log()
    );
}
