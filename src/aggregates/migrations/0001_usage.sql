-- Usage aggregates: hourly counters of extraction outcomes, moved here from
-- Redis by the flush. No proxy details (id, host, port, credentials) and no
-- per-extraction records: only counts by client, outcome and the proxies'
-- upstream, protocol and region.

-- The flush ledger: one row per hour ever moved (`flushed`) or found
-- expired in Redis before it could be moved (`dropped`). A flush claims an
-- hour by inserting its row in the same transaction as the hour's counters,
-- so an hour is counted once however often or concurrently it is flushed.
CREATE TABLE usage_hours (
    hour timestamptz PRIMARY KEY,
    status text NOT NULL CHECK (status IN ('flushed', 'dropped')),
    calls bigint NOT NULL,
    proxies bigint NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);

-- Calls per hour, client and outcome (ok, short: allOrNothing refused for
-- lack of inventory, replay: an Idempotency-Key replay).
CREATE TABLE usage_calls (
    hour timestamptz NOT NULL REFERENCES usage_hours (hour),
    client_id text NOT NULL,
    outcome text NOT NULL CHECK (outcome IN ('ok', 'short', 'replay')),
    calls bigint NOT NULL,
    requested bigint NOT NULL,
    returned bigint NOT NULL,
    PRIMARY KEY (hour, client_id, outcome)
);

-- Proxies handed out per hour, client, upstream, protocol and region.
CREATE TABLE usage_proxies (
    hour timestamptz NOT NULL REFERENCES usage_hours (hour),
    client_id text NOT NULL,
    upstream text NOT NULL,
    protocol text NOT NULL,
    region text NOT NULL,
    proxies bigint NOT NULL,
    PRIMARY KEY (hour, client_id, upstream, protocol, region)
);

CREATE INDEX usage_calls_by_client ON usage_calls (client_id, hour);
CREATE INDEX usage_proxies_by_client ON usage_proxies (client_id, hour);
