-- More than one CA (certflow.issuers). ssl_issuer: the CA of the current certificate
-- (revocation, ARI and `replaces` go to it; renewals prefer it). order_issuer: the CA
-- of the attempt under way and of its open order, with why it was chosen when it was
-- not the first choice. NULL in both, for rows from before this migration, is the
-- first configured issuer (the one CA there was).
ALTER TABLE certificates
    ADD COLUMN ssl_issuer text,
    ADD COLUMN order_issuer text,
    ADD COLUMN order_issuer_reason text;

-- The event log names the issuer a certificate came from, and records each change
-- of the attempt's issuer that has a reason (CAA or a fallback chose it, not the
-- order of preference), in the same transaction.
CREATE OR REPLACE FUNCTION certificate_events_record() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO certificate_events (certificate_id, hostname, to_status, error_code, message)
        VALUES (NEW.id, NEW.hostname, NEW.status, NEW.provisioning_error, 'requested');
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO certificate_events (certificate_id, hostname, from_status, to_status, message)
        VALUES (OLD.id, OLD.hostname, OLD.status, 'DELETED', 'deleted');
    ELSE
        IF NEW.order_issuer IS DISTINCT FROM OLD.order_issuer
           AND NEW.order_issuer_reason IS NOT NULL THEN
            INSERT INTO certificate_events
                (certificate_id, hostname, from_status, to_status, message)
            VALUES (
                NEW.id, NEW.hostname, OLD.status, NEW.status,
                'issuer ' || NEW.order_issuer
                    || coalesce(': ' || NEW.order_issuer_reason, ''));
        END IF;
        IF NEW.status IS DISTINCT FROM OLD.status
           OR NEW.provisioning_error IS DISTINCT FROM OLD.provisioning_error
           OR NEW.provisioning_error_message IS DISTINCT FROM OLD.provisioning_error_message
           OR NEW.ssl_serial IS DISTINCT FROM OLD.ssl_serial THEN
            INSERT INTO certificate_events
                (certificate_id, hostname, from_status, to_status, error_code, message)
            VALUES (
                NEW.id, NEW.hostname, OLD.status, NEW.status, NEW.provisioning_error,
                CASE WHEN NEW.ssl_serial IS DISTINCT FROM OLD.ssl_serial
                          AND NEW.ssl_serial IS NOT NULL
                     THEN 'issued certificate ' || NEW.ssl_serial || ', expires '
                          || to_char(NEW.ssl_expires_at AT TIME ZONE 'UTC',
                                     'YYYY-MM-DD HH24:MI "UTC"')
                          || coalesce(', replacing ' || NEW.ssl_replaces, '')
                          || coalesce(', by ' || NEW.ssl_issuer, '')
                     ELSE NEW.provisioning_error_message END);
        END IF;
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;
