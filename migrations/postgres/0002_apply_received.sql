-- One call writes everything the group-commit writer decided for a batch of received messages
-- (src/store/postgres/writer.rs). The batch was decided from groups read without a lock, so
-- the call first takes the batch's group locks (the advisory locks every writer of `groups`
-- holds) and checks that each stored group is still the version the decision read: its row's
-- xmin, which every UPDATE renews. A group that was not stored must still not be: its INSERT
-- fails on the row another gateway added meanwhile (and a decision that writes no group for it
-- stands as of the read, which is when it was made). If one changed, it writes nothing and
-- answers false, and the writer decides again under the locks. Otherwise it writes, takes
-- the inbox offsets last (so that the `sequences` row is held only for the inbox inserts and
-- the commit) and announces the batch to every gateway.
--
-- Run as a statement of its own, the call is its own transaction: two round trips a batch
-- (read, then this) instead of one per statement plus BEGIN and COMMIT. Each statement in a
-- VOLATILE PL/pgSQL function takes a new snapshot, so what it reads after the locks is what
-- the last holder of a lock committed. Its statements look rows up by key only: the writer's
-- connection turns off the plans that would scan a table instead (see `writer.rs`), so the
-- plans PL/pgSQL caches stay right however large the tables grow.
--
-- Inbox offsets in `i_rel` and `r_rel` count from 1 within the batch; `appended` is how many.

-- Keys compare byte by byte, as SQLite's do: cheaper in every index lookup of the hot path than
-- the database's locale, and the same order as the SQLite backend's listings.
ALTER TABLE groups ALTER COLUMN partner TYPE text COLLATE "C",
    ALTER COLUMN group_id TYPE text COLLATE "C";
ALTER TABLE buffered ALTER COLUMN partner TYPE text COLLATE "C",
    ALTER COLUMN group_id TYPE text COLLATE "C";

CREATE FUNCTION wsr_apply_received(
    k_partner text[], k_group text[], k_version bigint[],
    d_partner text[], d_group text[], d_number bigint[],
    c_partner text[], c_endpoint text[], c_soap12 boolean[], c_group text[],
    c_number bigint[], c_fault text[], c_expiry bigint[], c_next_attempt bigint[],
    f_partner text[], f_group text[], f_singleton boolean[], f_number bigint[],
    f_fault text[], f_expiry bigint[],
    u_id bigint[], u_status text[], u_deadline bigint[], u_updated_at bigint[], u_state bytea[],
    n_partner text[], n_group text[], n_channel text[], n_status text[], n_deadline bigint[],
    n_updated_at bigint[], n_source text[], n_state bytea[],
    b_partner text[], b_group text[], b_number bigint[], b_channel text[], b_topic text[],
    b_namespaces text[], b_received_at bigint[], b_expiry bigint[], b_payload bytea[],
    i_rel bigint[], i_partner text[], i_group text[], i_number bigint[], i_channel text[],
    i_topic text[], i_namespaces text[], i_received_at bigint[], i_expiry bigint[],
    i_payload bytea[],
    r_rel bigint[], r_partner text[], r_group text[], r_number bigint[],
    appended bigint,
    notify_channel text, payloads text[]
) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    before bigint;
    moved bigint;
BEGIN
    -- In hash order, as every batch takes them: two batches sharing groups wait for each
    -- other instead of deadlocking (a lock this transaction holds already is taken again).
    PERFORM pg_advisory_xact_lock(k) FROM (SELECT DISTINCT
        hashtextextended(p || chr(31) || g, 0) AS k FROM unnest(k_partner, k_group) AS t(p, g))
        AS keys ORDER BY k;
    IF EXISTS (SELECT 1 FROM unnest(k_partner, k_group, k_version) AS t(p, g, v)
               LEFT JOIN groups gr ON gr.partner = t.p AND gr.group_id = t.g
               WHERE t.v IS NOT NULL AND gr.xmin::text::bigint IS DISTINCT FROM t.v) THEN
        RETURN false;
    END IF;
    -- First, so that a group stored by another gateway since the read (a unique violation on
    -- groups_partner_group_id_key, which the writer takes for a changed group) fails the call
    -- before anything else is written; nothing of a failed call stands.
    INSERT INTO groups (partner, group_id, channel, status, next_deadline, updated_at, source,
            state_bin)
        SELECT * FROM unnest(n_partner, n_group, n_channel, n_status, n_deadline,
            n_updated_at, n_source, n_state);

    DELETE FROM buffered b USING unnest(d_partner, d_group, d_number) AS t(p, g, n)
        WHERE b.partner = t.p AND b.group_id = t.g AND b.number = t.n;
    INSERT INTO pending_callbacks (partner, endpoint, soap12, group_id, number, fault, expiry,
            next_attempt)
        SELECT * FROM unnest(c_partner, c_endpoint, c_soap12, c_group, c_number, c_fault,
            c_expiry, c_next_attempt);
    INSERT INTO message_faults (partner, group_id, singleton, number, fault, expiry)
        SELECT * FROM unnest(f_partner, f_group, f_singleton, f_number, f_fault, f_expiry)
        ON CONFLICT (partner, group_id, singleton, number) DO NOTHING;
    UPDATE groups SET status = t.status, next_deadline = t.deadline,
            updated_at = t.updated_at, state_bin = t.state
        FROM unnest(u_id, u_status, u_deadline, u_updated_at, u_state)
            AS t(id, status, deadline, updated_at, state)
        WHERE groups.id = t.id;
    INSERT INTO buffered (partner, group_id, number, channel, topic, namespaces, received_at,
            expiry, payload)
        SELECT * FROM unnest(b_partner, b_group, b_number, b_channel, b_topic, b_namespaces,
            b_received_at, b_expiry, b_payload);

    IF appended > 0 THEN
        UPDATE sequences SET last = last + appended WHERE name = 'inbox'
            RETURNING last - appended INTO before;
        INSERT INTO inbox ("offset", partner, group_id, number, channel, topic, namespaces,
                received_at, expiry, payload)
            SELECT before + o, p, g, n, ch, tp, ns, ra, ex, pl FROM unnest(i_rel, i_partner,
                i_group, i_number, i_channel, i_topic, i_namespaces, i_received_at, i_expiry,
                i_payload) AS t(o, p, g, n, ch, tp, ns, ra, ex, pl);
        WITH wanted AS (SELECT * FROM unnest(r_rel, r_partner, r_group, r_number)
                AS t(o, p, g, n)),
            released AS (DELETE FROM buffered b USING wanted w WHERE b.partner = w.p
                AND b.group_id = w.g AND b.number = w.n RETURNING b.*)
        INSERT INTO inbox ("offset", channel, topic, group_id, number, namespaces,
                received_at, expiry, partner, payload)
            SELECT before + w.o, r.channel, r.topic, r.group_id, r.number, r.namespaces,
                r.received_at, r.expiry, r.partner, r.payload
            FROM released r JOIN wanted w ON r.partner = w.p AND r.group_id = w.g
                AND r.number = w.n;
        GET DIAGNOSTICS moved = ROW_COUNT;
        IF moved <> coalesce(cardinality(r_rel), 0) THEN
            -- The group says they are buffered and they are not: refuse the batch (the
            -- writer tries each message alone, so that only the one at fault fails).
            RAISE EXCEPTION USING ERRCODE = 'WR001', MESSAGE = format(
                '%s of %s buffered messages to release are missing',
                coalesce(cardinality(r_rel), 0) - moved, coalesce(cardinality(r_rel), 0));
        END IF;
    END IF;

    PERFORM pg_notify(notify_channel, p) FROM unnest(payloads) AS p;
    RETURN true;
END;
$$;
