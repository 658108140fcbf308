//! The AWS Lambda entrypoint: builds the shared clients once per cold start
//! (configuration, Secrets Manager, Redis connection, client registry, with
//! [`proxy_pool::startup`], as `proxy-pool serve` does), then serves every
//! invocation with [`proxy_pool::lambda::Function`]: API Gateway events
//! through [`proxy_pool::distribution::handle`], and the EventBridge
//! scheduled health check.

use std::sync::Arc;

use lambda_runtime::{Error, service_fn};
use proxy_pool::config::Config;
use proxy_pool::distribution::App;
use proxy_pool::lambda::Function;
use proxy_pool::security::Guard;
use proxy_pool::startup::{self, LocalRegistry};

#[tokio::main]
async fn main() -> Result<(), Error> {
    proxy_pool::telemetry::init(proxy_pool::telemetry::lambda_wants_json());
    let config = Config::from_env()?;
    let store = startup::secret_store(&config).await;
    let url = startup::redis_url(&config, store.as_ref())
        .await?
        .ok_or("PROXY_POOL_REDIS_URL: is required in Lambda")?;
    let pool = startup::redis_pool(&config, store.as_ref(), &url)?;
    let aggregates = startup::aggregates(&config, store.as_ref());
    let registry =
        startup::client_registry(&config, store, LocalRegistry::default(), &pool).await?;
    let guard = Guard::new(config.auth_schemes, config.sources.clone(), registry);
    let app = Arc::new(App::new(config.settings(), pool.clone(), Arc::new(guard)));
    let function = Arc::new(Function::new(app, pool).with_aggregates(aggregates));
    lambda_runtime::run(service_fn(move |event| {
        let function = function.clone();
        async move { function.invoke(event).await }
    }))
    .await
}
