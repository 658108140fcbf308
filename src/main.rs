//! The AWS Lambda entrypoint: builds the shared clients once per cold start
//! (configuration, Secrets Manager, Redis connection, client registry), then
//! serves every invocation with [`proxy_pool::lambda::Function`]: API
//! Gateway events through [`proxy_pool::distribution::handle`], and the
//! EventBridge scheduled health check.

use std::sync::Arc;

use lambda_runtime::{Error, service_fn};
use proxy_pool::config::Config;
use proxy_pool::distribution::App;
use proxy_pool::lambda::Function;
use proxy_pool::pool::RedisPool;
use proxy_pool::secrets::{RegistrySource, SecretStore, redis_url_from_secret, start_registry};
use proxy_pool::security::{Guard, RegistryHandle};

#[tokio::main]
async fn main() -> Result<(), Error> {
    proxy_pool::telemetry::init(proxy_pool::telemetry::lambda_wants_json());
    let config = Config::from_env()?;
    let store = if config.clients_secret_id.is_some() || config.redis_secret_id.is_some() {
        Some(SecretStore::from_env().await)
    } else {
        None
    };
    let url = match (&config.redis_secret_id, &store) {
        (Some(id), Some(store)) => {
            redis_url_from_secret(&store.fetch(id).await?, config.redis_url.as_deref())
                .map_err(|e| format!("PROXY_POOL_REDIS_SECRET_ID: {e}"))?
        }
        _ => config
            .redis_url
            .clone()
            .ok_or("PROXY_POOL_REDIS_URL: is required in Lambda")?,
    };
    let registry = match (&config.clients_secret_id, store) {
        _ if !config.auth_schemes.need_registry() => RegistryHandle::default(),
        (Some(id), Some(store)) => {
            let source = RegistrySource::Secret {
                store,
                id: id.clone(),
            };
            start_registry(source, config.clients_refresh).await
        }
        _ => {
            return Err("PROXY_POOL_CLIENTS_SECRET_ID: is required when PROXY_POOL_AUTH_SCHEMES enables apiKey, basic or bearer".into());
        }
    };
    let pool = RedisPool::with_options(&url, &config.redis_options())?;
    let guard = Guard::new(config.auth_schemes, config.sources.clone(), registry);
    let app = Arc::new(App::new(config.settings(), pool.clone(), Arc::new(guard)));
    let function = Arc::new(Function::new(app, pool, &config));
    lambda_runtime::run(service_fn(move |event| {
        let function = function.clone();
        async move { function.invoke(event).await }
    }))
    .await
}
