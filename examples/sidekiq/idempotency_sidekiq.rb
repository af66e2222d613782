# idempotency_sidekiq.rb: a Sidekiq server middleware for the claim protocol
# of the PostgreSQL extension `idempotency`.
#
#   Sidekiq.configure_server do |config|
#     config.server_middleware { |chain| chain.add Idempotency::SidekiqMiddleware }
#   end
#
#   class SendConfirmation
#     include Sidekiq::Job
#     include Idempotency::Job        # optional: idempotency_verify?, idempotency_attempt
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
# claim_operation(job type, key, fingerprint, worker, delivery, wait)
# (extension 0.3 or later);
#   run / verify        -> perform runs, a thread heartbeats extend_lease;
#                          then complete_operation; the job is done. Under
#                          verify (lookup policy) idempotency_verify? is true
#                          in perform: look the key up at the provider first
#   completed, skipped  -> done without running perform
#   in_progress         -> re-enqueued to run again after the lease (perform_in);
#                          so is a claim that hit its bound (55P03, 57014)
#   held                -> done; a person decides (resolve_operation; the
#                          sweeper then re-enqueues the released record)
# perform raising Idempotency::KnownFailure (the effect certainly did not
# happen) releases the claim and re-enqueues the job after a backoff (doubling
# with the attempt from "backoff" seconds, at most "backoff_max" and half the
# lease); any other error leaves the claim to its lease and the job to
# Sidekiq's retries. A database error of the claim itself goes to Sidekiq's
# retries too (nothing is acknowledged away).
#
# Connections: one per Sidekiq thread for the claim and the completion, and
# one per Sidekiq thread for the heartbeat, opened at the first beat. A
# connection the server closed or lost (restart, failover, an idle timeout,
# a reply lost on the way) is replaced, and the statement sent once more
# (all four calls can be repeated: complete and release are no-ops when
# repeated; the claim carries a delivery token, a uuid made for this one
# call of the middleware, so a claim repeated after a lost reply gets its
# own claim back, the same verdict and attempt, not in_progress for a lease).
# While the database cannot be reached (a PgBouncer or PostgreSQL restart,
# PgBouncer refusing logins for server_login_retry after one) the claim, the
# completion and the release are tried again after 0, 0.1, 0.2 ... 2 s for
# up to "reconnect_for" seconds (default 30, at most half the lease) before
# the job goes to Sidekiq's retries (a new token). A connection error is one
# on a connection that is no longer OK, or SQLSTATE class 08 (PgBouncer
# reports its own failures as 08P01 and closes the connection) or
# 57P01-57P03 (the server is shutting down, e.g. a backend terminated by
# pg_ctl restart -m fast, or starting up).
#
# The bound: the claim does not wait for another transaction's uncommitted
# claim of the key (a worker stuck or idle in a transaction, the
# transactional mode): "claim_wait" 0 (the default) claims with wait =>
# false and is answered in_progress at once; "claim_wait" N > 0 waits up to N
# seconds (wait => true under SET LOCAL lock_timeout) and a claim that timed
# out (55P03, or 57014 from a statement_timeout) is re-enqueued like
# in_progress. No Sidekiq thread is held by someone else's transaction.
require "digest"
require "json"
require "pg"
require "securerandom"
require "sidekiq"
require "socket"

module Idempotency
  # Sidekiq 6.4 (Debian 12) and 7 or later (Debian 13: 7.3; forky: 8.1)
  # differ here, and nowhere else this example touches: 7 moved the settings
  # from the Sidekiq module (Sidekiq.options, Sidekiq.logger=) to a
  # Sidekiq::Config (Sidekiq.default_configuration; configure_server yields
  # it, with [] and []=). Middleware, sidekiq_options, perform_async /
  # perform_in, the job hash and the retry set are the same in all.
  module SidekiqCompat
    SIDEKIQ_7 = Gem::Version.new(Sidekiq::VERSION) >= Gem::Version.new("7")   # 7 or later

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

  class KnownFailure < StandardError; end

  # include in a job class to see the claim from perform
  module Job
    attr_accessor :idempotency_attempt, :idempotency_verify

    # true when the claim's verdict was verify (lookup policy): a stale claim
    # was taken over, and the effect may have happened; look it up first
    def idempotency_verify? = !!idempotency_verify
  end

  # PG.connect("") of ruby-pg 1.4 ignores PGHOST; PG.connect does not
  def self.connect(dsn)
    dsn ? PG.connect(dsn) : PG.connect
  end

  def self.sqlstate(err)
    err.respond_to?(:result) && err.result&.error_field(PG::Result::PG_DIAG_SQLSTATE)
  end

  # the server is going away or not there yet: admin_shutdown (a fast
  # shutdown terminates the backend, even in the middle of a call),
  # crash_shutdown, cannot_connect_now
  SERVER_GONE = %w[57P01 57P02 57P03].freeze

  # an error of the connection although it may still look OK: class 08
  # (PgBouncer's own errors, 08P01, before it closes) or the server going away
  def self.connection_error?(err)
    code = sqlstate(err)
    !!code && (code.start_with?("08") || SERVER_GONE.include?(code))
  end

  # a connection that opens on first use and is replaced when it broke
  class Connection
    def initialize(dsn)
      @dsn = dsn
      @conn = nil
    end

    def exec_params(sql, params, on_reconnect: nil, within: 0)
      run(on_reconnect: on_reconnect, within: within) { |c| c.exec_params(sql, params) }
    end

    # the block with the PG::Connection; again on a new connection while the
    # connection is broken (on_reconnect is called with the error first): at
    # once, then after 0.1, 0.2 ... 2 s, until `within` seconds have passed
    # since the first error (at least once more)
    def run(on_reconnect: nil, within: 0)
      deadline = nil
      pause = 0.0
      begin
        yield pg
      rescue PG::Error => e
        raise if healthy? && !Idempotency.connection_error?(e)   # an error of the statement itself
        close                                                    # the connection broke
        now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        if deadline.nil?
          deadline = now + within
        elsif now + pause > deadline
          raise
        end
        on_reconnect&.call(e)
        sleep pause
        pause = [[pause * 2, 0.1].max, 2.0].min
        retry
      end
    end

    def healthy?
      !@conn.nil? && !@conn.finished? && @conn.status == PG::CONNECTION_OK
    end

    def close
      c, @conn = @conn, nil
      c.close if c && !c.finished?
    rescue PG::Error
      nil
    end

    private

    def pg
      unless healthy?
        close
        @conn = Idempotency.connect(@dsn)
      end
      @conn
    end
  end

  # a thread that calls the block with `conn` every `every` seconds until
  # stop. A failing beat is logged and the next one tried; nothing it raises
  # reaches the job (stop never raises).
  class Heartbeat
    def initialize(conn, every, &beat)
      @mutex = Mutex.new
      @cv = ConditionVariable.new
      @stopped = false
      @thread = Thread.new do
        Thread.current.report_on_exception = false
        loop do
          done = @mutex.synchronize { @cv.wait(@mutex, every) unless @stopped; @stopped }
          break if done
          begin
            beat.call(conn)
          rescue StandardError => e
            Sidekiq.logger.warn("heartbeat: #{e.class}: #{e.message}")
            break if Idempotency.sqlstate(e) == "ID003"   # taken over: stop beating
          end
        end
      end
    end

    def stop
      @mutex.synchronize { @stopped = true; @cv.signal }
      @thread.join
    rescue StandardError => e   # not reached: the thread rescues its errors
      Sidekiq.logger.warn("heartbeat: #{e.class}: #{e.message}")
    end
  end

  CLAIM_SQL = "SELECT verdict, attempt, result FROM idempotency.claim_operation($1, $2, $3, $4, " \
              "delivery => $5, wait => $6)"
  BUSY = %w[55P03 57014].freeze   # lock_timeout, statement_timeout: the claim hit its bound

  class SidekiqMiddleware
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
      # seconds to keep trying a call whose connection was lost
      reconnect = [(opts["reconnect_for"] || 30).to_f, lease / 2].min
      args = job["args"]
      key = (worker.class.respond_to?(:idempotency_key) ? worker.class.idempotency_key(*args) : args.first).to_s
      db = connection(:idempotency_pg)
      # one token per call of the middleware (this delivery of the job): only
      # the claim repeated after a lost connection below presents it again
      delivery = SecureRandom.uuid
      wait = (opts["claim_wait"] || 0).to_f
      params = [job_type, key, fingerprint(worker.class.name, args),
                "#{Socket.gethostname}/pid-#{Process.pid}", delivery, wait.positive?]
      lost = lambda do |e|
        Sidekiq.logger.warn("#{key}: claim_operation: #{e.message.strip}; once more on a new connection")
        notify({ "key" => key, "verdict" => "claim error", "attempt" => nil, "jid" => job["jid"],
                 "sqlstate" => "connection" }, "again")
      end
      begin
        row = db.run(on_reconnect: lost, within: reconnect) do |c|
          if wait.positive?
            c.transaction do
              c.exec_params("SELECT set_config('lock_timeout', $1, true)", ["#{[1, (wait * 1000).round].max}ms"])
              c.exec_params(CLAIM_SQL, params)
            end
          else
            c.exec_params(CLAIM_SQL, params)
          end
        end.first
      rescue PG::Error => e
        code = Idempotency.sqlstate(e)
        error = { "key" => key, "verdict" => "claim error", "attempt" => nil, "jid" => job["jid"],
                  "sqlstate" => code || "connection" }
        if BUSY.include?(code)
          # the claim hit its bound ("claim_wait"'s lock_timeout, or with
          # wait => false a lock met between its check and its write): as in_progress
          worker.class.set(queue: queue).perform_in(lease, *args)
          return notify(error.merge("retry_in" => lease), "retry")
        end
        # to Sidekiq's retries (then the dead set): ID002, other arguments
        # under the key, ends there; a lost connection heals
        notify(error, "raise")
        raise
      end
      verdict, attempt = row["verdict"], row["attempt"].to_i
      event = { "key" => key, "verdict" => verdict, "attempt" => attempt, "jid" => job["jid"] }

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
      beat = Heartbeat.new(connection(:idempotency_pg_beat), (opts["heartbeat"] || lease / 4).to_f) do |hb|
        hb.exec_params("SELECT idempotency.extend_lease($1, $2, $3)", [job_type, key, attempt])
      end
      begin
        if worker.respond_to?(:idempotency_verify=)
          worker.idempotency_attempt = attempt
          worker.idempotency_verify = verdict == "verify"
        end
        yield
      rescue KnownFailure
        beat.stop
        db.exec_params("SELECT idempotency.release_operation($1, $2, $3)", [job_type, key, attempt],
                       within: reconnect, on_reconnect: written_again(key, "release_operation"))
        # a later job claims attempt + 1; within half the lease, so that the
        # sweeper (a released record nobody claimed for a lease) does not
        # re-enqueue it too
        delay = [backoff(opts, attempt - 1), lease / 2].min
        worker.class.set(queue: queue).perform_in(delay, *args)
        return notify(event.merge("retry_in" => delay), "released")
      rescue StandardError
        notify(event, "failed")   # uncertain: the claim is left to its lease
        raise
      ensure
        beat.stop
      end
      begin
        db.exec_params("SELECT idempotency.complete_operation($1, $2, $3, $4)",
                       [job_type, key, attempt, JSON.generate({ "jid" => job["jid"] })],
                       within: reconnect, on_reconnect: written_again(key, "complete_operation"))
      rescue PG::Error => e
        unless Idempotency.sqlstate(e) == "ID003"
          # the database stayed unreachable: the claim is left to its lease
          notify(event.merge("sqlstate" => Idempotency.sqlstate(e) || "connection"), "failed")
          raise
        end
        return notify(event, "superseded")   # taken over after the lease: the new owner records it
      end
      notify(event, "completed")
    end

    private

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
