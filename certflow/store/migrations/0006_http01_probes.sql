-- Probe challenges for `starter.py check`: a random token the responder answers for
-- a hostname for a minute, so a reachability check needs no ACME order.
CREATE TABLE http01_probes (
    token               text PRIMARY KEY,
    hostname            citext NOT NULL,
    key_authorization   text NOT NULL,
    expires_at          timestamptz NOT NULL
);
