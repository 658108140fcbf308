//! What the runner asks the server holding the pool before trusting it:
//! it answers, runs a Redis the scripts support, under an eviction policy
//! that cannot take the pool's keys; and the refusals naming what is wrong.

use redis::aio::ConnectionLike;
use redis::{FromRedisValue, RedisError};

use super::connection::ScriptConnection;
use super::error::{OutageClass, PoolError};
use super::keys;

/// The oldest Redis the scripts run on (Valkey reports its Redis level):
/// they use `TIME` before writes, shebang flags, `ZMSCORE` and Functions.
const MIN_REDIS: (u32, u32) = (7, 0);
/// One `INFO` section of the server holding the pool (in a Cluster, the
/// master owning `{pp}`): read only. (One section per call: Redis before
/// 7.0, refused by name, takes no more.)
pub(super) async fn server_info(
    conn: &mut impl ScriptConnection,
    section: &str,
) -> Result<String, PoolError> {
    let mut cmd = redis::cmd("INFO");
    cmd.arg(section);
    let reply = conn.send_to_pool_node(&cmd).await?;
    Ok(String::from_redis_value(reply).map_err(RedisError::from)?)
}

/// A field of an `INFO` reply.
pub(super) fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// Refuses an `allkeys-*` eviction policy: it may evict any key, the
/// pool's records, index and idempotency records included (none of which
/// carries a TTL, so `noeviction` and every `volatile-*` policy are safe).
pub(super) fn check_eviction(info: &str) -> Result<(), PoolError> {
    match info_field(info, "maxmemory_policy") {
        Some(policy) if policy.starts_with("allkeys-") => Err(PoolError::unavailable(
            OutageClass::Eviction,
            format!(
                "maxmemory-policy is {policy}: it can evict the pool's keys; use noeviction or a volatile-* policy (docs/deploy.md)"
            ),
        )),
        _ => Ok(()),
    }
}

/// The refusal of a pool of another layout (version `pool`), naming both.
pub(super) fn layout_mismatch(pool: &str) -> PoolError {
    PoolError::unavailable(
        OutageClass::Layout,
        format!(
            "the pool records layout version {pool}; this deployment reads layout {}: deploy the version that reads it, or move the pool (docs/deploy.md)",
            keys::LAYOUT
        ),
    )
}

/// PING, repeated once when the connection turns out dead: the first attempt
/// makes the manager reconnect, the second waits for the new connection.
pub(super) async fn ping(conn: &mut (impl ConnectionLike + Send)) -> Result<(), PoolError> {
    let cmd = redis::cmd("PING");
    match cmd.query_async::<String>(conn).await {
        Err(e) if e.is_connection_dropped() || e.is_io_error() => {
            cmd.query_async::<String>(conn).await?;
        }
        other => {
            other?;
        }
    }
    Ok(())
}

/// Refuses a server older than [`MIN_REDIS`] with an error naming its
/// version, instead of letting a script fail on a missing feature.
/// Checked on readiness and before the first script; success is kept.
pub(super) fn check_version(info: &str) -> Result<(), PoolError> {
    let version = info_field(info, "redis_version").unwrap_or_default();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    let found = match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor),
        _ => (0, 0),
    };
    if found < MIN_REDIS {
        let shown = if version.is_empty() {
            "older than 7.0"
        } else {
            version
        };
        return Err(PoolError::unavailable(
            OutageClass::Version,
            format!(
                "unsupported Redis version ({shown}): the pool scripts need Redis 7.0 or later, or Valkey 7.2 or later"
            ),
        ));
    }
    Ok(())
}
