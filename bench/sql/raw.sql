-- bench/sql/raw.sql: implementation (1), the seed's recipe in raw SQL.
--
-- The table the seed describes: one row per handled operation, unique on
-- (job type, operation key), a status (claimed | completed) and the time
-- of the claim. The recipe itself lives in the pgbench scripts
-- bench/pgbench/raw_*.sql:
--   run:  INSERT ... ON CONFLICT DO NOTHING RETURNING id  -> a row: ours
--         (the work), then UPDATE status = 'completed' WHERE id = ...
--   skip: no row returned -> read the record (status, claimed_at)
-- It has no lease configuration (the lease is written into the statement),
-- no attempt counter, no fencing, no fingerprint and no verdicts.

CREATE SCHEMA bench_raw;

CREATE TABLE bench_raw.handled_operations (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_type      text NOT NULL,
    operation_key text NOT NULL,
    status        text NOT NULL,            -- claimed | completed
    claimed_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (job_type, operation_key)
);

-- the side-effect row of the transactional path
CREATE TABLE bench_raw.side_effects (
    job_type      text NOT NULL,
    operation_key text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
