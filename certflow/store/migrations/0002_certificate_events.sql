-- Every transition of a certificate, for the product to show (issue: events).
-- Written by a trigger, so it lands in the same transaction as the transition,
-- whoever makes it (a worker, starter.py, or the product's own SQL).
CREATE TABLE certificate_events (
    id              bigserial PRIMARY KEY,
    certificate_id  uuid NOT NULL,
    hostname        citext NOT NULL,
    at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    from_status     text,
    to_status       text NOT NULL,
    error_code      text,
    message         text
);
CREATE INDEX certificate_events_hostname ON certificate_events (hostname, id);

CREATE FUNCTION certificate_events_record() RETURNS trigger AS $$
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
                 ELSE NEW.provisioning_error_message END);
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER certificate_events_record
    AFTER INSERT OR UPDATE OR DELETE ON certificates
    FOR EACH ROW EXECUTE FUNCTION certificate_events_record();
