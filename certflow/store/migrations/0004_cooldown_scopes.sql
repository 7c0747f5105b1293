-- Rate-limit cooldowns scoped as the CA scopes its limits (SPEC §4): the account,
-- one registered domain, or one hostname, and per limit, so that the limits a
-- renewal is exempt from can be told apart from those that still hold it. A
-- cooldown from before this migration covered the whole CA: it becomes an
-- account-wide one of an unknown limit (which holds everything, as it did).
ALTER TABLE acme_cooldowns
    ADD COLUMN scope text NOT NULL DEFAULT 'account'
        CHECK (scope IN ('account', 'registered_domain', 'hostname')),
    ADD COLUMN scope_key text NOT NULL DEFAULT '',
    ADD COLUMN limit_name text NOT NULL DEFAULT 'Unknown';
ALTER TABLE acme_cooldowns DROP CONSTRAINT acme_cooldowns_pkey;
ALTER TABLE acme_cooldowns ADD PRIMARY KEY (directory_url, scope, scope_key, limit_name);
ALTER TABLE acme_cooldowns ALTER COLUMN scope DROP DEFAULT, ALTER COLUMN scope_key DROP DEFAULT,
    ALTER COLUMN limit_name DROP DEFAULT;
CREATE INDEX acme_cooldowns_until ON acme_cooldowns (until);
