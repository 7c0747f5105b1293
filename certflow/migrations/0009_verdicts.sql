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
