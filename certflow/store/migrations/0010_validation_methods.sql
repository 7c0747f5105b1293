-- Validation over DNS (issue: certificates before the traffic moves), and ownership
-- (issue: a hostname belongs to one tenant, proven). The method a
-- request asked for (auto: at each attempt the first ready), the method of the open
-- order or the last attempt, and why it was chosen. Each ADD COLUMN is instant: no
-- table rewrite at 100,000 rows.
ALTER TABLE certificates
    ADD COLUMN requested_method text NOT NULL DEFAULT 'auto'
        CONSTRAINT certificates_requested_method_check
        CHECK (requested_method IN ('auto', 'http-01', 'dns-01', 'dns-persist-01')),
    ADD COLUMN validation_method text
        CONSTRAINT certificates_validation_method_check
        CHECK (validation_method IN ('http-01', 'dns-01', 'dns-persist-01')),
    ADD COLUMN validation_reason text;

ALTER TABLE certificates DROP CONSTRAINT certificates_provisioning_error_check;
ALTER TABLE certificates
    ADD CONSTRAINT certificates_provisioning_error_check CHECK (provisioning_error IN
        ('DNS_CNAME', 'DNS_CAA', 'ACME_RATE_LIMITED', 'ACME_INVALID_ORDER',
         'ACME_TEMPORARY', 'ACME_FAILED', 'ACME_REJECTED', 'HTTP01_UNREACHABLE',
         'INVALID_HOSTNAME', 'ACME_CAA', 'DNS_DELEGATION', 'DNS_PERSIST', 'DNS01_UPDATE',
         'DNS01_NOT_VISIBLE', 'OWNERSHIP_UNVERIFIED', 'ABANDONED', 'DEPARTED'));
