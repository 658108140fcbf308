//! Reading the aggregates back (`proxy-pool usage`): sums over a time
//! range, grouped by the dimensions asked for.

use super::error::AggregatesError;
use super::{Aggregates, flush};

/// What usage can be grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dimension {
    /// The hour (UTC).
    Hour,
    /// The day (UTC).
    Day,
    /// The client (`anonymous` for every anonymous caller).
    Client,
    /// How calls ended: `ok`, `short` (409, lack of inventory), `replay`.
    Outcome,
    /// The upstream of the proxies handed out.
    Upstream,
    /// Their protocol.
    Protocol,
    /// Their region.
    Region,
}

impl Dimension {
    /// Every dimension, in the order tables show them.
    pub const ALL: [Self; 7] = [
        Self::Hour,
        Self::Day,
        Self::Client,
        Self::Outcome,
        Self::Upstream,
        Self::Protocol,
        Self::Region,
    ];

    /// The name on the command line and in tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hour => "hour",
            Self::Day => "day",
            Self::Client => "client",
            Self::Outcome => "outcome",
            Self::Upstream => "upstream",
            Self::Protocol => "protocol",
            Self::Region => "region",
        }
    }

    /// Parses [`Dimension::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.as_str() == s.trim())
    }

    /// The SQL expression grouping by it (a fixed string, never input).
    fn sql(self) -> &'static str {
        match self {
            Self::Hour => "to_char(hour AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24\":00Z\"')",
            Self::Day => "to_char(hour AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
            Self::Client => "client_id",
            Self::Outcome => "outcome",
            Self::Upstream => "upstream",
            Self::Protocol => "protocol",
            Self::Region => "region",
        }
    }

    /// Whether it describes proxies (`usage_proxies`) rather than calls.
    fn of_proxies(self) -> bool {
        matches!(self, Self::Upstream | Self::Protocol | Self::Region)
    }
}

/// What to sum.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageQuery {
    /// Group by these, in this order (none: one total row).
    pub by: Vec<Dimension>,
    /// Only this client.
    pub client: Option<String>,
    /// Hours starting at or after this instant, Unix ms.
    pub since_ms: Option<i64>,
    /// Hours starting before this instant, Unix ms.
    pub until_ms: Option<i64>,
}

/// The sums, one row per group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageTable {
    /// The grouping columns.
    pub by: Vec<Dimension>,
    /// The count columns: `calls, requested, returned, short, replays` for
    /// call dimensions, `proxies` when grouping by upstream, protocol or region.
    pub counts: Vec<&'static str>,
    /// Rows: the group's values, then its counts.
    pub rows: Vec<(Vec<String>, Vec<i64>)>,
    /// Hours in the range recorded as dropped (expired in Redis unflushed;
    /// for every client: what was lost is not known by client).
    pub dropped_hours: i64,
    /// Calls lost with them.
    pub dropped_calls: i64,
}

impl Aggregates {
    /// Sums the aggregates as `query` asks. Grouping by upstream, protocol
    /// or region counts proxies and cannot be combined with `outcome`.
    pub async fn usage(&self, query: &UsageQuery) -> Result<UsageTable, AggregatesError> {
        let of_proxies = query.by.iter().any(|d| d.of_proxies());
        if of_proxies && query.by.contains(&Dimension::Outcome) {
            return Err(AggregatesError::Settings(
                "outcome groups calls; upstream, protocol and region group proxies: not both"
                    .into(),
            ));
        }
        let db = flush::bounded(
            tokio::time::Instant::now() + self.options.timeout,
            self.connect(),
        )
        .await?;
        let (table, counts): (&str, Vec<&'static str>) = if of_proxies {
            ("usage_proxies", vec!["sum(proxies)::bigint"])
        } else {
            (
                "usage_calls",
                vec![
                    "sum(calls)::bigint",
                    "sum(requested)::bigint",
                    "sum(returned)::bigint",
                    "coalesce(sum(calls) FILTER (WHERE outcome = 'short'), 0)::bigint",
                    "coalesce(sum(calls) FILTER (WHERE outcome = 'replay'), 0)::bigint",
                ],
            )
        };
        let groups: Vec<&str> = query.by.iter().map(|d| d.sql()).collect();
        let mut select: Vec<&str> = groups.clone();
        select.extend(&counts);
        let mut sql = format!(
            "SELECT {} FROM {table} WHERE ($1::text IS NULL OR client_id = $1) \
             AND ($2::bigint IS NULL OR hour >= to_timestamp($2::bigint / 1000.0)) \
             AND ($3::bigint IS NULL OR hour < to_timestamp($3::bigint / 1000.0))",
            select.join(", ")
        );
        if !groups.is_empty() {
            let positions: Vec<String> = (1..=groups.len()).map(|i| i.to_string()).collect();
            sql.push_str(&format!(" GROUP BY {0} ORDER BY {0}", positions.join(", ")));
        }
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
            [&query.client, &query.since_ms, &query.until_ms];
        let client = db.client();
        let mut rows = Vec::new();
        for row in client.query(&sql, &params).await? {
            let group: Vec<String> = (0..groups.len()).map(|i| row.get(i)).collect();
            let sums: Vec<i64> = (groups.len()..groups.len() + counts.len())
                // Without grouping, sums over no row are NULL: zero.
                .map(|i| row.get::<_, Option<i64>>(i).unwrap_or(0))
                .collect();
            rows.push((group, sums));
        }
        let dropped = client
            .query_one(
                "SELECT count(*), coalesce(sum(calls), 0)::bigint FROM usage_hours \
                 WHERE status = 'dropped' \
                 AND ($1::bigint IS NULL OR hour >= to_timestamp($1::bigint / 1000.0)) \
                 AND ($2::bigint IS NULL OR hour < to_timestamp($2::bigint / 1000.0))",
                &[&query.since_ms, &query.until_ms],
            )
            .await?;
        Ok(UsageTable {
            by: query.by.clone(),
            counts: if of_proxies {
                vec!["proxies"]
            } else {
                vec!["calls", "requested", "returned", "short", "replays"]
            },
            rows,
            dropped_hours: dropped.get(0),
            dropped_calls: dropped.get(1),
        })
    }
}
