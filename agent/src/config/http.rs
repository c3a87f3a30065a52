//! `[http]`: where the endpoints listen, the limits that keep a hostile client from
//! exhausting the agent, and TLS and authentication for the address that faces the network.
use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::{Deserialize, Serialize};

use super::{Bounds, ConfigError};

/// Two addresses: `addr` serves every endpoint and stays on loopback (the debug views list
/// every process on the host); `metrics_addr` serves only /metrics, /healthz and /readyz and
/// may face the network, with optional TLS and authentication.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Every endpoint: /healthz, /readyz, /metrics and /debug/*. Loopback only, unless
    /// `expose_debug`.
    pub addr: SocketAddr,
    /// /metrics, /healthz and /readyz only; any address. Unset: not served.
    pub metrics_addr: Option<SocketAddr>,
    /// Let `addr` (and so /debug/*) listen on a non-loopback address.
    pub expose_debug: bool,
    /// Open connections per address. At the cap a new connection closes the oldest one that
    /// is not being answered, so a flood of idle connections cannot lock out the probes.
    pub max_connections: u32,
    /// Expensive requests (/metrics, /debug/*) answered at once per address; more wait for
    /// a turn until `request_timeout_ms`, then get 503. /healthz and /readyz never wait.
    pub max_concurrent_requests: u32,
    /// Time a client has to send a request's headers. Also how long an idle keep-alive
    /// connection is kept.
    pub header_read_timeout_ms: u64,
    /// Request line and headers, in bytes; larger requests get 431.
    pub max_request_header_bytes: u32,
    /// From a request's headers to the last byte of its answer, waiting for a turn
    /// included; a client that reads slower than this loses the answer.
    pub request_timeout_ms: u64,
    /// TLS on `metrics_addr`, as Prometheus exporters' `tls_server_config`.
    pub tls: Option<TlsConfig>,
    /// Credentials /metrics on `metrics_addr` requires (/healthz and /readyz stay open).
    pub auth: AuthConfig,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            addr: "127.0.0.1:9464".parse().unwrap(),
            metrics_addr: None,
            expose_debug: false,
            max_connections: 256,
            max_concurrent_requests: 2,
            header_read_timeout_ms: 5_000,
            max_request_header_bytes: 16 << 10,
            request_timeout_ms: 30_000,
            tls: None,
            auth: AuthConfig::default(),
        }
    }
}

/// Prometheus exporter-toolkit's `tls_server_config`, with its key names.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain, the server's own certificate first.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM CA bundle that client certificates must chain to.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
    /// Unset: RequireAndVerifyClientCert with a `client_ca_file`, NoClientCert without.
    #[serde(default)]
    pub client_auth_type: Option<ClientAuthType>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
pub enum ClientAuthType {
    NoClientCert,
    VerifyClientCertIfGiven,
    RequireAndVerifyClientCert,
}

/// Basic authentication as Prometheus exporters do it, or a bearer token; either admits.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// User name -> bcrypt hash (`htpasswd -nBC 10 USER`), as exporter-toolkit's
    /// `basic_auth_users`.
    pub basic_auth_users: BTreeMap<String, String>,
    /// A file holding the bearer token (a mounted Secret), read at start-up.
    pub bearer_token_file: Option<PathBuf>,
}

impl AuthConfig {
    pub fn enabled(&self) -> bool {
        !self.basic_auth_users.is_empty() || self.bearer_token_file.is_some()
    }

    /// The token from `bearer_token_file`, trimmed; an empty file is an error.
    pub fn bearer_token(&self) -> Result<Option<String>, String> {
        let Some(path) = &self.bearer_token_file else {
            return Ok(None);
        };
        let text = read(path)?;
        let token = String::from_utf8(text)
            .map_err(|_| format!("{}: not UTF-8 text", path.display()))?
            .trim()
            .to_string();
        if token.is_empty() || token.contains(char::is_whitespace) {
            return Err(format!(
                "{}: empty, or not one token (whitespace inside)",
                path.display()
            ));
        }
        Ok(Some(token))
    }
}

/// Certificates, keys and tokens are a few KiB: a path to a device or a huge file
/// (`/dev/zero`) must not hang or exhaust `check-config` or the agent at start.
fn read(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    const MAX: u64 = 1 << 20;
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let file = std::fs::File::open(path).map_err(|e| fail(&e))?;
    let meta = file.metadata().map_err(|e| fail(&e))?;
    if !meta.is_file() || meta.len() > MAX {
        return Err(fail(&format!("not a regular file of at most {MAX} bytes")));
    }
    let mut out = Vec::new();
    file.take(MAX).read_to_end(&mut out).map_err(|e| fail(&e))?;
    Ok(out)
}

impl TlsConfig {
    /// The rustls server configuration: certificates and key read and checked against each
    /// other, the client verifier built. The same call validates the config and starts the
    /// server, so what `check-config` accepts is what `run` serves.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, (&'static str, String)> {
        use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
        let certs = read(&self.cert_file)
            .and_then(|pem| {
                let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&pem).collect();
                certs.map_err(|e| format!("{}: {e}", self.cert_file.display()))
            })
            .and_then(|c| match c.is_empty() {
                true => Err(format!("{}: no PEM certificate", self.cert_file.display())),
                false => Ok(c),
            })
            .map_err(|e| ("http.tls.cert_file", e))?;
        let key = read(&self.key_file)
            .and_then(|pem| {
                PrivateKeyDer::from_pem_slice(&pem)
                    .map_err(|e| format!("{}: no PEM private key: {e}", self.key_file.display()))
            })
            .map_err(|e| ("http.tls.key_file", e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| ("http.tls", e.to_string()))?;
        let config = match self.client_verifier(provider)? {
            Some(v) => builder.with_client_cert_verifier(v),
            None => builder.with_no_client_auth(),
        }
        .with_single_cert(certs, key)
        .map_err(|e| {
            (
                "http.tls.key_file",
                format!("does not match cert_file: {e}"),
            )
        })?;
        Ok(Arc::new(config))
    }

    fn client_verifier(
        &self,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>, (&'static str, String)>
    {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        let kind = match (self.client_auth_type, &self.client_ca_file) {
            (None, None) | (Some(ClientAuthType::NoClientCert), None) => return Ok(None),
            (Some(ClientAuthType::NoClientCert), Some(_)) => {
                return Err((
                    "http.tls.client_auth_type",
                    "NoClientCert with a client_ca_file: clients would not be verified; \
                     remove one of the two"
                        .into(),
                ))
            }
            (Some(_), None) => {
                return Err((
                    "http.tls.client_ca_file",
                    "client_auth_type verifies client certificates: it needs a client_ca_file"
                        .into(),
                ))
            }
            (kind, Some(_)) => kind.unwrap_or(ClientAuthType::RequireAndVerifyClientCert),
        };
        let path = self.client_ca_file.as_deref().unwrap_or(Path::new(""));
        let field = "http.tls.client_ca_file";
        let pem = read(path).map_err(|e| (field, e))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| (field, format!("{}: {e}", path.display())))?;
            roots
                .add(cert)
                .map_err(|e| (field, format!("{}: {e}", path.display())))?;
        }
        if roots.is_empty() {
            return Err((field, format!("{}: no PEM certificate", path.display())));
        }
        let builder =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
        let builder = match kind {
            ClientAuthType::VerifyClientCertIfGiven => builder.allow_unauthenticated(),
            _ => builder,
        };
        builder
            .build()
            .map(Some)
            .map_err(|e| (field, e.to_string()))
    }
}

/// A bcrypt hash as htpasswd and exporter-toolkit write it: `$2a$`, `$2b$` or `$2y$`, a
/// two-digit cost, then 53 characters of salt and hash.
fn is_bcrypt(hash: &str) -> bool {
    let b = hash.as_bytes();
    let alphabet = |c: &u8| c.is_ascii_alphanumeric() || *c == b'.' || *c == b'/';
    b.len() == 60
        && (hash.starts_with("$2a$") || hash.starts_with("$2b$") || hash.starts_with("$2y$"))
        && b[4].is_ascii_digit()
        && b[5].is_ascii_digit()
        && (4..=31).contains(&((b[4] - b'0') * 10 + (b[5] - b'0')))
        && b[6] == b'$'
        && b[7..].iter().all(alphabet)
}

impl HttpConfig {
    pub(super) const MAX_CONNECTIONS: Bounds = Bounds::new(8, 16_384, "");
    pub(super) const MAX_CONCURRENT_REQUESTS: Bounds = Bounds::new(1, 256, "");
    pub(super) const HEADER_READ_TIMEOUT_MS: Bounds = Bounds::new(100, 300_000, "ms");
    pub(super) const MAX_REQUEST_HEADER_BYTES: Bounds = Bounds::new(8192, 1 << 20, "bytes");
    pub(super) const REQUEST_TIMEOUT_MS: Bounds = Bounds::new(1_000, 3_600_000, "ms");

    /// Every rule of `[http]`; file-backed settings (TLS, token) are read and checked.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid =
            |field: &'static str, message: String| Err(ConfigError::Invalid { field, message });
        if !self.addr.ip().to_canonical().is_loopback() && !self.expose_debug {
            return invalid(
                "http.addr",
                format!(
                    "{} is not a loopback address, and this address serves /debug/* (every \
                     process on the host, its cgroup and container). Serve /metrics, /healthz \
                     and /readyz to the network on http.metrics_addr (--metrics-addr) instead, \
                     or set http.expose_debug = true to expose /debug/* on purpose",
                    self.addr
                ),
            );
        }
        if let Some(m) = self.metrics_addr {
            if m == self.addr && m.port() != 0 {
                return invalid(
                    "http.metrics_addr",
                    format!("{m} is http.addr too: give it another port"),
                );
            }
        }
        self.validate_limits()?;
        if self.metrics_addr.is_none() && (self.tls.is_some() || self.auth.enabled()) {
            let field = if self.tls.is_some() {
                "http.tls"
            } else {
                "http.auth"
            };
            return invalid(
                field,
                "applies to http.metrics_addr, which is not set (http.addr stays on loopback, \
                 without TLS or authentication)"
                    .into(),
            );
        }
        if let Some(tls) = &self.tls {
            tls.server_config()
                .map_err(|(field, message)| ConfigError::Invalid { field, message })?;
        }
        for (user, hash) in &self.auth.basic_auth_users {
            if user.is_empty() || user.contains(':') {
                return invalid(
                    "http.auth.basic_auth_users",
                    format!("user name {user:?}: empty or contains ':'"),
                );
            }
            if !is_bcrypt(hash) {
                return invalid(
                    "http.auth.basic_auth_users",
                    format!(
                        "{user}: not a bcrypt hash ($2y$10$ followed by 53 characters; make \
                         one with `htpasswd -nBC 10 {user}`)"
                    ),
                );
            }
        }
        self.auth
            .bearer_token()
            .map(|_| ())
            .map_err(|message| ConfigError::Invalid {
                field: "http.auth.bearer_token_file",
                message,
            })
    }

    fn validate_limits(&self) -> Result<(), ConfigError> {
        Self::MAX_CONNECTIONS.check("http.max_connections", self.max_connections.into())?;
        Self::MAX_CONCURRENT_REQUESTS.check(
            "http.max_concurrent_requests",
            self.max_concurrent_requests.into(),
        )?;
        Self::HEADER_READ_TIMEOUT_MS
            .check("http.header_read_timeout_ms", self.header_read_timeout_ms)?;
        Self::MAX_REQUEST_HEADER_BYTES.check(
            "http.max_request_header_bytes",
            self.max_request_header_bytes.into(),
        )?;
        Self::REQUEST_TIMEOUT_MS.check("http.request_timeout_ms", self.request_timeout_ms)
    }

    pub fn header_read_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.header_read_timeout_ms)
    }

    pub fn request_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.request_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(toml_text: &str) -> Result<HttpConfig, String> {
        let c: HttpConfig = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        c.validate().map(|_| c).map_err(|e| e.to_string())
    }

    #[test]
    fn a_device_or_directory_as_a_tls_or_token_file_is_refused_without_reading_it() {
        let tls = "metrics_addr = \"127.0.0.1:1\"\n[tls]\ncert_file = \"/dev/zero\"\n\
                   key_file = \"/dev/zero\"\n";
        let e = check(tls).unwrap_err();
        assert!(
            e.contains("http.tls.cert_file") && e.contains("not a regular file"),
            "{e}"
        );
        let token = "metrics_addr = \"127.0.0.1:1\"\n[auth]\nbearer_token_file = \"/\"\n";
        let e = check(token).unwrap_err();
        assert!(
            e.contains("http.auth.bearer_token_file") && e.contains("not a regular file"),
            "{e}"
        );
    }

    #[test]
    fn addr_must_be_loopback_unless_debug_is_exposed_on_purpose() {
        let e = check("addr = \"0.0.0.0:9464\"\n").unwrap_err();
        assert!(
            e.contains("http.addr") && e.contains("not a loopback"),
            "{e}"
        );
        assert!(
            e.contains("http.metrics_addr") && e.contains("expose_debug"),
            "{e}"
        );
        check("addr = \"0.0.0.0:9464\"\nexpose_debug = true\n").unwrap();
        check("addr = \"[::1]:9464\"\n").unwrap();
        let e = check("addr = \"[::ffff:10.0.0.1]:9464\"\n").unwrap_err();
        assert!(e.contains("http.addr"), "{e}");
        let c = check("metrics_addr = \"0.0.0.0:9465\"\n").unwrap();
        assert_eq!(c.addr, HttpConfig::default().addr);
    }

    #[test]
    fn limits_are_range_checked_by_name() {
        for (key, bad) in [
            ("max_connections", "0"),
            ("max_concurrent_requests", "0"),
            ("header_read_timeout_ms", "10"),
            ("max_request_header_bytes", "100"),
            ("request_timeout_ms", "18446744073709551615"),
        ] {
            let e = check(&format!("{key} = {bad}\n")).unwrap_err();
            assert!(e.contains(&format!("http.{key}")), "{key}: {e}");
        }
        let e = check("metrics_addr = \"127.0.0.1:9464\"\n").unwrap_err();
        assert!(e.contains("http.metrics_addr"), "{e}");
    }

    #[test]
    fn tls_and_auth_need_the_metrics_address_and_good_material() {
        let e = check("[auth]\nbearer_token_file = \"/etc/hostname\"\n").unwrap_err();
        assert!(e.contains("http.auth") && e.contains("metrics_addr"), "{e}");
        let m = "metrics_addr = \"0.0.0.0:9465\"\n";
        let e = check(&format!(
            "{m}[tls]\ncert_file = \"/nope\"\nkey_file = \"/nope\"\n"
        ))
        .unwrap_err();
        assert!(
            e.contains("http.tls.cert_file") && e.contains("/nope"),
            "{e}"
        );
        let e = check(&format!(
            "{m}[auth]\nbasic_auth_users = {{ p = \"secret\" }}\n"
        ))
        .unwrap_err();
        assert!(
            e.contains("basic_auth_users") && e.contains("bcrypt"),
            "{e}"
        );
        let hash = "$2y$10$mDwo.ru0Sxvnq.uW1yxDpe9Ka4QxkB1AodMlGT6PdK3FVcLNzpmEu";
        check(&format!(
            "{m}[auth]\nbasic_auth_users = {{ p = \"{hash}\" }}\n"
        ))
        .unwrap();
        let e = check(&format!(
            "{m}[tls]\ncert_file = \"a\"\nkey_file = \"b\"\nx = 1\n"
        ))
        .unwrap_err();
        assert!(e.contains("unknown field `x`"), "{e}");
    }
}
