# sweeper.rb: records of send_confirmation that no job will bring to a worker
# any more. Run it every few minutes (cron, or a scheduled job):
#
#   ruby sweeper.rb
#
# 1. Stale claims (idempotency.stale_claims()). With the default fetch a
#    worker killed with kill -9 (OOM killer, a deploy's SIGKILL) loses its
#    in-flight job for good: only the stale claim remains.
#      policy hold                -> hand it to a person: print it (page, ticket);
#                                    nothing is re-sent until the person calls
#                                    idempotency.resolve_operation(...)
#      policy retry, skip, lookup -> re-enqueue the job; the claim applies the policy
# 2. Released records that nobody claimed for a lease: this is how a person's
#    resolve_operation(..., 'retry') on a held or skipped record reaches a
#    worker (the held job is done: nothing would run it again), and how a
#    release whose re-enqueued job was lost is sent after all. Re-enqueued;
#    the next claim runs attempt + 1. A released record is listed again at
#    every sweep until a worker claims it; the extra copies get `completed`.
#
# The role needs EXECUTE on idempotency.stale_claims(text) and SELECT on
# idempotency.operations and idempotency.job_types (the operator grants).
require "pg"
require_relative "worker"

# released, and untouched for a lease: no worker is on it (a claim would have
# made it claimed again; the middleware's own retry after a known failure
# comes within half a lease)
RELEASED = <<~SQL
  SELECT o.operation_key, o.attempt
    FROM idempotency.operations o
    JOIN idempotency.job_types j USING (job_type)
   WHERE o.job_type = $1 AND o.status = 'released'
     AND o.heartbeat_at + j.lease <= clock_timestamp()
   ORDER BY o.heartbeat_at
SQL

job_type = ENV.fetch("JOB_TYPE", "send_confirmation")
db = PG.connect   # the PG* environment
rows = db.exec_params("SELECT operation_key, attempt, stale_policy::text, claimed_by, stale_for::text " \
                      "FROM idempotency.stale_claims($1)", [job_type]).to_a
released = db.exec_params(RELEASED, [job_type]).to_a
db.close
rows.each do |r|
  key = r["operation_key"]
  if r["stale_policy"] == "hold"
    puts "for a person: #{job_type} #{key} attempt #{r['attempt']} (claimed by #{r['claimed_by']}, " \
         "stale for #{r['stale_for']}); decide with SELECT idempotency.resolve_operation(" \
         "'#{job_type}', '#{key}', 'completed' | 'retry', 'note')"
  else
    SendConfirmation.perform_async(*SendConfirmation.args_for(key))
    puts "re-enqueued: #{job_type} #{key} attempt #{r['attempt']} (policy #{r['stale_policy']})"
  end
end
released.each do |r|
  SendConfirmation.perform_async(*SendConfirmation.args_for(r["operation_key"]))
  puts "re-enqueued: #{job_type} #{r['operation_key']} attempt #{r['attempt']} (released)"
end
puts "sweeper: #{rows.size} stale claim(s), #{released.size} released record(s)"
