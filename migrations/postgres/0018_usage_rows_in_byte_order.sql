-- Every transaction takes the `source_usage` rows it changes in one order, so that two of them
-- (the writer's batch, a purge, a sweep) wait for each other instead of deadlocking (0009).
-- That order was the caller's: the writer sorted its sources by the database's default
-- collation (`array_agg(s ORDER BY s)` over text parameters), and the purges and sweeps by byte
-- order (`UsageChanges`, a BTreeMap). On a database created with a locale's collation the two
-- differ ("partner:Zeta" before "partner:alpha" by bytes, after it in en_US), and a batch and a
-- purge could each hold a row the other waits for. The function now takes its rows in byte
-- order (the column's collation) whatever order it is given. It also assumes, as every caller
-- does, one entry per source and no NULL.
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
