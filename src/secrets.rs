//! AWS Secrets Manager: the client registry (loaded at cold start, refreshed
//! on a timer) and the Redis URL or password. Secret values are never logged.

use std::path::PathBuf;
use std::time::Duration;

use aws_sdk_secretsmanager::error::DisplayErrorContext;

use crate::security::{ClientRegistry, RegistryError, RegistryHandle};

/// A Secrets Manager client (endpoint, region and credentials from the usual
/// AWS configuration chain, e.g. `AWS_ENDPOINT_URL` for a local emulator).
#[derive(Clone)]
pub struct SecretStore {
    client: aws_sdk_secretsmanager::Client,
}

/// A secret could not be read. Carries the SDK's error context, never a value.
#[derive(Debug, thiserror::Error)]
#[error("secret {id}: {reason}")]
pub struct SecretError {
    id: String,
    reason: String,
}

impl SecretStore {
    /// A store configured from the environment.
    pub async fn from_env() -> Self {
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        Self::new(aws_sdk_secretsmanager::Client::new(&config))
    }

    /// A store over an existing SDK client.
    pub fn new(client: aws_sdk_secretsmanager::Client) -> Self {
        Self { client }
    }

    /// The current `SecretString` of `id`.
    pub async fn fetch(&self, id: &str) -> Result<String, SecretError> {
        let error = |reason: String| SecretError {
            id: id.to_owned(),
            reason,
        };
        let out = self
            .client
            .get_secret_value()
            .secret_id(id)
            .send()
            .await
            .map_err(|e| error(DisplayErrorContext(&e).to_string()))?;
        out.secret_string
            .ok_or_else(|| error("has no SecretString (binary secrets are not supported)".into()))
    }
}

/// Where the client registry document comes from.
#[derive(Clone)]
pub enum RegistrySource {
    /// A Secrets Manager secret (Lambda).
    Secret {
        /// The client.
        store: SecretStore,
        /// `PROXY_POOL_CLIENTS_SECRET_ID`.
        id: String,
    },
    /// A local file (`proxy-pool serve --clients FILE`).
    File(PathBuf),
}

/// Why the registry document could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The secret could not be read.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// The file could not be read.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The document is not a registry (its reason names the field, never a value).
    #[error(transparent)]
    Document(#[from] RegistryError),
}

impl RegistrySource {
    /// Reads and parses the document.
    pub async fn load(&self) -> Result<ClientRegistry, LoadError> {
        let text = match self {
            Self::Secret { store, id } => store.fetch(id).await?,
            Self::File(path) => {
                tokio::fs::read_to_string(path)
                    .await
                    .map_err(|source| LoadError::File {
                        path: path.clone(),
                        source,
                    })?
            }
        };
        Ok(ClientRegistry::parse(&text)?)
    }
}

/// Loads the registry now, then reloads it every `period` in the background.
/// A failed first load leaves the handle empty (extraction answers 503 until
/// a load succeeds); a failed refresh keeps the last good copy. Both warn.
pub async fn start_registry(source: RegistrySource, period: Duration) -> RegistryHandle {
    let handle = RegistryHandle::refreshed_every(period);
    refresh(&source, &handle).await;
    watch(source, period, handle.clone());
    handle
}

/// Like [`start_registry`], but a failed first load is an error now (a
/// local file named on the command line), not a 503 later.
pub async fn start_registry_strict(
    source: RegistrySource,
    period: Duration,
) -> Result<RegistryHandle, LoadError> {
    let handle = RegistryHandle::refreshed_every(period);
    handle.replace(source.load().await?);
    watch(source, period, handle.clone());
    Ok(handle)
}

/// Reloads `source` into `handle` every `period`, in the background.
fn watch(source: RegistrySource, period: Duration, background: RegistryHandle) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            refresh(&source, &background).await;
        }
    });
}

/// One load attempt into `handle`; true when it succeeded.
pub async fn refresh(source: &RegistrySource, handle: &RegistryHandle) -> bool {
    let started = std::time::Instant::now();
    match source.load().await {
        Ok(registry) => {
            tracing::info!(clients = registry.len(), "client registry loaded");
            handle.replace_read_at(registry, started);
            true
        }
        Err(e) if handle.current().is_some() => {
            tracing::warn!(error = %e, "client registry refresh failed; keeping the last good copy");
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "client registry could not be loaded; extraction answers 503 until it is");
            false
        }
    }
}

/// A Redis secret that yields no URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RedisSecretError {
    /// A JSON document with neither field.
    #[error("the Redis secret has neither `url` nor `password`")]
    Empty,
    /// A password, but no URL to put it into.
    #[error("a Redis password secret needs PROXY_POOL_REDIS_URL for the host")]
    NoBaseUrl,
    /// The URL to put it into is not a URL.
    #[error("PROXY_POOL_REDIS_URL is not a URL")]
    BadBaseUrl,
}

/// The Redis URL from a Redis secret: `{"url": ..}`, a bare `redis://` URL,
/// or a password (`{"password": .., "username": ..}` or a bare string) put
/// into `base` (`PROXY_POOL_REDIS_URL`).
pub fn redis_url_from_secret(secret: &str, base: Option<&str>) -> Result<String, RedisSecretError> {
    let secret = secret.trim();
    let (url, username, password) = match serde_json::from_str::<serde_json::Value>(secret) {
        Ok(serde_json::Value::Object(o)) => {
            let field = |k: &str| o.get(k).and_then(|v| v.as_str()).map(str::to_owned);
            (field("url"), field("username"), field("password"))
        }
        _ if secret.starts_with("redis://") || secret.starts_with("rediss://") => {
            (Some(secret.to_owned()), None, None)
        }
        _ => (None, None, Some(secret.to_owned())),
    };
    if let Some(url) = url {
        return Ok(url);
    }
    let password = password.ok_or(RedisSecretError::Empty)?;
    let base = base.ok_or(RedisSecretError::NoBaseUrl)?;
    let (scheme, rest) = base.split_once("://").ok_or(RedisSecretError::BadBaseUrl)?;
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    Ok(format!(
        "{scheme}://{}:{}@{host}",
        username.as_deref().map(enc).unwrap_or_default(),
        enc(&password)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every documented secret shape yields a usable URL.
    #[test]
    fn redis_secret_shapes() {
        let base = Some("rediss://cache.example:6379/0");
        assert_eq!(
            redis_url_from_secret(r#"{"url":"redis://h:1/"}"#, None).unwrap(),
            "redis://h:1/"
        );
        assert_eq!(
            redis_url_from_secret("rediss://x:y@h:2/", None).unwrap(),
            "rediss://x:y@h:2/"
        );
        assert_eq!(
            redis_url_from_secret("p@ss word", base).unwrap(),
            "rediss://:p%40ss%20word@cache.example:6379/0"
        );
        assert_eq!(
            redis_url_from_secret(r#"{"username":"app","password":"pw"}"#, base).unwrap(),
            "rediss://app:pw@cache.example:6379/0"
        );
        assert!(redis_url_from_secret("pw", None).is_err());
        assert!(redis_url_from_secret(r#"{"user":"x"}"#, base).is_err());
    }
}
