-- reference for the duplicate path: a plain primary-key SELECT of what a
-- claim returns, on the extension's table (same rows as c's duplicate path).
\set d random(1, :dupn)
SELECT status, attempt, result FROM @T@ WHERE job_type = 'send_confirmation' AND operation_key = 'DUP-' || :d::text;
