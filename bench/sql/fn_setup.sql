-- bench/sql/fn_setup.sql: the job types and the side-effect table of one
-- implementation of the contract (psql variables S: its schema, SIDE: the
-- schema of its side-effect table, created here unless it exists).
CREATE SCHEMA IF NOT EXISTS :SIDE;
CREATE TABLE IF NOT EXISTS :SIDE.side_effects (
    job_type      text NOT NULL,
    operation_key text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
INSERT INTO :S.job_types (job_type, lease, stale_policy) VALUES
    ('send_confirmation', '10 minutes', 'hold'),
    ('stale_retry', '10 minutes', 'retry');
