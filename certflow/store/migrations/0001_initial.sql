-- certflow schema, version 1 (SPEC §2).
CREATE EXTENSION IF NOT EXISTS citext;

CREATE TABLE certificates (
    id                          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id                   text,
    hostname                    citext NOT NULL UNIQUE,
    status                      text NOT NULL DEFAULT 'PENDING' CHECK (status IN
                                    ('PENDING', 'PROVISIONING', 'ACTIVE', 'RENEWING',
                                     'FAILED', 'EXPIRED', 'CANCELED')),
    provisioning_error          text CHECK (provisioning_error IN
                                    ('DNS_CNAME', 'DNS_CAA', 'ACME_RATE_LIMITED',
                                     'ACME_INVALID_ORDER', 'ACME_TEMPORARY', 'ACME_FAILED')),
    provisioning_error_message  text,
    ssl_retry_count             integer NOT NULL DEFAULT 0,
    ssl_last_attempt_at         timestamptz,
    -- The open ACME order.
    http_challenge_token        text,
    http_challenge_key_auth     text,
    http_challenge_url          text,
    http_order_url              text,
    -- Key for the open order, stored (encrypted) before finalize so a crash
    -- between finalize and store cannot lose it (SPEC §5).
    pending_private_key         bytea,
    pending_key_order_url       text,
    -- The current certificate; kept while a renewal runs.
    ssl_certificate             text,
    ssl_certificate_chain       text,
    encrypted_ssl_private_key   bytea,
    ssl_serial                  text,
    ssl_order_url               text,  -- the order that issued it: makes the store idempotent
    ssl_not_before              timestamptz,
    ssl_expires_at              timestamptz,
    created_at                  timestamptz NOT NULL DEFAULT now(),
    updated_at                  timestamptz NOT NULL DEFAULT now()
);

CREATE UNIQUE INDEX certificates_challenge_token
    ON certificates (http_challenge_token) WHERE http_challenge_token IS NOT NULL;
CREATE INDEX certificates_status ON certificates (status);

CREATE TABLE custom_domains (
    domain          citext PRIMARY KEY,
    managed         boolean NOT NULL DEFAULT false,
    certificate_id  uuid REFERENCES certificates (id) ON DELETE SET NULL
);

-- One ACME account per directory URL, shared by every worker.
CREATE TABLE acme_accounts (
    directory_url           text PRIMARY KEY,
    account_url             text NOT NULL,
    encrypted_account_key   bytea NOT NULL,
    created_at              timestamptz NOT NULL DEFAULT now()
);

-- Rate-limit cooldown per CA, shared by every worker; it only ever extends.
CREATE TABLE acme_cooldowns (
    directory_url   text PRIMARY KEY,
    until           timestamptz NOT NULL,
    problem_type    text,
    detail          text,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
