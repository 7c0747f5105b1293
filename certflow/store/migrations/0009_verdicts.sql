-- The CA's verdict as Let's Encrypt gives it (issue: the CA's verdict).
--
-- ACME_CAA: the CA's own CAA check refused although ours allowed; it counts in the
-- failure budget, and no new order goes to that CA until our reading changes.
ALTER TABLE certificates DROP CONSTRAINT certificates_provisioning_error_check;
ALTER TABLE certificates
    ADD CONSTRAINT certificates_provisioning_error_check CHECK (provisioning_error IN
        ('DNS_CNAME', 'DNS_CAA', 'ACME_RATE_LIMITED', 'ACME_INVALID_ORDER',
         'ACME_TEMPORARY', 'ACME_FAILED', 'ACME_REJECTED', 'HTTP01_UNREACHABLE',
         'INVALID_HOSTNAME', 'ACME_CAA'));

-- `replaces` (RFC 9773) refusals scoped as Boulder scopes them. A CA that rejects the
-- field itself (400 malformed on a well-formed certID) is asked again after a day,
-- never switched off for good (takes_replaces is no longer read). A 500 on
-- `replaces` is temporary; since when it has failed for the certificate is kept, and
-- past an hour its renewal goes without it: no refusal blocks a renewal.
ALTER TABLE acme_accounts ADD COLUMN replaces_refused_until timestamptz;
UPDATE acme_accounts SET replaces_refused_until = now() + interval '1 day'
    WHERE NOT takes_replaces;
ALTER TABLE certificates ADD COLUMN replaces_failing_since timestamptz;

-- When the current certificate was stored (its notBefore may be backdated): a
-- certificate an hour old or less whose ARI window is already open renews once.
ALTER TABLE certificates ADD COLUMN ssl_issued_at timestamptz;

-- The change feed follows commits, not ids (certflow/store/changes.py): each event carries
-- its transaction's id. Older events keep NULL (no table rewrite); the feed starts
-- after them.
ALTER TABLE certificate_events ADD COLUMN xid xid8;
ALTER TABLE certificate_events ALTER COLUMN xid SET DEFAULT pg_current_xact_id();
CREATE INDEX certificate_events_xid ON certificate_events (xid);

-- certificate_events has a retention (certflow/store/events.py): how far a pass
-- has pruned, so the next starts there.
CREATE TABLE event_retention (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    pruned_through bigint NOT NULL DEFAULT 0
);

-- A hostname belongs to its tenant: tenant_id, once set, changes only by an explicit
-- transfer (a transaction that sets certflow.tenant_transfer = 'on'), whoever runs
-- the UPDATE (a worker, starter.py, the product's own SQL).
CREATE FUNCTION certificates_tenant_guard() RETURNS trigger AS $$
BEGIN
    IF OLD.tenant_id IS NOT NULL AND NEW.tenant_id IS DISTINCT FROM OLD.tenant_id
       AND coalesce(current_setting('certflow.tenant_transfer', true), '') <> 'on' THEN
        RAISE EXCEPTION 'the tenant of % changes only by a transfer', OLD.hostname
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER certificates_tenant_guard
    BEFORE UPDATE OF tenant_id ON certificates
    FOR EACH ROW EXECUTE FUNCTION certificates_tenant_guard();
