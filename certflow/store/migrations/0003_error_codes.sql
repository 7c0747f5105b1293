-- Two more error codes (SPEC §4): ACME_REJECTED, the CA's refusal of the hostname
-- or request (terminal), and HTTP01_UNREACHABLE, the HTTP-01 self-check failing.
-- 0001 declared the CHECK on provisioning_error inline, so it has no name of ours:
-- it is found in pg_constraint by the one column it covers, dropped, and re-added
-- under a fixed name.
DO $$
DECLARE
    found record;
BEGIN
    FOR found IN
        SELECT con.conname
        FROM pg_constraint con
        JOIN pg_attribute att
          ON att.attrelid = con.conrelid AND att.attnum = con.conkey[1]
        WHERE con.conrelid = 'certificates'::regclass
          AND con.contype = 'c'
          AND cardinality(con.conkey) = 1
          AND att.attname = 'provisioning_error'
    LOOP
        EXECUTE format('ALTER TABLE certificates DROP CONSTRAINT %I', found.conname);
    END LOOP;
END
$$;

ALTER TABLE certificates
    ADD CONSTRAINT certificates_provisioning_error_check CHECK (provisioning_error IN
        ('DNS_CNAME', 'DNS_CAA', 'ACME_RATE_LIMITED', 'ACME_INVALID_ORDER',
         'ACME_TEMPORARY', 'ACME_FAILED', 'ACME_REJECTED', 'HTTP01_UNREACHABLE'));
