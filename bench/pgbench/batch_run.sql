-- batch run path (the C extension): claim bs new keys in one call, then
-- complete those whose verdict is run (or verify) in a second call; two
-- transactions per batch, as a consumer that holds bs messages does.
-- Variables: n (per-client counter, -D n=0), base and stride (keys
-- base + client_id * stride + n * bs + 1 .. + bs, unique per cell), bs (the
-- batch size). The key array is built by the server (generate_series), as
-- a client would send it as one array parameter. (The claim is in a WITH
-- so that its name is in the first 128 characters pgbench -r shows.)
\set n :n + 1
\set k :base + :client_id * :stride + :n * :bs
WITH c AS (SELECT * FROM @S@.claim_operations('send_confirmation', ARRAY(SELECT 'ORD-' || (:k::bigint + g)::text FROM generate_series(1, :bs) g))) SELECT count(*) AS nrun, coalesce(array_agg(operation_key), '{}') AS ks, coalesce(array_agg(attempt), '{}') AS ats FROM c WHERE verdict IN ('run', 'verify') \gset
\if :nrun
SELECT count(*) FILTER (WHERE done) AS ndone FROM @S@.complete_operations('send_confirmation', :ks::text[], :ats::int[]) \gset
\endif
