-- The writer's call (0002, 0009) at less CPU per batch, with the same effects and answers.
-- Measured by profiling the writer's backend under the durable response load (issue 35):
--   * `wsr_change_usage` was LANGUAGE sql, which PostgreSQL parses and plans on every call
--     (12 % of the backend's time): it is PL/pgSQL now, whose plans each session keeps;
--   * every statement ran even with no rows to write, and each costs an executor start (a
--     batch of new singletons needs four of the eleven): each now runs only when its arrays
--     have rows, and the version check only when a stored group was read;
--   * a source's row is deleted only when a change could have left it at nothing.
-- It assumes what the writer sends: the arrays of one set of rows are of one length (it looks
-- at a set's first array to skip its statement), one entry per source, no NULL.
--
-- And `wsr_change_usage` takes its rows in byte order (the column's collation) whatever order
-- it is given. Every transaction must take the `source_usage` rows it changes in one order, so
-- that two of them (the writer's batch, a purge, a sweep) wait for each other instead of
-- deadlocking (0009); that order was the caller's: the writer sorted its sources by the
-- database's default collation (`array_agg(s ORDER BY s)` over text parameters), purges and
-- sweeps by bytes (`UsageChanges`, a BTreeMap). On a database made with a locale's collation
-- the two differ ("partner:Zeta" before "partner:alpha" by bytes, after it in en_US).

CREATE OR REPLACE FUNCTION wsr_change_usage(sources text[], deltas bigint[]) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    INSERT INTO source_usage AS u (source, bytes)
        SELECT s, d FROM unnest(sources, deltas) AS t(s, d) ORDER BY s COLLATE "C"
        ON CONFLICT (source) DO UPDATE SET bytes = greatest(u.bytes + excluded.bytes, 0);
    IF 0 >= ANY(deltas) THEN
        DELETE FROM source_usage WHERE source = ANY(sources) AND bytes <= 0;
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION wsr_apply_received(
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
    usage_source text[];
    usage_delta bigint[];
BEGIN
    -- In hash order, as every batch takes them (see 0002).
    PERFORM pg_advisory_xact_lock(k) FROM (SELECT DISTINCT
        hashtextextended(p || chr(31) || g, 0) AS k FROM unnest(k_partner, k_group) AS t(p, g))
        AS keys ORDER BY k;
    -- Only stored groups have a version to check; a group not stored is checked by its
    -- INSERT, first, as in 0009.
    IF cardinality(array_remove(k_version, NULL)) > 0 THEN
        IF EXISTS (SELECT 1 FROM unnest(k_partner, k_group, k_version) AS t(p, g, v)
                   LEFT JOIN groups gr ON gr.partner = t.p AND gr.group_id = t.g
                   WHERE t.v IS NOT NULL AND gr.xmin::text::bigint IS DISTINCT FROM t.v) THEN
            RETURN false;
        END IF;
    END IF;
    IF cardinality(n_partner) > 0 THEN
        INSERT INTO groups (partner, group_id, channel, status, next_deadline, updated_at,
                source, state_bin)
            SELECT * FROM unnest(n_partner, n_group, n_channel, n_status, n_deadline,
                n_updated_at, n_source, n_state);
    END IF;
    IF cardinality(d_partner) > 0 THEN
        WITH gone AS (DELETE FROM buffered b
                USING unnest(d_partner, d_group, d_number) AS t(p, g, n)
                WHERE b.partner = t.p AND b.group_id = t.g AND b.number = t.n
                RETURNING b.source, octet_length(b.payload)::bigint AS bytes)
            SELECT array_agg(source), array_agg(bytes) INTO freed_source, freed_bytes FROM gone;
    END IF;
    IF cardinality(c_partner) > 0 THEN
        INSERT INTO pending_callbacks (partner, endpoint, soap12, group_id, number, fault,
                expiry, next_attempt)
            SELECT * FROM unnest(c_partner, c_endpoint, c_soap12, c_group, c_number, c_fault,
                c_expiry, c_next_attempt);
    END IF;
    IF cardinality(f_partner) > 0 THEN
        INSERT INTO message_faults (partner, group_id, singleton, number, fault, expiry)
            SELECT * FROM unnest(f_partner, f_group, f_singleton, f_number, f_fault, f_expiry)
            ON CONFLICT (partner, group_id, singleton, number) DO NOTHING;
    END IF;
    IF cardinality(u_id) > 0 THEN
        UPDATE groups SET status = t.status, next_deadline = t.deadline,
                updated_at = t.updated_at, state_bin = t.state
            FROM unnest(u_id, u_status, u_deadline, u_updated_at, u_state)
                AS t(id, status, deadline, updated_at, state)
            WHERE groups.id = t.id;
    END IF;
    IF cardinality(b_partner) > 0 THEN
        INSERT INTO buffered (partner, group_id, number, channel, topic, namespaces,
                received_at, expiry, payload, source)
            SELECT * FROM unnest(b_partner, b_group, b_number, b_channel, b_topic, b_namespaces,
                b_received_at, b_expiry, b_payload, b_source);
    END IF;

    IF appended > 0 THEN
        UPDATE sequences SET last = last + appended WHERE name = 'inbox'
            RETURNING last - appended INTO before;
        IF cardinality(i_rel) > 0 THEN
            INSERT INTO inbox ("offset", partner, group_id, number, channel, topic, namespaces,
                    received_at, expiry, payload, source)
                SELECT before + o, p, g, n, ch, tp, ns, ra, ex, pl, so FROM unnest(i_rel,
                    i_partner, i_group, i_number, i_channel, i_topic, i_namespaces,
                    i_received_at, i_expiry, i_payload, i_source)
                    AS t(o, p, g, n, ch, tp, ns, ra, ex, pl, so);
        END IF;
        IF cardinality(r_rel) > 0 THEN
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
            IF moved <> cardinality(r_rel) THEN
                -- As in 0009: the writer tries each message alone.
                RAISE EXCEPTION USING ERRCODE = 'WR001', MESSAGE = format(
                    '%s of %s buffered messages to release are missing',
                    cardinality(r_rel) - moved, cardinality(r_rel));
            END IF;
        END IF;
    END IF;

    -- The bytes stored per source, last and in source order (see 0009).
    SELECT array_agg(s ORDER BY s), array_agg(d ORDER BY s) INTO usage_source, usage_delta
        FROM (SELECT s, sum(d)::bigint AS d FROM (
                SELECT s, octet_length(pl)::bigint AS d
                    FROM unnest(b_source, b_payload) AS t(s, pl)
                UNION ALL
                SELECT s, octet_length(pl)::bigint FROM unnest(i_source, i_payload) AS t(s, pl)
                UNION ALL
                SELECT s, -n FROM unnest(freed_source, freed_bytes) AS t(s, n)) AS c
              WHERE s <> '' GROUP BY s) AS per_source
        WHERE d <> 0;
    IF cardinality(usage_source) > 0 THEN
        PERFORM wsr_change_usage(usage_source, usage_delta);
    END IF;

    IF cardinality(payloads) > 0 THEN
        PERFORM pg_notify(notify_channel, p) FROM unnest(payloads) AS p;
    END IF;
    RETURN true;
END;
$$;
