-- batch duplicate path (the C extension): claim bs keys that are all
-- completed, in one call (one read-only transaction); nothing to complete.
-- Variables: dupn (size of the pool DUP-1 .. DUP-dupn), bs (the batch size).
-- Random keys of the pool, like the single duplicate path's.
SELECT count(*) FILTER (WHERE verdict = 'completed') AS ndup FROM @S@.claim_operations('send_confirmation', ARRAY(SELECT 'DUP-' || (1 + floor(random() * :dupn))::int::text FROM generate_series(1, :bs) g)) \gset
