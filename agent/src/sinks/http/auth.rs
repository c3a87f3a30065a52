//! Credentials for /metrics on the network address: HTTP basic authentication against
//! bcrypt hashes (as Prometheus exporters' `basic_auth_users`), or a bearer token.
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    extract::{Request, State},
    http::{header, HeaderValue, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
};
use base64::Engine;
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;

use crate::config::AuthConfig;

/// How long a verified Authorization header is trusted without running bcrypt again: a
/// bcrypt check costs tens of milliseconds, and Prometheus sends the same header each scrape.
const REMEMBER: Duration = Duration::from_secs(300);
/// Verified headers remembered at once (a few scrapers).
const REMEMBERED: usize = 8;
/// Checked against when the user is unknown, so that the answer takes as long either way
/// and does not tell which user names exist.
const DUMMY_HASH: &str = "$2y$10$VFRXtn9sL7S3PgPwlIo0NuL4g3VWUS4vG0Wl5oD1JWkuLSfGc4ZPy";

pub struct Auth {
    users: BTreeMap<String, String>,
    bearer: Option<String>,
    remembered: Mutex<Vec<(Vec<u8>, Instant)>>,
    /// bcrypt runs one at a time, on a blocking thread: a flood of wrong passwords costs
    /// one core at most and never delays the event loop.
    bcrypt: Semaphore,
}

impl Auth {
    /// None when no credentials are configured (everything admitted).
    pub fn new(config: &AuthConfig) -> Result<Option<Arc<Auth>>, String> {
        if !config.enabled() {
            return Ok(None);
        }
        Ok(Some(Arc::new(Auth {
            users: config.basic_auth_users.clone(),
            bearer: config.bearer_token()?,
            remembered: Mutex::new(Vec::new()),
            bcrypt: Semaphore::new(1),
        })))
    }

    fn challenge(&self) -> &'static str {
        if self.users.is_empty() {
            "Bearer realm=\"gpu-agent\""
        } else {
            "Basic realm=\"gpu-agent\", charset=\"UTF-8\""
        }
    }

    fn is_remembered(&self, value: &[u8]) -> bool {
        let mut list = self.remembered.lock().unwrap();
        list.retain(|(_, at)| at.elapsed() < REMEMBER);
        // Compared in constant time, every entry: no early exit on the first match.
        list.iter().fold(0u8, |hit, (v, _)| {
            hit | v.as_slice().ct_eq(value).unwrap_u8()
        }) == 1
    }

    fn remember(&self, value: &[u8]) {
        let mut list = self.remembered.lock().unwrap();
        if list.len() >= REMEMBERED {
            list.remove(0);
        }
        list.push((value.to_vec(), Instant::now()));
    }

    /// Whether the Authorization header admits the request.
    pub async fn admits(&self, value: Option<&HeaderValue>) -> bool {
        let Some(value) = value.map(HeaderValue::as_bytes) else {
            return false;
        };
        if let (Some(token), Some(given)) = (&self.bearer, value.strip_prefix(b"Bearer ")) {
            return token.as_bytes().ct_eq(given).into();
        }
        let Some(encoded) = value.strip_prefix(b"Basic ") else {
            return false;
        };
        if self.users.is_empty() {
            return false;
        }
        if self.is_remembered(value) {
            return true;
        }
        let Some((user, password)) = decode_basic(encoded) else {
            return false;
        };
        let (hash, known) = match self.users.get(&user) {
            Some(h) => (h.clone(), true),
            None => (DUMMY_HASH.to_string(), false),
        };
        let Ok(_turn) = self.bcrypt.acquire().await else {
            return false;
        };
        let verified = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(false);
        if verified && known {
            self.remember(value);
        }
        verified && known
    }
}

fn decode_basic(encoded: &[u8]) -> Option<(String, String)> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim_ascii())
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

/// Middleware: 401 with a challenge unless the request carries valid credentials.
pub async fn require(State(auth): State<Arc<Auth>>, req: Request, next: Next) -> Response {
    if auth.admits(req.headers().get(header::AUTHORIZATION)).await {
        return next.run(req).await;
    }
    let mut r = (StatusCode::UNAUTHORIZED, "credentials required\n").into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(auth.challenge()),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(user: &str, password: &str) -> HeaderValue {
        let b64 = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        HeaderValue::from_str(&format!("Basic {b64}")).unwrap()
    }

    #[tokio::test]
    async fn basic_and_bearer_admit_only_the_right_credentials() {
        let dir = std::env::temp_dir().join(format!("gpu-agent-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let token = dir.join("token");
        std::fs::write(&token, "s3cr3t-token\n").unwrap();
        let hash = bcrypt::hash("pa:ss", 4).unwrap();
        let config = AuthConfig {
            basic_auth_users: [("prom".to_string(), hash)].into(),
            bearer_token_file: Some(token),
        };
        let auth = Auth::new(&config).unwrap().unwrap();
        assert!(auth.admits(Some(&basic("prom", "pa:ss"))).await);
        // Remembered, and still only for the same header.
        assert!(auth.admits(Some(&basic("prom", "pa:ss"))).await);
        assert!(!auth.admits(Some(&basic("prom", "pa:sS"))).await);
        assert!(!auth.admits(Some(&basic("other", "pa:ss"))).await);
        assert!(!auth.admits(None).await);
        let bearer = |t: &str| HeaderValue::from_str(&format!("Bearer {t}")).unwrap();
        assert!(auth.admits(Some(&bearer("s3cr3t-token"))).await);
        assert!(!auth.admits(Some(&bearer("s3cr3t-toke"))).await);
        assert!(
            !auth
                .admits(Some(&HeaderValue::from_static("Basic !!")))
                .await
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_dummy_hash_is_a_valid_bcrypt_hash() {
        assert!(!bcrypt::verify("x", DUMMY_HASH).unwrap());
    }
}
