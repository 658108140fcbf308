//! The harness most test files start from: one real `redis-server` on a
//! free loopback port, a pool and the real handler over it, configured for
//! one test, and the ways a test reads that Redis back.

use std::collections::BTreeMap;
use std::sync::Arc;

use proxy_pool::config::Config;
use proxy_pool::distribution::App;
use proxy_pool::local::RedisServer;
use proxy_pool::pool::{NewProxy, PoolContract, RedisPool, UpsertStatus};
use proxy_pool::security::{AuthSchemes, Directory, Guard, RedisRegistry, RegistryHandle};

use super::{Reply, extract_request, get, send};

/// A real Redis, a pool over it, and the app, configured for one test.
pub struct Harness {
    pub redis: RedisServer,
    pub pool: RedisPool,
    pub app: Arc<App>,
    pub config: Config,
}

impl Harness {
    /// Default settings.
    pub async fn start() -> Self {
        Self::with_config(|_| {}).await
    }

    /// Settings adjusted by `adjust`, starting from anonymous access and no
    /// rate limits.
    pub async fn with_config(adjust: impl FnOnce(&mut Config)) -> Self {
        Self::with_registry(adjust, RegistryHandle::default()).await
    }

    /// Settings adjusted by `adjust`, with a client registry.
    pub async fn with_registry(adjust: impl FnOnce(&mut Config), registry: RegistryHandle) -> Self {
        Self::with_redis_args(&[], adjust, registry).await
    }

    /// Like [`Harness::with_registry`], the `redis-server` started with
    /// extra `--name value` arguments.
    pub async fn with_redis_args(
        args: &[&str],
        adjust: impl FnOnce(&mut Config),
        registry: RegistryHandle,
    ) -> Self {
        Self::build(args, adjust, |_| registry.into()).await
    }

    /// Settings adjusted by `adjust`, clients read from the Redis registry
    /// in the harness's own Redis (`PROXY_POOL_CLIENT_REGISTRY=redis`).
    pub async fn with_redis_registry(adjust: impl FnOnce(&mut Config)) -> Self {
        Self::build(&[], adjust, |pool| RedisRegistry::new(pool.clone()).into()).await
    }

    async fn build(
        args: &[&str],
        adjust: impl FnOnce(&mut Config),
        registry: impl FnOnce(&RedisPool) -> Directory,
    ) -> Self {
        let redis = RedisServer::start_with(args).await.expect(
            "redis-server must be installed for the tests (apt-get install -y redis-server)",
        );
        let mut config = Config {
            redis_url: Some(redis.url()),
            auth_schemes: AuthSchemes::parse("none").unwrap(),
            client_rate: None,
            ..Config::default()
        };
        adjust(&mut config);
        let pool = RedisPool::with_options(&redis.url(), &config.redis_options()).unwrap();
        let guard = Guard::new(config.auth_schemes, config.sources.clone(), registry(&pool));
        let app = Arc::new(App::new(config.settings(), pool.clone(), Arc::new(guard)));
        Self {
            redis,
            pool,
            app,
            config,
        }
    }

    /// Adds proxies through the upsert script.
    pub async fn load(&self, proxies: &[NewProxy]) -> Vec<UpsertStatus> {
        PoolContract::new(&self.pool).upsert(proxies).await.unwrap()
    }

    /// `POST /api/v1/proxies/extract` with a JSON body and extra headers.
    pub async fn extract(&self, body: &str, headers: &[(&str, &str)]) -> Reply {
        self.send(extract_request(body, headers)).await
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Reply {
        get(&self.app, path).await
    }

    /// Sends a request from 127.0.0.1 unless it carries its own peer.
    pub async fn send(&self, req: lambda_http::Request) -> Reply {
        send(&self.app, req).await
    }

    /// A raw Redis connection, for inspecting and damaging the pool.
    pub async fn redis(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.redis.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// `CONFIG SET name value` on the test's Redis.
    pub async fn config_set(&self, name: &str, value: impl redis::ToRedisArgs) {
        let mut conn = self.redis().await;
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    /// Redis's `used_memory` (`INFO memory`), bytes.
    pub async fn used_memory(&self) -> i64 {
        let mut conn = self.redis().await;
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut conn)
            .await
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// A raw connection without a response timeout, for commands that
    /// block on purpose (`DEBUG SLEEP`) or are sent while Redis is blocked.
    pub async fn admin(&self) -> redis::aio::MultiplexedConnection {
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        redis::Client::open(self.redis.url())
            .unwrap()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap()
    }

    /// No pool key carries a TTL (under a `volatile-*` eviction policy
    /// Redis evicts only keys with one); every other key (rate limits,
    /// usage counters) does. Returns the keys there are.
    pub async fn assert_pool_keys_carry_no_ttl(&self) -> Vec<String> {
        let mut conn = self.redis().await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut conn)
            .await
            .unwrap();
        for k in &keys {
            let at: i64 = redis::cmd("PEXPIRETIME")
                .arg(k)
                .query_async(&mut conn)
                .await
                .unwrap();
            let pool_key =
                proxy_pool::pool::keys::POOL.contains(&k.as_str()) || k.starts_with("{pp}:client");
            if pool_key {
                assert_eq!(at, -1, "{k} carries a TTL");
            } else {
                assert!(at > 0, "{k} carries no TTL");
            }
        }
        keys
    }

    /// Every key with its contents and expiry, in a canonical order, to
    /// prove that nothing changed (DUMP is not stable for hash tables).
    pub async fn snapshot(&self) -> BTreeMap<String, String> {
        let mut conn = self.redis().await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut conn)
            .await
            .unwrap();
        let mut out = BTreeMap::new();
        for k in keys {
            let kind: String = redis::cmd("TYPE")
                .arg(&k)
                .query_async(&mut conn)
                .await
                .unwrap();
            let contents = match kind.as_str() {
                "hash" => {
                    let m: BTreeMap<String, String> = redis::cmd("HGETALL")
                        .arg(&k)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    format!("{m:?}")
                }
                "zset" => {
                    let v: Vec<(String, f64)> = redis::cmd("ZRANGE")
                        .arg(&k)
                        .arg(0)
                        .arg(-1)
                        .arg("WITHSCORES")
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    format!("{v:?}")
                }
                _ => {
                    let dump: Vec<u8> = redis::cmd("DUMP")
                        .arg(&k)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    format!("{dump:?}")
                }
            };
            let at: i64 = redis::cmd("PEXPIRETIME")
                .arg(&k)
                .query_async(&mut conn)
                .await
                .unwrap();
            out.insert(k, format!("{kind} expires {at}: {contents}"));
        }
        out
    }
}
