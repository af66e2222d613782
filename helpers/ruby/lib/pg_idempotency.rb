# pg_idempotency: the claim protocol of the PostgreSQL extension
# `idempotency` (0.3 or later) for Ruby workers, on the `pg` gem. No queue
# system here: PgIdempotency::Connection, PgIdempotency.claim / complete /
# release / extend_lease and PgIdempotency::Heartbeat are what any worker
# calls; require "pg_idempotency/sidekiq" for the Sidekiq server middleware
# built on them.
#
#   require "pg_idempotency"
#   db = PgIdempotency::Connection.new(nil)        # the PG* environment, or a conninfo string
#   c = PgIdempotency.claim(db, "send_confirmation", "ORD-1001",
#                           fingerprint: "sha256:...", worker: "host/pid-1")
#   if c.run?                                      # run or verify (verify?: look the effect up first)
#     beat = PgIdempotency::Heartbeat.new(PgIdempotency::Connection.new(nil), 150) do |hb|
#       PgIdempotency.extend_lease(hb, "send_confirmation", "ORD-1001", c.attempt)
#     end
#     begin
#       send_the_email
#     rescue PgIdempotency::KnownFailure
#       PgIdempotency.release(db, "send_confirmation", "ORD-1001", c.attempt)
#       raise
#     ensure
#       beat.stop
#     end
#     PgIdempotency.complete(db, "send_confirmation", "ORD-1001", c.attempt, { "id" => 42 })
#   end
#
# Connections: a PgIdempotency::Connection opens on first use. One that the
# server closed or lost (restart, failover, an idle timeout, a reply lost on
# the way) is replaced and the statement sent once more; all four calls can
# be repeated (complete and release are no-ops when repeated; the claim
# carries a delivery token, a uuid made once per call of claim, so a claim
# repeated after a lost reply gets its own claim back: the same verdict and
# attempt, not in_progress for a lease). While the database cannot be
# reached the claim, the completion and the release are tried again after
# 0, 0.1, 0.2 ... 2 s for up to `within` seconds (default 30). A connection
# error is one on a connection that is no longer OK, or SQLSTATE class 08
# (PgBouncer reports its own failures as 08P01 and closes the connection) or
# 57P01-57P03 (the server is shutting down or starting up).
#
# The bound: claim(wait: 0) (the default) claims with wait => false and is
# answered in_progress at once when another transaction holds an
# uncommitted claim of the key; wait: N > 0 waits up to N seconds (wait =>
# true under SET LOCAL lock_timeout); a claim that hit its bound raises
# PG::Error with SQLSTATE 55P03 (or 57014 from a statement_timeout):
# PgIdempotency.busy?(error) is true, treat it like in_progress.
#
# The sign-off run (docs/signoff-protocol.md, version 1): when the runner
# starts the worker with IDEMPOTENCY_SIGNOFF_JOB_TYPES ("yours=run's,..."),
# claim / complete / release / extend_lease use the run's job type in place
# of yours (PgIdempotency.signoff_job_type); with IDEMPOTENCY_SIGNOFF (the
# runner's Unix socket), PgIdempotency.signoff_point(:claimed, ...) after the
# claim (heartbeat running, before the work) and (:handled, ...) after the
# work (heartbeat stopped, before complete) ask the runner, which answers
# :continue, :fail (at claimed: release, as for KnownFailure) or kills the
# process. Both unset: no change, no connection.
require "json"
require "logger"
require "pg"
require "securerandom"
require "socket"

module PgIdempotency
  VERSION = "0.3.0"
  # the extension version these calls need (delivery =>, wait =>)
  EXTENSION_VERSION = "0.3"

  # raise it from the work when the effect certainly did not happen: the
  # claim is released and a later claim runs attempt + 1
  class KnownFailure < StandardError; end

  # the sign-off run's variables are wrong, or its runner could not be asked
  # (unreachable, closed without a line, another answer)
  class SignoffError < StandardError; end

  # the version of docs/signoff-protocol.md spoken here
  SIGNOFF_PROTOCOL = 1

  # the answer of claim_operation. verdict: run, verify, completed,
  # in_progress, held or skipped; attempt: the attempt the caller owns
  # (run, verify) or the record's; result: the completion's result (jsonb
  # text) for completed; delivery: the token the claim was sent with
  Claim = Struct.new(:verdict, :attempt, :result, :delivery, keyword_init: true) do
    # the caller owns the claim and does the work
    def run? = verdict == "run" || verdict == "verify"
    # a stale claim was taken over under the lookup policy: the effect may
    # have happened, look it up before doing it again
    def verify? = verdict == "verify"
  end

  class << self
    # where Heartbeat logs a failed beat (default: warnings on stderr)
    attr_writer :logger

    def logger
      @logger ||= Logger.new($stderr, level: Logger::WARN)
    end
  end

  # PG.connect("") of ruby-pg 1.4 ignores PGHOST; PG.connect does not
  def self.connect(dsn)
    dsn ? PG.connect(dsn) : PG.connect
  end

  # the SQLSTATE of a PG::Error, or nil (a connection error without a result)
  def self.sqlstate(err)
    err.respond_to?(:result) && err.result&.error_field(PG::Result::PG_DIAG_SQLSTATE)
  end

  # the server is going away or not there yet: admin_shutdown (a fast
  # shutdown terminates the backend, even in the middle of a call),
  # crash_shutdown, cannot_connect_now
  SERVER_GONE = %w[57P01 57P02 57P03].freeze

  # lock_timeout, statement_timeout: the claim hit its bound; nothing recorded
  BUSY = %w[55P03 57014].freeze

  # an error of the connection although it may still look OK: class 08
  # (PgBouncer's own errors, 08P01, before it closes) or the server going away
  def self.connection_error?(err)
    code = sqlstate(err)
    !!code && (code.start_with?("08") || SERVER_GONE.include?(code))
  end

  # a claim that hit its bound (55P03, 57014): treat it like in_progress
  def self.busy?(err) = BUSY.include?(sqlstate(err))

  # a connection that opens on first use and is replaced when it broke
  class Connection
    def initialize(dsn = nil)
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
        raise if healthy? && !PgIdempotency.connection_error?(e)   # an error of the statement itself
        close                                                      # the connection broke
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
        @conn = PgIdempotency.connect(@dsn)
      end
      @conn
    end
  end

  # a thread that calls the block with `conn` every `every` seconds until
  # stop. A failing beat is logged and the next one tried; nothing it raises
  # reaches the work (stop never raises). A beat answered ID003 (the claim
  # was taken over) ends the beating.
  class Heartbeat
    def initialize(conn, every, logger: PgIdempotency.logger, &beat)
      @logger = logger
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
            logger.warn("heartbeat: #{e.class}: #{e.message}")
            break if PgIdempotency.sqlstate(e) == "ID003"   # taken over: stop beating
          end
        end
      end
    end

    def stop
      @mutex.synchronize { @stopped = true; @cv.signal }
      @thread.join
    rescue StandardError => e   # not reached: the thread rescues its errors
      @logger.warn("heartbeat: #{e.class}: #{e.message}")
    end
  end

  CLAIM_SQL = "SELECT verdict, attempt, result FROM idempotency.claim_operation($1, $2, $3, $4, " \
              "delivery => $5, wait => $6)"

  # claim_operation(job_type, key, fingerprint, worker, delivery, wait) on a
  # PgIdempotency::Connection; a Claim. A lost connection: the claim again on
  # a new connection with the same delivery token, for up to `within`
  # seconds (on_reconnect is called with each error first). wait: seconds
  # the claim may wait for another transaction's uncommitted claim of the
  # key (0: wait => false). Raises PG::Error: busy?(e) for a claim that hit
  # its bound, ID002 for the key with another fingerprint, ...
  #
  # An answer that runs nothing (completed, in_progress, held, skipped; the
  # bound; ID002 and class 22) is the sign-off point :judged, reported here
  # (nothing unless IDEMPOTENCY_SIGNOFF is set), before the caller
  # acknowledges, postpones or fails the job.
  def self.claim(conn, job_type, key, fingerprint: nil, worker: nil, delivery: SecureRandom.uuid,
                 wait: 0, within: 30, on_reconnect: nil)
    yours = job_type
    job_type = signoff_job_type(job_type)
    wait = wait.to_f
    params = [job_type, key.to_s, fingerprint, worker, delivery, wait.positive?]
    begin
      row = conn.run(on_reconnect: on_reconnect, within: within) do |c|
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
      code = sqlstate(e)
      if busy?(e) || code == "ID002" || code&.start_with?("22")
        signoff_point(:judged, yours, key, attempt: nil, sqlstate: code, verdict: busy?(e) ? "busy" : "error")
      end
      raise
    end
    claim = Claim.new(verdict: row["verdict"], attempt: row["attempt"].to_i, result: row["result"], delivery: delivery)
    signoff_point(:judged, yours, key, attempt: claim.attempt, verdict: claim.verdict) unless claim.run?
    claim
  end

  # complete_operation(job_type, key, attempt, result); result: nil, a JSON
  # text or anything JSON.generate takes. Sent again after a lost connection
  # for up to `within` seconds. ID003: the claim was taken over after its
  # lease (the new owner records the effect).
  def self.complete(conn, job_type, key, attempt, result = nil, within: 30, on_reconnect: nil)
    result = JSON.generate(result) unless result.nil? || result.is_a?(String)
    conn.exec_params("SELECT idempotency.complete_operation($1, $2, $3, $4)",
                     [signoff_job_type(job_type), key.to_s, attempt, result], within: within, on_reconnect: on_reconnect)
    nil
  end

  # release_operation(job_type, key, attempt): the effect certainly did not
  # happen; a later claim runs attempt + 1
  def self.release(conn, job_type, key, attempt, within: 30, on_reconnect: nil)
    conn.exec_params("SELECT idempotency.release_operation($1, $2, $3)",
                     [signoff_job_type(job_type), key.to_s, attempt],
                     within: within, on_reconnect: on_reconnect)
    nil
  end

  # extend_lease(job_type, key, attempt): a heartbeat (one reconnect, at once)
  def self.extend_lease(conn, job_type, key, attempt, within: 0)
    conn.exec_params("SELECT idempotency.extend_lease($1, $2, $3)",
                     [signoff_job_type(job_type), key.to_s, attempt], within: within)
    nil
  end

  # The sign-off run (docs/signoff-protocol.md). The job type the calls
  # above use for yours: the run's from IDEMPOTENCY_SIGNOFF_JOB_TYPES
  # ("yours=run's[,yours2=run's2...]"), or yours when it is not in the map
  # or the variable is unset. Raises SignoffError for a malformed map (an
  # entry without "=", an empty side, a job type named twice).
  def self.signoff_job_type(job_type)
    spec = ENV["IDEMPOTENCY_SIGNOFF_JOB_TYPES"]
    return job_type if spec.nil? || spec.empty?
    map = {}
    spec.split(",", -1).each do |entry|
      yours, runs = entry.split("=", 2)
      if runs.nil? || yours.empty? || runs.empty? || map.key?(yours)
        raise SignoffError, "IDEMPOTENCY_SIGNOFF_JOB_TYPES: malformed entry #{entry.inspect} " \
                            "(expected yours=run's[,yours2=run's2...], each job type once)"
      end
      map[yours] = runs
    end
    map.fetch(job_type.to_s, job_type)
  end

  SIGNOFF_POINTS = %w[claimed judged handled].freeze

  # The run's lease in seconds (IDEMPOTENCY_SIGNOFF_LEASE), for the timings
  # a helper derives from its configured lease; nil when unset or empty.
  # Raises SignoffError unless it is a positive number.
  def self.signoff_lease
    spec = ENV["IDEMPOTENCY_SIGNOFF_LEASE"]
    return nil if spec.nil? || spec.empty?
    lease = Float(spec, exception: false)
    unless lease&.positive? && lease.finite?
      raise SignoffError, "IDEMPOTENCY_SIGNOFF_LEASE: #{spec.inspect} is not a positive number of seconds"
    end
    lease
  end

  # A kill point of the sign-off run: point :claimed (the claim committed
  # with run or verify, the heartbeat running, the work not started) or
  # :handled (the work returned, the heartbeat stopped, complete not sent);
  # job_type is yours (sent mapped), heartbeat whether one runs. Unless
  # IDEMPOTENCY_SIGNOFF is set, :continue at once. Else one line of JSON to
  # the runner's socket and its answer, waited for without a timeout:
  # :continue, or :fail (only at claimed: release the claim and retry later,
  # as for KnownFailure, without doing the work); no answer is the runner
  # killing this process. Raises SignoffError when the socket cannot be
  # reached, closes without a line or answers anything else.
  #
  # Point :judged (continue only) reports any other answer of the claim
  # before the job is acknowledged, postponed or failed: verdict completed,
  # in_progress, held or skipped (with its attempt), or "busy" (55P03,
  # 57014) or "error" (ID002, class 22) with attempt nil and the sqlstate.
  def self.signoff_point(point, job_type, key, attempt:, verdict:, heartbeat: false, sqlstate: nil)
    path = ENV["IDEMPOTENCY_SIGNOFF"]
    return :continue if path.nil? || path.empty?
    point = point.to_s
    raise ArgumentError, "signoff_point: point #{point.inspect}, not claimed, judged or handled" unless SIGNOFF_POINTS.include?(point)
    message = { "v" => SIGNOFF_PROTOCOL, "point" => point, "job_type" => signoff_job_type(job_type),
                "key" => key.to_s, "attempt" => attempt, "verdict" => verdict,
                "pid" => Process.pid, "heartbeat" => heartbeat ? true : false }
    message["sqlstate"] = sqlstate if %w[busy error].include?(verdict.to_s)
    line = JSON.generate(message)
    begin
      answer = UNIXSocket.open(path) do |s|
        s.write(line, "\n")
        s.gets
      end
    rescue SystemCallError, IOError => e
      raise SignoffError, "sign-off runner at #{path} (#{point} #{key}): #{e.message}"
    end
    case answer&.chomp
    when "continue" then :continue
    when "fail"
      return :fail if point == "claimed"
      raise SignoffError, "sign-off runner at #{path} answered fail at #{point} (#{key}); only claimed may fail"
    when nil
      raise SignoffError, "sign-off runner at #{path} closed the connection without an answer (#{point} #{key})"
    else
      raise SignoffError, "sign-off runner at #{path} answered #{answer.inspect} at #{point} (#{key})"
    end
  end
end
