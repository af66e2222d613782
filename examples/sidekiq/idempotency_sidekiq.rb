# idempotency_sidekiq.rb: a Sidekiq server middleware for the claim protocol
# of the PostgreSQL extension `idempotency`.
#
#   Sidekiq.configure_server do |config|
#     config.server_middleware { |chain| chain.add Idempotency::SidekiqMiddleware }
#   end
#
#   class SendConfirmation
#     include Sidekiq::Worker
#     sidekiq_options idempotency: { "job_type" => "send_confirmation", "lease" => 600 }
#     def self.idempotency_key(order, _email) = order   # names the effect
#     def perform(order, email) ... end
#   end
#
# For every job of a class with the `idempotency` option:
# claim_operation(job type, key, fingerprint, worker);
#   run / verify        -> perform runs, a thread heartbeats extend_lease;
#                          then complete_operation; the job is done
#   completed, skipped  -> done without running perform
#   in_progress         -> re-enqueued to run again after the lease (perform_in)
#   held                -> done; a person decides (resolve_operation)
# perform raising Idempotency::KnownFailure (the effect certainly did not
# happen) releases the claim and re-enqueues the job at once; any other error
# leaves the claim to its lease and the job to Sidekiq's retries.
require "digest"
require "json"
require "pg"
require "socket"

module Idempotency
  class KnownFailure < StandardError; end

  # PG.connect("") of ruby-pg 1.4 ignores PGHOST; PG.connect does not
  def self.connect(dsn)
    dsn ? PG.connect(dsn) : PG.connect
  end

  # a thread that calls the block every `every` seconds, with its own
  # connection, until stop
  class Heartbeat
    def initialize(dsn, every, &beat)
      @mutex = Mutex.new
      @cv = ConditionVariable.new
      @stopped = false
      @thread = Thread.new do
        conn = Idempotency.connect(dsn)
        begin
          loop do
            done = @mutex.synchronize { @cv.wait(@mutex, every) unless @stopped; @stopped }
            break if done
            beat.call(conn)
          end
        rescue PG::Error => e
          Sidekiq.logger.warn("heartbeat: #{e.message}")
        ensure
          conn.close
        end
      end
    end

    def stop
      @mutex.synchronize { @stopped = true; @cv.signal }
      @thread.join
    end
  end

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
      args = job["args"]
      key = (worker.class.respond_to?(:idempotency_key) ? worker.class.idempotency_key(*args) : args.first).to_s
      db = connection
      row = db.exec_params(
        "SELECT verdict, attempt, result FROM idempotency.claim_operation($1, $2, $3, $4)",
        [job_type, key, fingerprint(worker.class.name, args), "#{Socket.gethostname}/pid-#{Process.pid}"]
      ).first
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
      beat = Heartbeat.new(@dsn, lease / 4) do |hb|
        hb.exec_params("SELECT idempotency.extend_lease($1, $2, $3)", [job_type, key, attempt])
      end
      begin
        job["idempotency_attempt"] = attempt
        job["idempotency_verify"] = verdict == "verify"
        yield
      rescue KnownFailure
        beat.stop
        db.exec_params("SELECT idempotency.release_operation($1, $2, $3)", [job_type, key, attempt])
        worker.class.set(queue: queue).perform_async(*args)
        return notify(event, "released")
      ensure
        beat.stop
      end
      begin
        db.exec_params("SELECT idempotency.complete_operation($1, $2, $3, $4)",
                       [job_type, key, attempt, JSON.generate({ "jid" => job["jid"] })])
      rescue PG::Error => e
        raise unless e.result&.error_field(PG::Result::PG_DIAG_SQLSTATE) == "ID003"
        return notify(event, "superseded")   # taken over after the lease: the new owner records it
      end
      notify(event, "completed")
    end

    private

    def fingerprint(klass, args)
      "sha256:" + Digest::SHA256.hexdigest(JSON.generate([klass, args]))
    end

    # one connection per Sidekiq thread
    def connection
      c = Thread.current[:idempotency_pg]
      if c.nil? || c.finished?
        c = Thread.current[:idempotency_pg] = Idempotency.connect(@dsn)
      end
      c
    end

    def notify(event, action)
      e = event.merge("action" => action)
      Sidekiq.logger.info("#{e['key']}: #{e['verdict']} ##{e['attempt']} -> #{action}")
      @on_verdict&.call(e)
      nil
    end
  end
end
