# worker.rb: the catalogue's refund job in Ruby on the wrapper instead of the
# plain calls (test/catalogue/README.md): a Sidekiq job class behind
# pg-idempotency's PgIdempotency::SidekiqMiddleware, called for each message
# of the directory queue of test/signoff/dirqueue.py as Sidekiq's processor
# calls a server middleware: call(job instance, the job hash, queue) { perform }.
# No Redis: Sidekiq::Testing's fake mode keeps the jobs the middleware
# schedules (perform_in: an in_progress claim after the lease, a released one
# after its backoff), and this loop puts each back into the directory queue,
# due when Sidekiq would run it. The job has retry: false (this loop has no
# retry set): a claim error that cannot heal (ID002: other arguments under
# the key) is raised by the middleware, not sent to the dead set, so no
# Redis is needed, and the job is dropped, as Sidekiq drops a job with
# retry: false. (A job with retries would go to the dead set at once, in
# Redis; under Sidekiq::Testing the middleware raises instead, unless
# PgIdempotency::SidekiqMiddleware.dead_set is set.)
#
#   ruby -I ../../helpers/ruby/lib sidekiq/worker.rb
require "json"
require "net/http"
require "securerandom"
require "sidekiq"
require "sidekiq/testing"
require "pg_idempotency/sidekiq"
require_relative "../ruby/dirqueue"
require_relative "../ruby/refund"

JOB = "catalogue_refund"
$stderr.sync = true
$stdout.sync = true
Sidekiq::Testing.fake!   # perform_in pushes to Refund.jobs, not to Redis

# with IDEMPOTENCY_SIGNOFF_HTTP (effect = http) the refund is a POST to the
# provider, whose answers the job tells apart as docs/signoff.md says: 503 or
# a refused connection a KnownFailure, 422 a PermanentFailure (the operation
# ends, the job goes to the dead set: here a directory), no answer within 5 s
# an unknown outcome (raised). Then the job has Sidekiq's retries (retry:
# true) and the middleware a dead set of this loop's own, without Redis;
# else retry: false, as above.
HTTP = ENV["IDEMPOTENCY_SIGNOFF_HTTP"].then { |u| u.nil? || u.empty? ? nil : u }
RETRY = !HTTP.nil?

def refund_at(key)
  uri = URI("#{HTTP}/refunds/#{key}")
  res = Net::HTTP.start(uri.host, uri.port, open_timeout: 5, read_timeout: 5) do |http|
    http.post(uri.path, '{"amount_cents": 1250}', "Idempotency-Key" => key, "Content-Type" => "application/json")
  end
  return { "status" => res.code.to_i } if res.code.to_i.between?(200, 299)
  raise PgIdempotency::PermanentFailure, "provider answered #{res.code}" if res.code.to_i == 422

  raise PgIdempotency::KnownFailure, "provider answered #{res.code}"
rescue Errno::ECONNREFUSED => e
  raise PgIdempotency::KnownFailure, "provider unreachable: #{e.message}"
end

def log(msg) = warn("#{Time.now.utc.strftime('%H:%M:%S.%L')} refund worker #{Process.pid}: #{msg}")

# the refund job, as a Sidekiq application writes it
class Refund
  include Sidekiq::Job
  include PgIdempotency::Job
  sidekiq_options retry: RETRY, idempotency: { "job_type" => JOB, "lease" => 300 }

  def self.idempotency_key(key, _args) = key

  def perform(key, _args)
    return refund_at(key) if HTTP
    dir = spool
    # lookup (verdict verify): the provider's own record first, here the effects file
    return { "found" => true } if idempotency_verify? && refunded?(dir, key)

    refund_to_file(dir, key, idempotency_attempt)
  end
end

stopping = false
Signal.trap("TERM") { stopping = true }   # as Sidekiq: the job in hand is finished
dir = spool
mine = register(dir)
dsn = ENV["IDEMPOTENCY_SIGNOFF_DSN"].then { |d| d.nil? || d.empty? ? nil : d }   # nil: the PG* variables
middleware = PgIdempotency::SidekiqMiddleware.new(dsn: dsn)
if RETRY
  # the dead set, as a directory of the spool (no Redis): what the middleware kills lands there
  FileUtils.mkdir_p(File.join(dir, "dead"))
  PgIdempotency::SidekiqMiddleware.dead_set = lambda do |job, err|
    File.write(File.join(dir, "dead", job["jid"]), JSON.generate(job))
    log("#{job['args'][0]}: to the dead set: #{err.class}: #{err.message}")
  end
end
log("started (Sidekiq #{Sidekiq::VERSION}, the middleware); lease #{PgIdempotency.signoff_lease || 300} s")
each_message(dir, mine, -> { stopping }) do |path, message|
  # the job hash as Sidekiq's fetch gives it to the middleware
  job = { "class" => "Refund", "args" => [message["key"], message["args"]], "jid" => SecureRandom.hex(12),
          "queue" => "default", "retry" => RETRY, "created_at" => Time.now.to_f, "enqueued_at" => Time.now.to_f }
  worker = Refund.new
  worker.jid = job["jid"]
  begin
    middleware.call(worker, job, "default") { worker.perform(*job["args"]) }
  rescue StandardError => e                 # retry: false: the job is gone
    log("#{message['key']} failed: #{e.class}: #{e.message.lines.first&.strip}")
  end
  File.unlink(path) if File.exist?(path)
  # what the middleware scheduled with perform_in, due when Sidekiq would run it
  Refund.jobs.each do |j|
    put(dir, { "key" => j["args"][0], "args" => j["args"][1] }, [j.fetch("at", 0).to_f - Time.now.to_f, 0].max)
  end
  Refund.clear
end
log("stopped (SIGTERM)")
