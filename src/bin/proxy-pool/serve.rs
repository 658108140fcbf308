//! `serve`: the Lambda handler as a plain HTTP server, with the same start-up
//! as the Lambda function ([`proxy_pool::startup`]) and an embedded default:
//! without a Redis URL, a private `redis-server` with a demo pool and a demo
//! client whose API key is printed.

use std::sync::Arc;
use std::time::Duration;

use proxy_pool::clock::now_ms;
use proxy_pool::config::Config;
use proxy_pool::distribution::{App, EXTRACT_PATH};
use proxy_pool::local::{RedisServer, demo_proxies};
use proxy_pool::pool::{PoolContract, RedisPool};
use proxy_pool::security::credentials::CredentialHash;
use proxy_pool::security::{ClientRegistry, Guard};
use proxy_pool::server::ServeOptions;
use proxy_pool::startup::{self, LocalRegistry};

use crate::cli::CliResult;
use crate::cli::ServeArgs;
use crate::credentials::new_secret;

/// Runs `serve` until Ctrl-C or SIGTERM, then drains open requests.
pub async fn run(args: ServeArgs) -> CliResult {
    let mut config = Config::from_env()?;
    config.pool_name = args.pool_name.clone();
    let store = startup::secret_store(&config).await;
    let from_environment = args.redis_url.is_none();
    let configured = match args.redis_url {
        Some(url) => Some(url),
        None => startup::redis_url(&config, store.as_ref()).await?,
    };
    // The private Redis lives as long as this function: dropped, it is killed.
    let mut private = None;
    let (url, origin) = match configured {
        Some(url) => (url, "your Redis".to_owned()),
        None => {
            let server = RedisServer::start().await?;
            let url = server.url();
            // The private Redis is one server without replicas.
            config.redis_cluster = false;
            config.replica_acks = 0;
            let origin = format!(
                "a private redis-server on 127.0.0.1:{} with {} demo proxies (TEST-NET addresses)",
                server.port(),
                args.demo_size
            );
            private = Some(server);
            (url, origin)
        }
    };
    let pool = if private.is_none() && from_environment {
        startup::redis_pool(&config, store.as_ref(), &url)?
    } else {
        RedisPool::with_options(&url, &config.redis_options())?
    };
    let mut local = LocalRegistry {
        file: args.clients,
        fixed: None,
    };
    let mut demo_key = None;
    if private.is_some() {
        PoolContract::new(&pool)
            .upsert(&demo_proxies(args.demo_size, now_ms()))
            .await?;
        tokio::spawn(refresh_demo(pool.clone(), args.demo_size));
        // The demo client, unless a registry is given or none is needed.
        if config.auth_schemes.need_registry()
            && local.file.is_none()
            && config.clients_secret_id.is_none()
            && !config.clients_in_redis
        {
            let (key, registry) = demo_registry()?;
            demo_key = Some(key);
            local.fixed = Some(registry);
        }
    }
    let registry = startup::client_registry(&config, store, local, &pool).await?;
    let guard = Guard::new(config.auth_schemes, config.sources.clone(), registry);
    let app = Arc::new(App::new(config.settings(), pool, Arc::new(guard)));
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    note(format_args!(
        "proxy-pool serve: listening on http://{addr}, pool in {origin}"
    ));
    let key_header = match &demo_key {
        Some(key) => format!(" -H 'X-API-Key: {key}'"),
        None => String::new(),
    };
    note(format_args!(
        "try: curl -s -X POST http://{addr}{EXTRACT_PATH}{key_header} -H 'Content-Type: application/json' -H 'Idempotency-Key: demo-0001' -d '{{\"count\":2,\"filters\":{{\"protocols\":[\"http\"]}}}}'"
    ));
    note(format_args!("stop with Ctrl-C"));
    let options = ServeOptions {
        header_read_timeout: Duration::from_secs(args.header_read_timeout),
        idle_timeout: Duration::from_secs(args.idle_timeout),
        body_read_timeout: Duration::from_secs(args.body_read_timeout),
        max_connections: args.max_connections as usize,
    };
    proxy_pool::server::serve_with(listener, app, options, shutdown_signal()).await?;
    drop(private);
    note(format_args!("proxy-pool serve: stopped"));
    Ok(())
}

/// Prints a line for the operator. A closed standard output (`serve | head
/// -1`) does not stop the server: these lines only inform.
fn note(line: std::fmt::Arguments<'_>) {
    let _ = crate::output::line(line);
}

/// One `demo` client holding a fresh API key (returned, to be printed).
fn demo_registry() -> Result<(String, ClientRegistry), Box<dyn std::error::Error>> {
    let key = new_secret()?;
    let doc = format!(
        r#"{{"clients":[{{"id":"demo","apiKeys":["{}"]}}]}}"#,
        CredentialHash::of(key.as_bytes()).encode()
    );
    Ok((key, ClientRegistry::parse(&doc)?))
}

/// Plays the health checker for the demo pool: refreshes health and expiry
/// every minute, so the demo stays eligible for as long as serve runs.
async fn refresh_demo(pool: RedisPool, demo_size: usize) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    tick.tick().await;
    loop {
        tick.tick().await;
        if let Err(e) = PoolContract::new(&pool)
            .upsert(&demo_proxies(demo_size, now_ms()))
            .await
        {
            tracing::warn!(error = %e, "demo refresh failed");
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    eprintln!("proxy-pool serve: shutting down, finishing open requests");
}
