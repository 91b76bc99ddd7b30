-- Storage quotas per source (issue 31, D13). Every stored message says which source sent it
-- (`partner:{name}`, or the anonymous peer's address), and `source_usage` keeps the bytes each
-- source's messages take in the inbox, until consumed (settled by every subscription) or
-- purged, and in the ordered buffers: added and freed in the transaction that stores,
-- releases, discards, settles or purges them. `consumed` says an inbox message's bytes were
-- freed already (its purge frees nothing more). Messages stored before this
-- migration count for their partner; an anonymous one's address was not kept, so it counts for
-- no source. A payload's size is `octet_length`, which PostgreSQL reads from the value's
-- header without fetching a TOASTed payload.
ALTER TABLE inbox ADD COLUMN source text COLLATE "C" NOT NULL DEFAULT '',
    ADD COLUMN consumed boolean NOT NULL DEFAULT false;
ALTER TABLE buffered ADD COLUMN source text COLLATE "C" NOT NULL DEFAULT '';
UPDATE inbox SET source = 'partner:' || partner WHERE partner <> '';
UPDATE buffered b SET source = g.source FROM groups g
    WHERE g.partner = b.partner AND g.group_id = b.group_id;

CREATE TABLE source_usage (
    source text COLLATE "C" PRIMARY KEY,
    bytes  bigint NOT NULL
);
INSERT INTO source_usage (source, bytes)
    SELECT source, sum(octet_length(payload)) FROM (SELECT source, payload FROM inbox
        UNION ALL SELECT source, payload FROM buffered) AS stored
    WHERE source <> '' GROUP BY source;

-- Applies changes of the bytes stored per source, given in source order (every caller's
-- rows are then locked in one order); a source left with nothing loses its row.
CREATE FUNCTION wsr_change_usage(sources text[], deltas bigint[]) RETURNS void
LANGUAGE sql VOLATILE
AS $$
    INSERT INTO source_usage AS u (source, bytes)
        SELECT s, d FROM unnest(sources, deltas) WITH ORDINALITY AS t(s, d, i) ORDER BY i
        ON CONFLICT (source) DO UPDATE SET bytes = greatest(u.bytes + excluded.bytes, 0);
    DELETE FROM source_usage WHERE source = ANY(sources) AND bytes <= 0;
$$;

-- The writer's call, as in 0002, and it also keeps each stored message's source and
-- changes the bytes stored per source.
DROP FUNCTION wsr_apply_received;

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
    b_source text[],
    i_rel bigint[], i_partner text[], i_group text[], i_number bigint[], i_channel text[],
    i_topic text[], i_namespaces text[], i_received_at bigint[], i_expiry bigint[],
    i_payload bytea[], i_source text[],
    r_rel bigint[], r_partner text[], r_group text[], r_number bigint[],
    appended bigint,
    notify_channel text, payloads text[]
) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    before bigint;
    moved bigint;
    freed_source text[];
    freed_bytes bigint[];
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

    -- Discarded: their bytes are freed for their sources (below).
    WITH gone AS (DELETE FROM buffered b USING unnest(d_partner, d_group, d_number) AS t(p, g, n)
            WHERE b.partner = t.p AND b.group_id = t.g AND b.number = t.n
            RETURNING b.source, octet_length(b.payload)::bigint AS bytes)
        SELECT array_agg(source), array_agg(bytes) INTO freed_source, freed_bytes FROM gone;
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
            expiry, payload, source)
        SELECT * FROM unnest(b_partner, b_group, b_number, b_channel, b_topic, b_namespaces,
            b_received_at, b_expiry, b_payload, b_source);

    IF appended > 0 THEN
        UPDATE sequences SET last = last + appended WHERE name = 'inbox'
            RETURNING last - appended INTO before;
        INSERT INTO inbox ("offset", partner, group_id, number, channel, topic, namespaces,
                received_at, expiry, payload, source)
            SELECT before + o, p, g, n, ch, tp, ns, ra, ex, pl, so FROM unnest(i_rel, i_partner,
                i_group, i_number, i_channel, i_topic, i_namespaces, i_received_at, i_expiry,
                i_payload, i_source) AS t(o, p, g, n, ch, tp, ns, ra, ex, pl, so);
        WITH wanted AS (SELECT * FROM unnest(r_rel, r_partner, r_group, r_number)
                AS t(o, p, g, n)),
            released AS (DELETE FROM buffered b USING wanted w WHERE b.partner = w.p
                AND b.group_id = w.g AND b.number = w.n RETURNING b.*)
        INSERT INTO inbox ("offset", channel, topic, group_id, number, namespaces,
                received_at, expiry, partner, payload, source)
            SELECT before + w.o, r.channel, r.topic, r.group_id, r.number, r.namespaces,
                r.received_at, r.expiry, r.partner, r.payload, r.source
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

    -- The bytes stored per source, last and in source order: after the `sequences` row, so
    -- that every transaction takes these rows in one order after the locks above.
    PERFORM wsr_change_usage(array_agg(s ORDER BY s), array_agg(d ORDER BY s))
        FROM (SELECT s, sum(d)::bigint AS d FROM (
                SELECT s, octet_length(pl)::bigint AS d FROM unnest(b_source, b_payload) AS t(s, pl)
                UNION ALL
                SELECT s, octet_length(pl)::bigint FROM unnest(i_source, i_payload) AS t(s, pl)
                UNION ALL
                SELECT s, -n FROM unnest(freed_source, freed_bytes) AS t(s, n)) AS c
              WHERE s <> '' GROUP BY s) AS per_source
        WHERE d <> 0;

    PERFORM pg_notify(notify_channel, p) FROM unnest(payloads) AS p;
    RETURN true;
END;
$$;
