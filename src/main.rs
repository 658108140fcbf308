//! The AWS Lambda entrypoint: builds the shared clients once per cold start,
//! then serves every invocation with [`proxy_pool::lambda::Function`]: API
//! Gateway events through [`proxy_pool::distribution::handle`], and the
//! EventBridge scheduled health check.

use std::sync::Arc;

use lambda_runtime::{Error, service_fn};
use proxy_pool::config::Config;
use proxy_pool::distribution::App;
use proxy_pool::lambda::Function;
use proxy_pool::pool::RedisPool;
use proxy_pool::security::AnonymousResolver;

#[tokio::main]
async fn main() -> Result<(), Error> {
    proxy_pool::telemetry::init(proxy_pool::telemetry::lambda_wants_json());
    let config = Config::from_env()?;
    let url = config
        .redis_url
        .clone()
        .ok_or("PROXY_POOL_REDIS_URL: is required in Lambda")?;
    let pool = RedisPool::new(&url, config.redis_timeout)?;
    let app = Arc::new(App::new(&config, pool.clone(), Arc::new(AnonymousResolver)));
    let function = Arc::new(Function::new(app, pool, &config));
    lambda_runtime::run(service_fn(move |event| {
        let function = function.clone();
        async move { function.invoke(event).await }
    }))
    .await
}
