-- 100,000 hostnames on one Postgres (issue: bounded forever at scale).
--
-- workflow_seen_at: written by the workflow's first step of every run, so reconcile
-- finds the rows that never had a workflow with one indexed read, not by listing
-- every running workflow.
-- ari_*: the CA's suggested renewal window (RFC 9773) as the renewal-info sweep last
-- read it, and when to ask again; the certificate's workflow sleeps to its renewal
-- time and is signalled only when the window moves.
ALTER TABLE certificates
    ADD COLUMN workflow_seen_at timestamptz,
    ADD COLUMN ari_window_start timestamptz,
    ADD COLUMN ari_window_end timestamptz,
    ADD COLUMN ari_next_check_at timestamptz;
-- Rows from before this migration had workflows (reconcile started them).
UPDATE certificates SET workflow_seen_at = updated_at WHERE status <> 'CANCELED';
UPDATE certificates SET ari_next_check_at = now() WHERE status = 'ACTIVE';

CREATE INDEX certificates_without_workflow ON certificates (created_at)
    WHERE workflow_seen_at IS NULL AND status <> 'CANCELED';
CREATE INDEX certificates_renewal_info_due ON certificates (ari_next_check_at)
    WHERE status = 'ACTIVE' AND ari_next_check_at IS NOT NULL;
CREATE INDEX certificates_soonest_expiry ON certificates (ssl_expires_at)
    WHERE status IN ('ACTIVE', 'RENEWING');
CREATE INDEX certificates_rate_limited ON certificates (hostname)
    WHERE provisioning_error = 'ACME_RATE_LIMITED';
CREATE INDEX custom_domains_certificate ON custom_domains (certificate_id);

-- One spelling per hostname, whoever inserts the row: lower case, no trailing dot
-- (what citext compares anyway, made what is stored). A U-label or an invalid
-- name is for reconcile to normalize or refuse (Python's IDNA, not plpgsql).
CREATE FUNCTION certificates_canonical_hostname() RETURNS trigger AS $$
BEGIN
    NEW.hostname := rtrim(lower(btrim(NEW.hostname::text)), '.');
    RETURN NEW;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER certificates_canonical_hostname
    BEFORE INSERT OR UPDATE OF hostname ON certificates
    FOR EACH ROW EXECUTE FUNCTION certificates_canonical_hostname();

-- A row a product inserted whose hostname is not valid is refused by reconcile
-- (CANCELED, with this code and the reason), never started.
ALTER TABLE certificates DROP CONSTRAINT certificates_provisioning_error_check;
ALTER TABLE certificates
    ADD CONSTRAINT certificates_provisioning_error_check CHECK (provisioning_error IN
        ('DNS_CNAME', 'DNS_CAA', 'ACME_RATE_LIMITED', 'ACME_INVALID_ORDER',
         'ACME_TEMPORARY', 'ACME_FAILED', 'ACME_REJECTED', 'HTTP01_UNREACHABLE',
         'INVALID_HOSTNAME'));
