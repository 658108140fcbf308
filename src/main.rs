//! The AWS Lambda entrypoint: builds the shared clients once per cold start,
//! then serves API Gateway events with [`proxy_pool::distribution::handle`].

use std::convert::Infallible;
use std::sync::Arc;

use lambda_http::{Error, service_fn};
use proxy_pool::config::Config;
use proxy_pool::distribution::{App, handle};
use proxy_pool::pool::RedisPool;
use proxy_pool::security::AnonymousResolver;

#[tokio::main]
async fn main() -> Result<(), Error> {
    proxy_pool::telemetry::init(true);
    let config = Config::from_env()?;
    let url = config
        .redis_url
        .clone()
        .ok_or("PROXY_POOL_REDIS_URL: is required in Lambda")?;
    let pool = RedisPool::new(&url, config.redis_timeout)?;
    let app = Arc::new(App::new(&config, pool, Arc::new(AnonymousResolver)));
    lambda_http::run(service_fn(move |request| {
        let app = app.clone();
        async move { Ok::<_, Infallible>(handle(&app, request).await) }
    }))
    .await
}
