//! What the handler is built from: the [`Settings`] it takes from the
//! configuration, and the [`App`] holding everything a request needs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::config::Config;
use crate::extraction::{ExtractionService, Policy};
use crate::pool::RedisPool;
use crate::security::{IdentityResolver, Rate, RateLimiter};

/// What the handler takes from the configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The health probes' `configVersion` (`Config::version`: a digest of
    /// the settings, secrets left out).
    pub config_version: String,
    /// The rules every extraction runs under.
    pub policy: Policy,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// The limit for all callers together; `None`: off.
    pub global_rate: Option<Rate>,
    /// The limit per client unless its registry entry sets one; `None`: off.
    pub client_rate: Option<Rate>,
}

impl Config {
    /// What the HTTP handler takes from the configuration.
    pub fn settings(&self) -> Settings {
        Settings {
            config_version: self.version(),
            policy: self.policy(),
            max_body_bytes: self.max_body_bytes,
            global_rate: self.global_rate,
            client_rate: self.client_rate,
        }
    }
}

/// Everything a request needs, built once per process and shared.
pub struct App {
    pub(super) service: ExtractionService,
    pub(super) pool: RedisPool,
    pub(super) identity: Arc<dyn IdentityResolver>,
    pub(super) limiter: RateLimiter,
    pub(super) max_body_bytes: usize,
    pub(super) config_version: String,
    /// Set when extractions are counted for the aggregates (readiness
    /// then watches their flush).
    pub(super) usage_retention: Option<Duration>,
    draining: AtomicBool,
}

impl App {
    /// Wires the handler's dependencies.
    pub fn new(settings: Settings, pool: RedisPool, identity: Arc<dyn IdentityResolver>) -> Self {
        Self {
            usage_retention: settings.policy.usage_retention,
            service: ExtractionService::new(settings.policy, pool.clone()),
            limiter: RateLimiter::new(pool.clone(), settings.global_rate, settings.client_rate),
            pool,
            identity,
            max_body_bytes: settings.max_body_bytes,
            config_version: settings.config_version,
            draining: AtomicBool::new(false),
        }
    }

    /// From now on readiness and extraction answer 503 (graceful shutdown).
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Largest request body accepted.
    pub fn max_body_bytes(&self) -> usize {
        self.max_body_bytes
    }

    /// Whether [`App::start_draining`] was called.
    pub(super) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}
