-- The edges `certflow edge` keeps current (issue: the edge a SaaS already runs),
-- each writing its own row every few seconds: what `status HOST` asks and reports.
-- A few rows (one per edge process), read whole: the primary key is all it needs.
CREATE TABLE edges (
    name            text PRIMARY KEY,
    kind            text NOT NULL,
    tls_address     text,
    started_at      timestamptz NOT NULL,
    heartbeat_at    timestamptz NOT NULL,
    converged_at    timestamptz,
    synced_at       timestamptz,
    held            integer NOT NULL DEFAULT 0,
    push_failures   bigint NOT NULL DEFAULT 0
);
