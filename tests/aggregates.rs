//! Usage aggregates: the counters `lua/extract.lua` keeps in Redis, and the
//! flush that moves closed hours into a real PostgreSQL (Debian's
//! `postgresql`, one server per test, see `common/postgres.rs`), under
//! failure: PostgreSQL stopped during a flush and during extraction, a
//! flush cut between its commit and the Redis cleanup, two flushes at once.
//!
//! An hour closes by the Redis clock; the tests close one by moving its
//! hash to an earlier hour (`RENAME`), as the passing of time would.
//!
//! Over 600 lines on purpose: one surface (the counters, the flush, its
//! failures and the CLI reading them back) whose tests share one set-up
//! (PostgreSQL servers, closed hours). Another `tests/*.rs` file would be
//! another test binary to link against the library and all its
//! dependencies, tens of seconds each on the 2-core machine.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::postgres::{PASSWORD, Postgres};
use common::{Harness, certificates, close_hours, now_ms, proxies, proxy, usage_hours};
use lambda_runtime::{Context, LambdaEvent};
use proxy_pool::aggregates::{
    Aggregates, AggregatesOptions, DatabaseSource, DatabaseUrl, Dimension, FlushReport, UsageQuery,
};
use proxy_pool::config::Config;
use proxy_pool::lambda::Function;
use proxy_pool::pool::{NewProxy, keys};
use proxy_pool::security::credentials::CredentialHash;
use proxy_pool::security::{AuthSchemes, ClientRegistry, RegistryHandle};
use serde_json::json;

/// A database URL that is never contacted: counting only needs one set.
const UNUSED_DB: &str = "postgres://nobody@127.0.0.1:1/none";
/// The default retention of hourly counters in Redis.
const RETENTION_S: i64 = 168 * 3600;

/// Counting on (an aggregates database configured), anonymous callers.
fn counting(url: &str) -> impl FnOnce(&mut Config) {
    let url = DatabaseUrl::parse(url).unwrap();
    move |c| c.aggregates_database_url = Some(url)
}

/// The aggregates database at `url`, as the scheduled check uses it.
fn aggregates(url: &str) -> Aggregates {
    aggregates_with(url, None)
}

fn aggregates_with(url: &str, ca_file: Option<std::path::PathBuf>) -> Aggregates {
    Aggregates::new(
        DatabaseSource::Url(DatabaseUrl::parse(url).unwrap()),
        AggregatesOptions {
            ca_file,
            retention: Duration::from_secs(RETENTION_S as u64),
            timeout: Duration::from_secs(5),
        },
    )
}

/// Every counter field of every hour, summed over the hours.
async fn counters(h: &Harness) -> BTreeMap<String, i64> {
    let mut conn = h.redis().await;
    let mut out = BTreeMap::new();
    for hour in usage_hours(h).await {
        let fields: BTreeMap<String, i64> = redis::cmd("HGETALL")
            .arg(keys::usage_hour(hour))
            .query_async(&mut conn)
            .await
            .unwrap();
        for (f, n) in fields {
            *out.entry(f).or_default() += n;
        }
    }
    out
}

/// `usage_calls` and `usage_proxies`, summed over hours.
async fn in_postgres(pg: &Postgres) -> (BTreeMap<String, [i64; 3]>, BTreeMap<String, i64>) {
    let client = pg.client().await;
    let mut calls = BTreeMap::new();
    for row in client
        .query(
            "SELECT client_id || '|' || outcome, sum(calls)::bigint, sum(requested)::bigint, \
             sum(returned)::bigint FROM usage_calls GROUP BY 1",
            &[],
        )
        .await
        .unwrap()
    {
        calls.insert(row.get(0), [row.get(1), row.get(2), row.get(3)]);
    }
    let mut proxies = BTreeMap::new();
    for row in client
        .query(
            "SELECT client_id || '|' || upstream || '|' || protocol || '|' || region, \
             sum(proxies)::bigint FROM usage_proxies GROUP BY 1",
            &[],
        )
        .await
        .unwrap()
    {
        proxies.insert(row.get(0), row.get(1));
    }
    (calls, proxies)
}

/// Waits (polled, bounded) until `n` proxy-pool sessions wait for a lock.
async fn lock_waiters(pg: &Postgres, n: i64) {
    let client = pg.client().await;
    for _ in 0..200 {
        let row = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = 'proxy-pool' AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap();
        if row.get::<_, i64>(0) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{n} flushes never waited for the lock");
}

/// Three proxies http/shanghai/provider-a (soonest first), then two
/// socks5/beijing/provider-b.
fn two_kinds() -> Vec<NewProxy> {
    let mut all = proxies("a", 3);
    for mut p in proxies("b", 2) {
        p.protocol = "socks5".into();
        p.region = "beijing".into();
        p.upstream = "provider-b".into();
        p.expires_at += 60_000;
        p.usable_until = p.expires_at;
        all.push(p);
    }
    all
}

/// A commit of 2 with a key, a 409 shortage, a replay: 3 calls, 2 proxies.
async fn three_calls(h: &Harness) {
    let key = [("idempotency-key", "usage-key-0001")];
    assert_eq!(h.extract(r#"{"count":2}"#, &key).await.status, 200);
    let short = h
        .extract(r#"{"count":50,"fulfillment":"allOrNothing"}"#, &[])
        .await;
    assert_eq!(short.code(), "INSUFFICIENT_PROXIES");
    let replay = h.extract(r#"{"count":2}"#, &key).await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
}

/// Every outcome is counted by the extraction's own script call: commits
/// (each proxy by its upstream, protocol and region), 409 shortages and
/// replays, not key conflicts; anonymous callers under one label; each
/// hour's hash expires its retention after the hour ends.
#[tokio::test]
async fn each_outcome_is_counted_by_the_extraction_call() {
    let h = Harness::with_config(counting(UNUSED_DB)).await;
    h.load(&two_kinds()).await;
    three_calls(&h).await;
    let conflict = h
        .extract(r#"{"count":3}"#, &[("idempotency-key", "usage-key-0001")])
        .await;
    assert_eq!(conflict.code(), "IDEMPOTENCY_KEY_REUSED");
    assert_eq!(h.extract(r#"{"count":10}"#, &[]).await.ids().len(), 3);
    assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.ids().len(), 0);

    let expected: BTreeMap<String, i64> = [
        // All it asked for, from one tuple: one field says it all.
        ("f|anonymous|2|provider-a|http|shanghai", 1),
        ("c|anonymous|short|50", 1),
        ("c|anonymous|replay|2", 1),
        // Fewer than asked, from two tuples: the call, then each tuple.
        ("c|anonymous|ok|10", 1),
        ("p|anonymous|provider-a|http|shanghai", 1),
        ("p|anonymous|provider-b|socks5|beijing", 2),
        ("c|anonymous|ok|1", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(counters(&h).await, expected);

    let mut conn = h.redis().await;
    for hour in usage_hours(&h).await {
        let at: i64 = redis::cmd("PEXPIRETIME")
            .arg(keys::usage_hour(hour))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(at, (hour + 3600 + RETENTION_S) * 1000);
    }
}

/// Counting costs one HINCRBY for a call served from one (upstream,
/// protocol, region), else one for the call and one per tuple taken; an
/// EXPIREAT only when a call creates a field; no other command (`INFO
/// commandstats`).
#[tokio::test]
async fn counters_cost_one_hincrby_per_tuple() {
    let h = Harness::with_config(counting(UNUSED_DB)).await;
    // Alternating kinds, so every count=4 takes two of each.
    let mut pool = Vec::new();
    for (i, mut p) in proxies("k", 12).into_iter().enumerate() {
        if i % 2 == 1 {
            p.upstream = "provider-b".into();
        }
        pool.push(p);
    }
    h.load(&pool).await;
    assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.status, 200);
    let mut conn = h.redis().await;
    let stats = |info: String| {
        let calls = common::command_calls(&info);
        let of = |cmd: &str| calls.get(cmd).copied().unwrap_or(0);
        (of("hincrby"), of("expireat"))
    };
    let mut run = async |count: usize| {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .unwrap();
        let body = format!(r#"{{"count":{count}}}"#);
        assert_eq!(h.extract(&body, &[]).await.ids().len(), count);
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .unwrap();
        stats(info)
    };
    // count=1 from provider-b, its field new: one increment, the expiry set.
    assert_eq!(run(1).await, (1, 1));
    // count=1 from provider-a, counted before: one increment, nothing else.
    assert_eq!(run(1).await, (1, 0));
    // count=4 over both upstreams: the call and its two tuples, all new.
    assert_eq!(run(4).await, (3, 1));
    assert_eq!(run(4).await, (3, 0));
}

/// A counter hash damaged from outside (a string where the hash belongs)
/// costs its counts, never an extraction: the call commits its proxies.
#[tokio::test]
async fn a_damaged_counter_hash_never_fails_an_extraction() {
    let h = Harness::with_config(counting(UNUSED_DB)).await;
    h.load(&proxies("d", 4)).await;
    let hour = proxy_pool::pool::hour_of(now_ms() / 1000);
    let mut conn = h.redis().await;
    for k in [hour - 3600, hour, hour + 3600] {
        let _: () = redis::cmd("SET")
            .arg(keys::usage_hour(k))
            .arg("damaged")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let reply = h.extract(r#"{"count":2}"#, &[]).await;
    assert_eq!(reply.ids().len(), 2);
    for id in reply.ids() {
        assert_eq!(
            common::stored_status(&mut conn, &id).await,
            Some("EXTRACTED"),
            "{id} was handed out but is still in the pool"
        );
    }
    let kind: String = redis::cmd("TYPE")
        .arg(keys::usage_hour(hour))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kind, "string");
}

/// A closed hour moves to PostgreSQL exactly (calls, requested and
/// returned per client and outcome; proxies per upstream, protocol and
/// region); its hash leaves Redis, the open hour stays; a second flush
/// moves nothing and counts nothing twice.
#[tokio::test]
async fn a_closed_hour_moves_once() {
    let pg = Postgres::start().await;
    let h = Harness::with_config(counting(&pg.url())).await;
    h.load(&two_kinds()).await;
    three_calls(&h).await;
    let closed = close_hours(&h, 2).await;
    assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.ids().len(), 1);
    let open = usage_hours(&h).await.len() - closed.len();

    let a = aggregates(&pg.url());
    let report = a.flush(&h.pool).await;
    assert_eq!(report.error, None);
    assert_eq!(
        (report.hours_flushed as usize, report.calls_flushed),
        (closed.len(), 3)
    );
    assert_eq!(report.proxies_flushed, 2);
    assert_eq!(report.hours_open as usize, open);
    assert_eq!(
        usage_hours(&h).await.len(),
        open,
        "closed hashes left Redis"
    );

    let expected_calls = BTreeMap::from([
        ("anonymous|ok".to_owned(), [1, 2, 2]),
        ("anonymous|replay".to_owned(), [1, 2, 0]),
        ("anonymous|short".to_owned(), [1, 50, 0]),
    ]);
    let expected_proxies = BTreeMap::from([("anonymous|provider-a|http|shanghai".to_owned(), 2)]);
    assert_eq!(
        in_postgres(&pg).await,
        (expected_calls.clone(), expected_proxies.clone())
    );

    let again = a.flush(&h.pool).await;
    assert_eq!(
        (
            again.hours_flushed,
            again.hours_already_flushed,
            again.error
        ),
        (0, 0, None)
    );
    assert_eq!(in_postgres(&pg).await, (expected_calls, expected_proxies));
}

/// PostgreSQL stopped in the middle of a flush (its transaction open,
/// waiting for the ledger): nothing is committed, the counters stay in
/// Redis, marked with their totals; after a restart the next flush moves
/// them exactly once and reports nothing dropped.
#[tokio::test]
async fn postgres_stopped_during_a_flush() {
    let mut pg = Postgres::start().await;
    let h = Harness::with_config(counting(&pg.url())).await;
    h.load(&two_kinds()).await;
    three_calls(&h).await;
    let closed = close_hours(&h, 2).await;
    let a = aggregates(&pg.url());
    a.usage(&UsageQuery::default()).await.unwrap(); // the schema exists

    let locker = pg.client().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE usage_hours IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let (report, ()) = tokio::join!(a.flush(&h.pool), async {
        lock_waiters(&pg, 1).await;
        pg.stop().await;
    });
    let error = report.error.clone().expect("the flush must fail");
    assert!(error.starts_with("postgres unavailable"), "{error}");
    assert!(!error.contains(PASSWORD));
    assert_eq!(
        (report.hours_flushed, report.hours_pending as usize),
        (0, closed.len())
    );
    assert_eq!(usage_hours(&h).await, closed, "the counters stay in Redis");
    let mut conn = h.redis().await;
    let marks: BTreeMap<i64, String> = redis::cmd("HGETALL")
        .arg(keys::USAGE_UNFLUSHED)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(marks.values().cloned().collect::<Vec<_>>(), vec!["3 2"]);

    pg.restart().await;
    let report = a.flush(&h.pool).await;
    assert_eq!(report.error, None);
    assert_eq!(
        (report.hours_flushed as usize, report.hours_dropped),
        (closed.len(), 0)
    );
    let (calls, _) = in_postgres(&pg).await;
    assert_eq!(calls.values().map(|c| c[0]).sum::<i64>(), 3);
    let marks: BTreeMap<i64, String> = redis::cmd("HGETALL")
        .arg(keys::USAGE_UNFLUSHED)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(marks.is_empty());
}

/// With PostgreSQL down, extraction is untouched (every call answered and
/// counted in Redis) and the scheduled invocation stays a successful
/// health check whose flush reports the outage; once PostgreSQL is back
/// the next scheduled invocation moves every count exactly once.
#[tokio::test]
async fn postgres_down_never_touches_extraction() {
    let mut pg = Postgres::start().await;
    pg.stop().await;
    let h = Harness::with_config(counting(&pg.url())).await;
    h.load(&proxies("down", 20)).await;
    for _ in 0..10 {
        assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.ids().len(), 1);
    }
    close_hours(&h, 2).await;
    let function =
        Function::new(h.app.clone(), h.pool.clone()).with_aggregates(Some(aggregates(&pg.url())));
    let event = json!({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}});
    let summary = function
        .invoke(LambdaEvent::new(event.clone(), Context::default()))
        .await
        .unwrap();
    assert_eq!(summary["ready"], true);
    let flush: FlushReport = serde_json::from_value(summary["aggregates"].clone()).unwrap();
    assert!(flush.error.is_some(), "{summary}");
    assert_eq!((flush.hours_flushed, flush.hours_pending), (0, 1));
    assert!(!summary.to_string().contains(PASSWORD));
    assert!(
        !summary
            .to_string()
            .contains(&format!("127.0.0.1:{}", pg.port()))
    );

    pg.restart().await;
    let summary = function
        .invoke(LambdaEvent::new(event, Context::default()))
        .await
        .unwrap();
    let flush: FlushReport = serde_json::from_value(summary["aggregates"].clone()).unwrap();
    assert_eq!((flush.hours_flushed, flush.calls_flushed), (1, 10));
    assert_eq!(flush.error, None);
    let (calls, proxies) = in_postgres(&pg).await;
    assert_eq!(calls["anonymous|ok"], [10, 10, 10]);
    assert_eq!(proxies.values().sum::<i64>(), 10);
}

/// A flush cut off between its commit and the Redis cleanup (Redis
/// refuses writes at that moment and the flushing client is killed)
/// leaves the hour in Redis but claimed in PostgreSQL; the next flush
/// only forgets it: counted once.
#[tokio::test]
async fn a_flush_cut_between_commit_and_cleanup() {
    let pg = Postgres::start().await;
    let h = Harness::with_config(|c| {
        counting(&pg.url())(c);
        c.redis_timeout = Duration::from_millis(500);
    })
    .await;
    h.load(&two_kinds()).await;
    three_calls(&h).await;
    let closed = close_hours(&h, 2).await;
    let a = aggregates(&pg.url());
    a.usage(&UsageQuery::default()).await.unwrap();

    let locker = pg.client().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE usage_hours IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let mut admin = h.admin().await;
    let (report, ()) = tokio::join!(a.flush(&h.pool), async {
        lock_waiters(&pg, 1).await;
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(20_000)
            .arg("WRITE")
            .query_async(&mut admin)
            .await
            .unwrap();
        locker.batch_execute("COMMIT").await.unwrap();
    });
    // Committed, then the cleanup timed out; the flushing client dies with
    // its cleanup still queued, as a crashed process would.
    let error = report.error.clone().expect("the cleanup must fail");
    assert!(error.starts_with("redis unavailable"), "{error}");
    assert_eq!(report.hours_flushed as usize, closed.len());
    let _: () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query_async(&mut admin)
        .await
        .unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(usage_hours(&h).await, closed, "the cleanup never ran");

    let report = a.flush(&h.pool).await;
    assert_eq!(report.error, None);
    assert_eq!(
        (report.hours_flushed, report.hours_already_flushed as usize),
        (0, closed.len())
    );
    assert!(usage_hours(&h).await.is_empty());
    let (calls, proxies) = in_postgres(&pg).await;
    assert_eq!(calls.values().map(|c| c[0]).sum::<i64>(), 3);
    assert_eq!(proxies.values().sum::<i64>(), 2);
}

/// Two flushes at once (two Lambda instances, or a cron beside the
/// schedule): on a fresh database they migrate it once, and with both
/// waiting on the same hours every hour is claimed once, counted once.
#[tokio::test]
async fn two_flushes_at_once_count_each_hour_once() {
    let pg = Postgres::start().await;
    let h = Harness::with_config(counting(&pg.url())).await;
    h.load(&proxies("two", 30)).await;
    for back in [3, 5, 7] {
        for _ in 0..back {
            assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.ids().len(), 1);
        }
        close_hours(&h, back).await;
    }
    let (a, b) = (aggregates(&pg.url()), aggregates(&pg.url()));
    let everything = UsageQuery::default();
    let (ra, rb) = tokio::join!(a.usage(&everything), b.usage(&everything));
    ra.unwrap();
    rb.unwrap();
    let client = pg.client().await;
    let migrations: i64 = client
        .query_one("SELECT count(*) FROM proxy_pool_migrations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(migrations, 1);

    let locker = pg.client().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE usage_hours IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let (ra, rb, ()) = tokio::join!(a.flush(&h.pool), b.flush(&h.pool), async {
        lock_waiters(&pg, 2).await;
        locker.batch_execute("COMMIT").await.unwrap();
    });
    assert_eq!((ra.error.clone(), rb.error.clone()), (None, None));
    assert_eq!(ra.hours_flushed + rb.hours_flushed, 3, "{ra:?} {rb:?}");
    assert_eq!(ra.calls_flushed + rb.calls_flushed, 15);
    assert!(usage_hours(&h).await.is_empty());
    let ledger: i64 = client
        .query_one(
            "SELECT count(*) FROM usage_hours WHERE status = 'flushed'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(ledger, 3);
    let (calls, proxies) = in_postgres(&pg).await;
    assert_eq!(calls["anonymous|ok"], [15, 15, 15]);
    assert_eq!(proxies.values().sum::<i64>(), 15);
}

/// No proxy detail reaches PostgreSQL: after extractions by a registered
/// and an anonymous client and a flush, no value in any table (every
/// schema but the catalogs) holds a proxy's id, host, port, username or
/// password, nor the caller's address.
#[tokio::test]
async fn no_proxy_detail_reaches_postgres() {
    let pg = Postgres::start().await;
    let key = "pp_usage_detail_key_0001";
    let doc = json!({"clients": [{"id": "acme",
        "apiKeys": [CredentialHash::of(key.as_bytes()).encode()]}]});
    let registry = RegistryHandle::with(ClientRegistry::parse(&doc.to_string()).unwrap());
    let url = pg.url();
    let h = Harness::with_registry(
        |c| {
            counting(&url)(c);
            c.auth_schemes = AuthSchemes::parse("apiKey,none").unwrap();
        },
        registry,
    )
    .await;
    let details: Vec<NewProxy> = (0..6)
        .map(|i| {
            let mut p = proxy(&format!("px-DETAIL-{i:03}"));
            p.host = format!("198.51.100.{}", 170 + i);
            p.port = 47_910 + i as u16;
            p.username = Some(format!("user-DETAIL-{i}"));
            p.password = Some(format!("pass-DETAIL-{i}"));
            p.expires_at += i64::from(i) * 1000;
            p.usable_until = p.expires_at;
            p
        })
        .collect();
    h.load(&details).await;
    assert_eq!(
        h.extract(r#"{"count":3}"#, &[("x-api-key", key)])
            .await
            .ids()
            .len(),
        3
    );
    assert_eq!(h.extract(r#"{"count":3}"#, &[]).await.ids().len(), 3);
    close_hours(&h, 2).await;
    assert_eq!(aggregates(&pg.url()).flush(&h.pool).await.error, None);

    let (_, proxies) = in_postgres(&pg).await;
    assert_eq!(
        proxies,
        BTreeMap::from([
            ("acme|provider-a|http|shanghai".to_owned(), 3),
            ("anonymous|provider-a|http|shanghai".to_owned(), 3),
        ])
    );
    // Text no value may contain, and ports no value may be (a port's
    // digits may well occur inside a timestamp).
    let mut forbidden: Vec<String> = vec!["127.0.0.1".into()];
    let mut ports = Vec::new();
    for p in &details {
        forbidden.push(p.id.clone());
        forbidden.push(p.host.clone());
        forbidden.extend(p.username.clone());
        forbidden.extend(p.password.clone());
        ports.push(p.port.to_string());
    }
    let client = pg.client().await;
    let tables = client
        .query(
            "SELECT format('%I.%I', table_schema, table_name) FROM information_schema.tables \
             WHERE table_schema NOT IN ('pg_catalog', 'information_schema') \
             AND table_type = 'BASE TABLE'",
            &[],
        )
        .await
        .unwrap();
    assert!(tables.len() >= 4, "the schema's tables are scanned");
    let mut rows = 0;
    for t in tables {
        let table: String = t.get(0);
        for row in client
            .query(&format!("SELECT to_jsonb(t)::text FROM {table} t"), &[])
            .await
            .unwrap()
        {
            let text: String = row.get(0);
            let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
            rows += 1;
            for (column, value) in doc.as_object().unwrap() {
                let value = match value {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                for f in &forbidden {
                    assert!(!value.contains(f.as_str()), "{table}.{column} holds {f}");
                }
                assert!(!ports.contains(&value), "{table}.{column} is a port");
            }
        }
    }
    assert!(rows >= 5);
}

/// Counters that expire in Redis before PostgreSQL is back are not lost
/// silently: the flush that could not move them marked them with their
/// totals, and the first flush after PostgreSQL returns records the hour
/// as dropped, which `usage` reports.
#[tokio::test]
async fn hours_expired_unflushed_are_reported_dropped() {
    let mut pg = Postgres::start().await;
    pg.stop().await;
    let h = Harness::with_config(counting(&pg.url())).await;
    h.load(&proxies("drop", 10)).await;
    for _ in 0..4 {
        assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.ids().len(), 1);
    }
    let closed = close_hours(&h, 2).await;
    let a = aggregates(&pg.url());
    assert!(a.flush(&h.pool).await.error.is_some());
    let mut conn = h.redis().await;
    for hour in &closed {
        // What its TTL would do, had PostgreSQL stayed down long enough.
        let _: () = redis::cmd("DEL")
            .arg(keys::usage_hour(*hour))
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    pg.restart().await;
    let report = a.flush(&h.pool).await;
    assert_eq!(report.error, None);
    assert_eq!((report.hours_dropped, report.calls_dropped), (1, 4));
    let table = a
        .usage(&UsageQuery {
            by: vec![Dimension::Client],
            ..UsageQuery::default()
        })
        .await
        .unwrap();
    assert_eq!((table.dropped_hours, table.dropped_calls), (1, 4));
    assert!(table.rows.is_empty());
    // Reported once: the next flush finds nothing to say.
    assert_eq!(a.flush(&h.pool).await, FlushReport::default());
}

/// TLS to PostgreSQL with rustls: a server that refuses plain connections,
/// with a certificate from a private CA; trusting that CA
/// (PROXY_POOL_AGGREGATES_CA_FILE) the flush succeeds over
/// `sslmode=require`, trusting only the system's roots it is refused.
#[tokio::test]
async fn flush_over_tls_with_a_private_ca() {
    let mut pg = Postgres::start().await;
    let dir = std::env::temp_dir().join(format!("proxy-pool-pg-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key, ca) = certificates(&dir);
    let (cert, key) = (pg.give(&cert), pg.give(&key));
    let hba = pg.dir().join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(&hba, format!("hostnossl all all all reject\n{rules}")).unwrap();
    pg.configure(&[
        "ssl=on".into(),
        format!("ssl_cert_file={}", cert.display()),
        format!("ssl_key_file={}", key.display()),
    ]);
    pg.restart().await;
    let url = pg.url().replace("sslmode=disable", "sslmode=require");
    let h = Harness::with_config(counting(&url)).await;
    h.load(&proxies("tls", 4)).await;
    assert_eq!(h.extract(r#"{"count":2}"#, &[]).await.ids().len(), 2);
    close_hours(&h, 2).await;

    let untrusted = aggregates(&url).flush(&h.pool).await;
    let error = untrusted.error.expect("an unknown CA is refused");
    assert!(error.contains("TLS"), "{error}");
    assert_eq!(untrusted.hours_pending, 1);

    let trusted = aggregates_with(&url, Some(ca)).flush(&h.pool).await;
    assert_eq!(trusted.error, None);
    assert_eq!(trusted.hours_flushed, 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `proxy-pool aggregates flush` moves the hours from the command line;
/// `proxy-pool usage` prints them per client (the default), per upstream
/// and protocol on request, as a table and as JSON; neither prints the
/// database password.
#[tokio::test]
async fn the_cli_flushes_and_prints_usage() {
    let pg = Postgres::start().await;
    let h = Harness::with_config(counting(&pg.url())).await;
    h.load(&two_kinds()).await;
    three_calls(&h).await;
    assert_eq!(h.extract(r#"{"count":3}"#, &[]).await.ids().len(), 3);
    close_hours(&h, 2).await;
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_proxy-pool"))
            .args(args)
            .env("PROXY_POOL_REDIS_URL", h.redis.url())
            .env("PROXY_POOL_AGGREGATES_DATABASE_URL", pg.url())
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        );
        assert!(out.status.success(), "{args:?}: {stderr}");
        assert!(!stdout.contains(PASSWORD) && !stderr.contains(PASSWORD));
        stdout
    };
    let flushed = cli(&["aggregates", "flush"]);
    assert!(
        flushed.starts_with("flushed 1 hours (4 calls, 5 proxies)"),
        "{flushed}"
    );

    let table = cli(&["usage"]);
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines,
        vec![
            vec![
                "client",
                "calls",
                "requested",
                "returned",
                "short",
                "replays"
            ],
            vec!["anonymous", "4", "57", "5", "1", "1"],
        ],
        "{table}"
    );
    let by_upstream = cli(&[
        "usage",
        "--by",
        "upstream,protocol",
        "--since",
        "30d",
        "--json",
    ]);
    let doc: serde_json::Value = serde_json::from_str(&by_upstream).unwrap();
    assert_eq!(
        doc["rows"],
        json!([
            {"upstream": "provider-a", "protocol": "http", "proxies": 3},
            {"upstream": "provider-b", "protocol": "socks5", "proxies": 2},
        ])
    );
    let none = cli(&["usage", "--client", "acme", "--by", "hour"]);
    assert_eq!(none.lines().count(), 1, "only the header: {none}");
}
