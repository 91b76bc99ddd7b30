-- The writer's call (0017) without the advisory locks of groups that are not stored.
--
-- A batch's locks are there so that what it decided from a group it read is still true when
-- it writes: a writer of a stored group (another gateway's batch, a sweep, a purge) holds the
-- group's lock while it writes, and the batch checks the group's version under that lock. A
-- group that was not stored has no version, and its INSERT is its check: a batch that finds
-- it stored meanwhile (by another gateway's batch, which took no lock for it either) fails on
-- the unique key and is decided again, under the locks if it held them already (the writer
-- then reads it as stored, and locks it). Its lock guarded nothing of its own, and a batch of
-- new singletons, the load that dominates, took one per message (with 0018, measured by
-- bench/postgres-cpu-per-message.sh, the backends' CPU per message fell by 3-5 % against the
-- gateway's).
--
-- Without those locks, two batches inserting the same new groups now wait on each other's
-- rows in the unique index instead of on locks; so that they wait for each other instead of
-- deadlocking, every batch inserts its new groups, and the faults it keeps (the other unique
-- key it may share with another gateway's batch), in one order: by key, in byte order. Each
-- batch takes its group locks before it inserts anything, and the row of `sequences` after.

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
    -- Only stored groups are locked (in hash order, as every batch takes them; see 0002) and
    -- have a version to check; a group not stored is checked by its INSERT, first, as in 0009.
    IF cardinality(array_remove(k_version, NULL)) > 0 THEN
        PERFORM pg_advisory_xact_lock(k) FROM (SELECT DISTINCT
            hashtextextended(p || chr(31) || g, 0) AS k
            FROM unnest(k_partner, k_group, k_version) AS t(p, g, v) WHERE v IS NOT NULL)
            AS keys ORDER BY k;
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
                n_updated_at, n_source, n_state) AS t(p, g)
            ORDER BY p COLLATE "C", g COLLATE "C";
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
                AS t(p, g, s, n)
            ORDER BY p COLLATE "C", g COLLATE "C", s, n
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
