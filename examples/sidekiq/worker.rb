# The send_confirmation job on Sidekiq 6.4 or later (Debian 12: 6.4, 13: 7.3) and Redis.
#
#   ./install-gem.sh     # the gem pg-idempotency (helpers/ruby) into ./gems
#   GEM_HOME=./gems REDIS_URL=redis://127.0.0.1:6379/0 sidekiq -r ./worker.rb -c 1
#
# Job: SendConfirmation.perform_async("ORD-1001", "ada@example.test"). The
# operation key is the order reference (it names the effect), not the jid.
require "json"
require "sidekiq"
require "pg_idempotency/sidekiq"   # the gem pg-idempotency
require_relative "mail_provider"

LEASE = Float(ENV.fetch("LEASE_SECONDS", "600"))   # as in idempotency.job_types

class SendConfirmation
  include Sidekiq::Job
  include PgIdempotency::Job   # idempotency_verify? in perform (lookup policy)
  sidekiq_options queue: ENV.fetch("SIDEKIQ_QUEUE", "default"),
                  idempotency: { "job_type" => ENV.fetch("JOB_TYPE", "send_confirmation"), "lease" => LEASE,
                                 # seconds between extend_lease calls (default lease / 4)
                                 "heartbeat" => ENV["HEARTBEAT_SECONDS"]&.then { Float(_1) },
                                 # seconds a claim may wait for another transaction's
                                 # uncommitted claim of the key (default 0: in_progress at once)
                                 "claim_wait" => ENV["CLAIM_WAIT_SECONDS"]&.then { Float(_1) } }.compact

  def self.idempotency_key(order, _email) = order

  # stands in for the application's orders table: the job of an order, built
  # the same way by the publisher and by the sweeper
  def self.args_for(order) = [order, "customer-#{order.downcase}@example.test"]

  def perform(order, email)
    # verify: the provider of this example cannot be searched, so there is
    # nothing to look up (use hold, retry or skip for it)
    MailProvider.send_email(to: email, subject: "Your order #{order}", key: order)
  rescue MailProvider::Refused => e   # certainly not sent: release, retry after a backoff
    raise PgIdempotency::KnownFailure, e.message
  rescue MailProvider::RefusedForGood => e
    # certainly not sent, and never will be (say no such mailbox): the
    # operation ends here, completed with the refusal as its result; a retry
    # would only ask again. Any other error (no answer in time: sent or not?)
    # propagates and leaves the claim to its lease: the policy decides
    { "accepted" => false, "refused" => e.message }
  end
end

Sidekiq.configure_server do |config|
  # scheduled jobs (in_progress: look again after the lease) are polled this often
  PgIdempotency::SidekiqCompat.set(config, :poll_interval_average, Float(ENV["SIDEKIQ_POLL"])) if ENV["SIDEKIQ_POLL"]
  config.server_middleware do |chain|
    chain.add PgIdempotency::SidekiqMiddleware, on_verdict: lambda { |e|
      if ENV["E2E_EVENTS"]   # the end-to-end test reads these
        File.open(ENV["E2E_EVENTS"], "a") do |f|
          f.write(JSON.generate(e.merge("pid" => Process.pid, "t" => Time.now.to_f)) + "\n")
        end
      end
    }
  end
end
