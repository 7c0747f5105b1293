-- ARI renewals (RFC 9773 §5): the open order's `replaces` (the certID of the
-- certificate it renews), kept with the certificate it issued, named in the
-- event of its issuance; and, per CA, whether it takes `replaces` at all.
ALTER TABLE certificates
    ADD COLUMN http_order_replaces text,
    ADD COLUMN ssl_replaces text;
ALTER TABLE acme_accounts ADD COLUMN takes_replaces boolean NOT NULL DEFAULT true;

CREATE OR REPLACE FUNCTION certificate_events_record() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO certificate_events (certificate_id, hostname, to_status, error_code, message)
        VALUES (NEW.id, NEW.hostname, NEW.status, NEW.provisioning_error, 'requested');
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO certificate_events (certificate_id, hostname, from_status, to_status, message)
        VALUES (OLD.id, OLD.hostname, OLD.status, 'DELETED', 'deleted');
    ELSIF NEW.status IS DISTINCT FROM OLD.status
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
                      || to_char(NEW.ssl_expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI "UTC"')
                      || coalesce(', replacing ' || NEW.ssl_replaces, '')
                 ELSE NEW.provisioning_error_message END);
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;
