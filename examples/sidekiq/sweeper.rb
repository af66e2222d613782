# sweeper.rb: stale claims whose job Sidekiq will never run again. With the
# default fetch a worker killed with kill -9 (OOM killer, a deploy's SIGKILL)
# loses its in-flight job for good: only the stale claim remains. Run it every
# few minutes (cron, or a scheduled job):
#
#   ruby sweeper.rb
#
# For each claim whose lease ran out (idempotency.stale_claims()):
#   policy hold                -> hand it to a person: print it (page, ticket);
#                                 nothing is re-sent until someone calls
#                                 idempotency.resolve_operation(...)
#   policy retry, skip, lookup -> re-enqueue the job; the claim applies the policy
require "pg"
require_relative "worker"

job_type = ENV.fetch("JOB_TYPE", "send_confirmation")
db = PG.connect   # the PG* environment
rows = db.exec_params("SELECT operation_key, attempt, stale_policy::text, claimed_by, stale_for::text " \
                      "FROM idempotency.stale_claims($1)", [job_type]).to_a
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
puts "sweeper: #{rows.size} stale claim(s)"
db.close
