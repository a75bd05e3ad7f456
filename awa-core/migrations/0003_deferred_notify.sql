-- Awa schema, version 3.
-- The insert wake-up can be deferred by the transaction (SET LOCAL awa.defer_notify = 'on'):
-- the finalizer does so while inserting follow-ups and notifies after its commit, because
-- PostgreSQL serializes the commits of all notifying transactions.
CREATE OR REPLACE FUNCTION awa.notify_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE q text;
BEGIN
    IF coalesce(current_setting('awa.defer_notify', true), '') = 'on' THEN
        RETURN NULL;
    END IF;
    FOR q IN SELECT DISTINCT n.queue FROM new_rows n WHERE n.state = 'available' LOOP
        PERFORM pg_notify(awa.queue_channel(q), '');
    END LOOP;
    RETURN NULL;
END
$$;
