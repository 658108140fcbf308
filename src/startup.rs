//! What the Lambda function and `proxy-pool serve` both do before serving,
//! done the same way for both: the Redis URL (possibly from a Secrets
//! Manager secret), the client registry (Secrets Manager, a local file,
//! or a fixed one), chosen by the same rules, and the aggregates database
//! (its URL or its secret; contacted only by a flush). The pool's options
//! are built here from the settings ([`Config::redis_options`]), as the
//! pool never sees [`Config`].

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use crate::aggregates::{Aggregates, DatabaseSource};
use crate::config::Config;
use crate::pool::{CredentialSource, PoolError, PoolPolicy, RedisOptions, RedisPool};
use crate::secrets::{
    RegistrySource, SecretStore, redis_url_from_secret, start_registry, start_registry_strict,
};
use crate::security::{ClientRegistry, Directory, RedisRegistry, RegistryHandle};

/// Why the process cannot start; names the setting at fault, never a secret.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StartupError(String);

impl Config {
    /// How to reach Redis (everything but the URL).
    pub fn redis_options(&self) -> RedisOptions {
        RedisOptions {
            timeout: self.redis_timeout,
            cluster: self.redis_cluster,
            functions: self.redis_functions,
            ca_file: self.redis_ca_file.clone(),
            replica_acks: self.replica_acks,
            replica_ack_timeout: self.replica_ack_timeout,
            policy: PoolPolicy {
                max_health_check_age: self.max_health_check_age,
                min_remaining_ttl: self.min_remaining_ttl,
            },
            pool: self.pool_name.clone(),
        }
    }
}

/// A Secrets Manager client, when the configuration names any secret.
pub async fn secret_store(config: &Config) -> Option<SecretStore> {
    if config.clients_secret_id.is_some()
        || config.redis_secret_id.is_some()
        || config.aggregates_database_secret_id.is_some()
    {
        Some(SecretStore::from_env().await)
    } else {
        None
    }
}

/// The Redis URL: from `PROXY_POOL_REDIS_SECRET_ID` if set (combined with
/// `PROXY_POOL_REDIS_URL` when the secret holds only a password), else
/// `PROXY_POOL_REDIS_URL`; `None` when neither is set.
pub async fn redis_url(
    config: &Config,
    store: Option<&SecretStore>,
) -> Result<Option<String>, StartupError> {
    match (&config.redis_secret_id, store) {
        (Some(id), Some(store)) => {
            let secret = store
                .fetch(id)
                .await
                .map_err(|e| StartupError(format!("PROXY_POOL_REDIS_SECRET_ID: {e}")))?;
            redis_url_from_secret(&secret, config.redis_url.as_deref())
                .map(Some)
                .map_err(|e| StartupError(format!("PROXY_POOL_REDIS_SECRET_ID: {e}")))
        }
        _ => Ok(config.redis_url.clone()),
    }
}

/// The Redis secret read again (after Redis refused its credentials).
struct RedisSecret {
    store: SecretStore,
    id: String,
    base: Option<String>,
}

impl CredentialSource for RedisSecret {
    fn fresh_url(&self) -> Pin<Box<dyn Future<Output = Option<String>> + Send + '_>> {
        Box::pin(async move {
            let secret = self.store.fetch(&self.id).await.ok()?;
            redis_url_from_secret(&secret, self.base.as_deref()).ok()
        })
    }
}

/// The pool over `url`. When the URL came from `PROXY_POOL_REDIS_SECRET_ID`,
/// that secret is read again after Redis refuses the credentials (bounded:
/// see [`crate::pool::CREDENTIAL_REREAD_EVERY`]), so a rotated AUTH token
/// reaches running instances without a redeploy.
pub fn redis_pool(
    config: &Config,
    store: Option<&SecretStore>,
    url: &str,
) -> Result<RedisPool, PoolError> {
    let pool = RedisPool::with_options(url, &config.redis_options())?;
    Ok(match (&config.redis_secret_id, store) {
        (Some(id), Some(store)) => pool.with_credential_source(
            url,
            Arc::new(RedisSecret {
                store: store.clone(),
                id: id.clone(),
                base: config.redis_url.clone(),
            }),
        ),
        _ => pool,
    })
}

/// A registry the caller has at hand: a local file (`serve --clients`), or
/// a fixed one (`serve`'s demo client).
#[derive(Debug, Clone, Default)]
pub struct LocalRegistry {
    /// A registry document to load, and reload every refresh period.
    pub file: Option<PathBuf>,
    /// Used when nothing else is configured.
    pub fixed: Option<ClientRegistry>,
}

/// The client registry, by the first rule that applies: none when the
/// enabled schemes need none; the Redis registry in `pool` when
/// `PROXY_POOL_CLIENT_REGISTRY=redis`; the local file (a bad one is an error now);
/// the secret `PROXY_POOL_CLIENTS_SECRET_ID` (reloaded every
/// `PROXY_POOL_CLIENTS_REFRESH_SECONDS`; a failed first load answers 503
/// until one succeeds); the fixed registry; else an error.
pub async fn client_registry(
    config: &Config,
    store: Option<SecretStore>,
    local: LocalRegistry,
    pool: &RedisPool,
) -> Result<Directory, StartupError> {
    if !config.auth_schemes.need_registry() {
        return Ok(RegistryHandle::default().into());
    }
    if config.clients_in_redis {
        return Ok(RedisRegistry::new(pool.clone()).into());
    }
    if let Some(path) = local.file {
        return start_registry_strict(RegistrySource::File(path), config.clients_refresh)
            .await
            .map(Directory::from)
            .map_err(|e| StartupError(e.to_string()));
    }
    if let (Some(id), Some(store)) = (config.clients_secret_id.clone(), store) {
        let source = RegistrySource::Secret { store, id };
        return Ok(start_registry(source, config.clients_refresh).await.into());
    }
    if let Some(registry) = local.fixed {
        return Ok(RegistryHandle::with(registry).into());
    }
    Err(StartupError(
        "PROXY_POOL_CLIENTS_SECRET_ID (or PROXY_POOL_CLIENT_REGISTRY=redis): is required when PROXY_POOL_AUTH_SCHEMES enables apiKey, basic or bearer (or give serve --clients FILE)".into(),
    ))
}

/// The aggregates database, when one is configured: the secret
/// `PROXY_POOL_AGGREGATES_DATABASE_SECRET_ID` (read at each flush) if set,
/// else `PROXY_POOL_AGGREGATES_DATABASE_URL`. Nothing is contacted here.
pub fn aggregates(config: &Config, store: Option<&SecretStore>) -> Option<Aggregates> {
    let source = match (&config.aggregates_database_secret_id, store) {
        (Some(id), Some(store)) => DatabaseSource::Secret {
            store: store.clone(),
            id: id.clone(),
        },
        _ => DatabaseSource::Url(config.aggregates_database_url.clone()?),
    };
    Some(Aggregates::new(source, config.aggregates_options()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Each layer's options carry the settings they are built from.
    #[test]
    fn options_carry_the_settings() {
        let config = Config {
            pool_name: crate::pool::PoolName::parse("eu").unwrap(),
            redis_functions: false,
            max_health_check_age: Duration::from_secs(7),
            aggregates_ca_file: Some("/etc/rds.pem".into()),
            aggregates_retention: Duration::from_secs(48 * 3600),
            aggregates_timeout: Duration::from_millis(1500),
            ..Config::default()
        };
        let redis = config.redis_options();
        assert_eq!(redis.pool, config.pool_name);
        assert!(!redis.functions);
        assert_eq!(redis.policy.max_health_check_age, Duration::from_secs(7));
        let aggregates = config.aggregates_options();
        assert_eq!(aggregates.ca_file, config.aggregates_ca_file);
        assert_eq!(aggregates.retention, config.aggregates_retention);
        assert_eq!(aggregates.timeout, config.aggregates_timeout);
        // Extractions are counted only with a database to flush them to.
        assert_eq!(config.policy().usage_retention, None);
        let counted = Config {
            aggregates_database_secret_id: Some("aggregates".into()),
            ..config.clone()
        };
        assert_eq!(
            counted.settings().policy.usage_retention,
            Some(config.aggregates_retention)
        );
        assert_eq!(counted.settings().config_version, counted.version());
    }
}
