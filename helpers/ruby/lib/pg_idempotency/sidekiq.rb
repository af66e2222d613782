# pg_idempotency/sidekiq: a Sidekiq server middleware for the claim protocol
# of the PostgreSQL extension `idempotency` (0.3 or later), on Sidekiq 6.4,
# 7 and 8.
#
#   require "pg_idempotency/sidekiq"
#
#   Sidekiq.configure_server do |config|
#     config.server_middleware { |chain| chain.add PgIdempotency::SidekiqMiddleware }
#   end
#
#   class SendConfirmation
#     include Sidekiq::Job
#     include PgIdempotency::Job      # optional: idempotency_verify?, idempotency_attempt
#     sidekiq_options idempotency: { "job_type" => "send_confirmation", "lease" => 600 }
#                     # optional: "heartbeat" (s between extend_lease calls,
#                     # default lease / 4), "backoff", "backoff_max",
#                     # "claim_wait" (s a claim may wait for another
#                     # transaction's uncommitted claim of the key; default 0),
#                     # "reconnect_for" (s to keep trying a call whose
#                     # connection was lost; default 30, at most lease / 2)
#     def self.idempotency_key(order, _email) = order   # names the effect
#     def perform(order, email) ... end
#   end
#
# For every job of a class with the `idempotency` option:
# claim_operation(job type, key, fingerprint, worker, delivery, wait);
#   run / verify        -> perform runs, a thread heartbeats extend_lease;
#                          then complete_operation; the job is done. Under
#                          verify (lookup policy) idempotency_verify? is true
#                          in perform: look the key up at the provider first
#   completed, skipped  -> done without running perform
#   in_progress         -> re-enqueued to run again after the lease (perform_in);
#                          so is a claim that hit its bound (55P03, 57014)
#   held                -> done; a person decides (resolve_operation; a
#                          sweeper then re-enqueues the released record)
# perform raising PgIdempotency::KnownFailure (the effect certainly did not
# happen) releases the claim and re-enqueues the job after a backoff (doubling
# with the attempt from "backoff" seconds, at most "backoff_max" and half the
# lease); perform raising PgIdempotency::PermanentFailure (the provider
# refused for good) completes the operation with {"permanent_failure" =>
# reason} as its result and sends the job to Sidekiq's dead set at once, as
# a job whose retries are exhausted (a job with retry: false is raised, for
# Sidekiq to drop; a later delivery of the operation meets that result and
# ends the same way without running perform); any other error leaves the
# claim to its lease and the job to Sidekiq's retries. A database error of the claim itself goes to Sidekiq's
# retries too (nothing is acknowledged away), unless retrying cannot heal it
# (PgIdempotency.claim_error_heals? false: ID002, the key claimed with other
# arguments; class 22, bad input): then the job goes to Sidekiq's dead set at
# once, as Sidekiq kills a job whose retries are exhausted (the error fields,
# sidekiq_retries_exhausted, the death handlers; a job with retry: false is
# dropped by Sidekiq as before, one with dead: false too).
#
# Sign-off run (docs/signoff-protocol.md): with IDEMPOTENCY_SIGNOFF_JOB_TYPES
# every call uses the run's job type for yours; with IDEMPOTENCY_SIGNOFF the
# runner is asked at "claimed" (heartbeat running, just before perform;
# "fail" is handled like KnownFailure without calling perform) and at
# "handled" (perform returned, heartbeat stopped, before complete_operation).
#
# Connections (PgIdempotency::Connection): one per Sidekiq thread for the
# claim and the completion, and one per Sidekiq thread for the heartbeat,
# opened at the first beat. A lost connection is replaced and the call sent
# again for up to "reconnect_for" seconds, the claim with the same delivery
# token (a uuid made for this one call of the middleware), so a claim
# repeated after a lost reply gets its own claim back; then the job goes to
# Sidekiq's retries (a new token). See pg_idempotency.rb.
require "digest"
require "json"
require "securerandom"
require "sidekiq"
require "socket"
require "zlib"
require "pg_idempotency"

module PgIdempotency
  # Sidekiq 6.4 (Debian 12) and 7 or later (Debian 13: 7.3; forky: 8.1)
  # differ here, and nowhere else the middleware touches: 7 moved the
  # settings from the Sidekiq module (Sidekiq.options, Sidekiq.logger=) to a
  # Sidekiq::Config (Sidekiq.default_configuration; configure_server yields
  # it, with [] and []=; the death handlers with it). Middleware,
  # sidekiq_options, perform_async / perform_in, the job hash, the retry set
  # and Sidekiq::DeadSet#kill(payload, notify_failure: false) are the same in
  # all. When a job dies (JobRetry#retries_exhausted): a
  # sidekiq_retries_exhausted block may answer :discard from 7 on (7: nothing
  # more is done; 8: no dead set, the death handlers run); 8 writes the job's
  # times (failed_at, retried_at, discarded_at) in integer milliseconds, 6.4
  # and 7 in Float seconds.
  module SidekiqCompat
    SIDEKIQ_7 = Gem::Version.new(Sidekiq::VERSION) >= Gem::Version.new("7")   # 7 or later
    SIDEKIQ_8 = Gem::Version.new(Sidekiq::VERSION) >= Gem::Version.new("8")   # 8 or later

    # now, as this Sidekiq writes a time into a job hash
    def self.job_time
      SIDEKIQ_8 ? Process.clock_gettime(Process::CLOCK_REALTIME, :millisecond) : Time.now.to_f
    end

    # a test suite's Sidekiq::Testing mode is fake or inline: no Redis behind
    # the jobs (sidekiq/testing on 6.4 and 7, Sidekiq.testing! on 8)
    def self.testing?
      defined?(Sidekiq::Testing) && Sidekiq::Testing.respond_to?(:enabled?) && Sidekiq::Testing.enabled? ? true : false
    end

    # the callables Sidekiq calls with (job, error) when a job dies
    def self.death_handlers
      SIDEKIQ_7 ? Sidekiq.default_configuration.death_handlers : Sidekiq.death_handlers
    end

    # the logger of this process (client or server)
    def self.logger=(logger)
      if SIDEKIQ_7
        Sidekiq.default_configuration.logger = logger
      else
        Sidekiq.logger = logger
      end
    end

    # a setting in Sidekiq.configure_server's block: set(config, :poll_interval_average, 0.5)
    def self.set(config, key, value)
      if SIDEKIQ_7
        config[key] = value
      else
        config.options[key] = value
      end
    end
  end

  # include in a job class to see the claim from perform
  module Job
    attr_accessor :idempotency_attempt, :idempotency_verify

    # true when the claim's verdict was verify (lookup policy): a stale claim
    # was taken over, and the effect may have happened; look it up first
    def idempotency_verify? = !!idempotency_verify
  end

  class SidekiqMiddleware
    # the dead-set write: Sidekiq's own, as its JobRetry#send_to_morgue does
    DEAD_SET = lambda do |job, _error|
      require "sidekiq/api"
      Sidekiq::DeadSet.new.kill(Sidekiq.dump_json(job), notify_failure: false)
    end

    class << self
      # callable(job, error) that adds the job hash (with Sidekiq's error
      # fields) to the dead set; nil (the default) is DEAD_SET. For tests
      # without Redis: PgIdempotency::SidekiqMiddleware.dead_set = ->(job, e) { ... }
      attr_writer :dead_set

      def dead_set = @dead_set || DEAD_SET

      # false under Sidekiq::Testing (fake, inline) with the default write:
      # no Redis there, and the claim error is raised into the test, as
      # every job error is there; a dead_set of the test's own is used
      def dead_set_here? = !@dead_set.nil? || !SidekiqCompat.testing?
    end

    # options (chain.add passes them as one Hash):
    #   on_verdict: optional callable, called with a Hash per delivery
    #   dsn:        libpq connection string (default: the PG* environment)
    def initialize(options = {})
      @on_verdict = options[:on_verdict]
      @dsn = options[:dsn]
    end

    def call(worker, job, queue)
      opts = worker.class.get_sidekiq_options["idempotency"]
      return yield unless opts

      job_type = opts["job_type"] || worker.class.name
      lease = (opts["lease"] || 600).to_f
      heartbeat = (opts["heartbeat"] || lease / 4).to_f
      # a sign-off run's lease (docs/signoff-protocol.md): its timings, not production's
      if (run_lease = PgIdempotency.signoff_lease)
        lease = run_lease
        heartbeat = [heartbeat, run_lease / 4].min
      end
      # seconds to keep trying a call whose connection was lost
      reconnect = [(opts["reconnect_for"] || 30).to_f, lease / 2].min
      args = job["args"]
      key = (worker.class.respond_to?(:idempotency_key) ? worker.class.idempotency_key(*args) : args.first).to_s
      db = connection(:idempotency_pg)
      lost = lambda do |e|
        Sidekiq.logger.warn("#{key}: claim_operation: #{e.message.strip}; once more on a new connection")
        notify({ "key" => key, "verdict" => "claim error", "attempt" => nil, "jid" => job["jid"],
                 "sqlstate" => "connection" }, "again")
      end
      begin
        # one token per call of the middleware (this delivery of the job):
        # only the claim repeated after a lost connection presents it again
        # the point hello (the process's first claim) names this wrapper
        claim = PgIdempotency.signoff_wrapper("SidekiqMiddleware") do
          PgIdempotency.claim(db, job_type, key,
                              fingerprint: fingerprint(worker.class.name, args),
                              worker: "#{Socket.gethostname}/pid-#{Process.pid}",
                              delivery: SecureRandom.uuid, wait: (opts["claim_wait"] || 0).to_f,
                              reconnect_for: reconnect, on_lost: lost)
        end
      rescue PG::Error => e
        code = PgIdempotency.sqlstate(e)
        error = { "key" => key, "verdict" => "claim error", "attempt" => nil, "jid" => job["jid"],
                  "sqlstate" => code || "connection" }
        if PgIdempotency.busy?(e)
          # the claim hit its bound ("claim_wait"'s lock_timeout, or with
          # wait => false a lock met between its check and its write): as in_progress
          worker.class.set(queue: queue).perform_in(lease, *args)
          return notify(error.merge("retry_in" => lease), "retry")
        end
        # retrying cannot heal ID002 (other arguments under the key) or class
        # 22: to the dead set at once, not through the retry set (a job with
        # retry: false is Sidekiq's to drop, as before; under
        # Sidekiq::Testing without a dead_set of its own: raised, as before)
        if !PgIdempotency.claim_error_heals?(e) && retries?(worker, job) && self.class.dead_set_here?
          kill(worker, job, queue, e, key, "claim_operation: #{error['sqlstate']}", "retrying cannot heal it")
          return notify(error, "dead")
        end
        # to Sidekiq's retries (then the dead set): a lost connection, 42501,
        # ID001 ... may heal
        notify(error, "raise")
        raise
      end
      verdict, attempt = claim.verdict, claim.attempt
      event = { "key" => key, "verdict" => verdict, "attempt" => attempt, "jid" => job["jid"] }

      if verdict == "completed" && (reason = PgIdempotency.permanent_failure_of(claim.result))
        # the operation ended in a permanent failure: this delivery ends as that one did
        return permanently_failed(worker, job, queue, PermanentFailure.new(reason), key, event)
      end

      case verdict
      when "completed", "skipped", "held"
        return notify(event, "ack")
      when "in_progress"
        worker.class.set(queue: queue).perform_in(lease, *args)
        return notify(event, "retry")
      when "run", "verify"
        nil
      else
        raise "unknown verdict #{verdict}"
      end

      notify(event, "work")
      beat = Heartbeat.new(connection(:idempotency_pg_beat), heartbeat,
                           logger: Sidekiq.logger) do |hb|
        PgIdempotency.extend_lease(hb, job_type, key, attempt)
      end
      begin
        if worker.respond_to?(:idempotency_verify=)
          worker.idempotency_attempt = attempt
          worker.idempotency_verify = claim.verify?
        end
        # sign-off run: the runner may kill here, or answer fail (as if
        # perform had raised KnownFailure: released, perform not called)
        if PgIdempotency.signoff_point(:claimed, job_type, key, attempt: attempt, verdict: verdict,
                                                                heartbeat: true) == :fail
          raise KnownFailure, "sign-off runner: fail at claimed"
        end
        yield
      rescue KnownFailure
        beat.stop
        PgIdempotency.release(db, job_type, key, attempt,
                              reconnect_for: reconnect, on_lost: written_again(key, "release_operation"))
        # a later job claims attempt + 1; within half the lease, so that a
        # sweeper (a released record nobody claimed for a lease) does not
        # re-enqueue it too
        delay = [backoff(opts, attempt - 1), lease / 2].min
        worker.class.set(queue: queue).perform_in(delay, *args)
        return notify(event.merge("retry_in" => delay), "released")
      rescue PermanentFailure => e
        # refused for good: the operation ends (completed, the refusal its
        # result), the job dies without a retry (the dead set)
        beat.stop
        begin
          PgIdempotency.fail_permanently(db, job_type, key, attempt, e.message,
                                         reconnect_for: reconnect,
                                         on_lost: written_again(key, "complete_operation"),
                                         delivery: dead?(worker, job) ? DEAD_DELIVERY : DROPPED_DELIVERY)
        rescue PG::Error => x
          raise unless PgIdempotency.sqlstate(x) == "ID003"   # left to its lease, as an unknown outcome

          return notify(event, "superseded")
        end
        return permanently_failed(worker, job, queue, e, key, event)
      rescue StandardError
        notify(event, "failed")   # uncertain: the claim is left to its lease
        raise
      ensure
        beat.stop
      end
      begin
        # sign-off run: perform returned, the heartbeat stopped; the runner may kill here
        PgIdempotency.signoff_point(:handled, job_type, key, attempt: attempt, verdict: verdict, heartbeat: true)
        PgIdempotency.complete(db, job_type, key, attempt, { "jid" => job["jid"] },
                               reconnect_for: reconnect, on_lost: written_again(key, "complete_operation"))
      rescue SignoffError
        notify(event, "failed")   # the claim is left to its lease
        raise
      rescue PG::Error => e
        unless PgIdempotency.sqlstate(e) == "ID003"
          # the database stayed unreachable: the claim is left to its lease
          notify(event.merge("sqlstate" => PgIdempotency.sqlstate(e) || "connection"), "failed")
          raise
        end
        return notify(event, "superseded")   # taken over after the lease: the new owner records it
      end
      notify(event, "completed")
    end

    # the sign-off report's words for how a permanent failure ends the delivery
    DEAD_DELIVERY = "the job in Sidekiq's dead set, not retried"
    DROPPED_DELIVERY = "the job raised, with retry: false: Sidekiq drops it, not retried"

    private

    # a permanent failure goes to the dead set here (else it is raised)
    def dead?(worker, job) = retries?(worker, job) && self.class.dead_set_here?

    # the delivery of an operation that ended in a permanent failure: to the
    # dead set at once (as kill does), or raised where the dead set is not
    # this middleware's (retry: false, Sidekiq::Testing without a dead_set)
    def permanently_failed(worker, job, queue, err, key, event)
      unless dead?(worker, job)
        notify(event, "failed permanently")
        raise err
      end
      kill(worker, job, queue, err, key, "PermanentFailure", "the provider refused for good")
      notify(event, "dead")
    end

    # Sidekiq would retry the job if it raised (JobRetry#local: the job's
    # "retry", else its class's)
    def retries?(worker, job)
      retry_opt = job["retry"]
      retry_opt = worker.class.get_sidekiq_options["retry"] if retry_opt.nil?
      !!retry_opt   # retry: 0 too: Sidekiq's retries are exhausted at once
    end

    # the job dies now, as JobRetry does it when the retries are exhausted
    # (process_retry's fields, then retries_exhausted): the error's fields
    # in the job hash, the class's sidekiq_retries_exhausted block, the dead
    # set (unless dead: false, or the block answered :discard: 7 does nothing
    # more, 8 still calls the death handlers), the death handlers. The job is
    # not raised: Sidekiq acknowledges it
    def kill(worker, job, queue, err, key, what_failed, why)
      msg = job.dup
      now = SidekiqCompat.job_time
      msg["queue"] = msg["retry_queue"] || queue
      msg["error_message"] = begin
        err.message.to_s[0, 10_000].dup.force_encoding("utf-8").scrub
      rescue StandardError
        +"!!! ERROR MESSAGE THREW AN ERROR !!!"
      end
      msg["error_class"] = err.class.name
      if msg["retry_count"]
        msg["retried_at"] = now
        msg["retry_count"] += 1
      else
        msg["failed_at"] = now
        msg["retry_count"] = 0
      end
      if msg["backtrace"] && err.backtrace
        lines = msg["backtrace"] == true ? err.backtrace : err.backtrace[0...msg["backtrace"].to_i]
        msg["error_backtrace"] = [Zlib::Deflate.deflate(Sidekiq.dump_json(lines))].pack("m0")
      end
      rv = begin
        block = worker.respond_to?(:sidekiq_retries_exhausted_block) ? worker.sidekiq_retries_exhausted_block : nil
        block&.call(msg, err)
      rescue StandardError => x
        Sidekiq.logger.warn("#{key}: sidekiq_retries_exhausted: #{x.class}: #{x.message}")
        nil
      end
      discard = SidekiqCompat::SIDEKIQ_7 && rv == :discard   # 6.4 ignores the block's answer
      if discard || msg["dead"] == false
        what = discard ? "discarded (sidekiq_retries_exhausted)" : "dropped (dead: false)"
        msg["discarded_at"] = now if SidekiqCompat::SIDEKIQ_8
      else
        self.class.dead_set.call(msg, err)
        what = "sent to the dead set"
      end
      Sidekiq.logger.error("#{key}: #{what_failed}: #{PgIdempotency.error_message(err)}; #{what}: #{why}")
      return if discard && !SidekiqCompat::SIDEKIQ_8   # 7: poof, no death handlers

      SidekiqCompat.death_handlers.each do |handler|
        handler.call(msg, err)
      rescue StandardError => x
        Sidekiq.logger.warn("#{key}: death handler: #{x.class}: #{x.message}")
      end
    end

    def written_again(key, function)
      ->(e) { Sidekiq.logger.warn("#{key}: #{function}: #{e.message.strip}; once more on a new connection") }
    end

    def fingerprint(klass, args)
      "sha256:" + Digest::SHA256.hexdigest(JSON.generate([klass, args]))
    end

    # seconds before try n + 1: backoff * 2**n, at most backoff_max, with
    # jitter (between half and all of it)
    def backoff(opts, n)
      d = [(opts["backoff"] || 1).to_f * 2**[n, 32].min, (opts["backoff_max"] || 60).to_f].min
      d / 2 + rand * d / 2
    end

    # one per Sidekiq thread (a thread runs one job at a time)
    def connection(name)
      Thread.current[name] ||= Connection.new(@dsn)
    end

    def notify(event, action)
      e = event.merge("action" => action)
      Sidekiq.logger.info("#{e['key']}: #{e['verdict']} ##{e['attempt']} -> #{action}")
      @on_verdict&.call(e)
      nil
    end
  end
end
