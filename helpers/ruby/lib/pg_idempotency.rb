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
# 0, 0.1, 0.2 ... 2 s for up to `reconnect_for` seconds (default 30). A connection
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
  VERSION = "0.5.1"
  # the extension version these calls need (delivery =>, wait =>)
  EXTENSION_VERSION = "0.3"

  # raise it from the work when the effect certainly did not happen: the
  # claim is released and a later claim runs attempt + 1
  class KnownFailure < StandardError; end

  # raise it from the work when the provider refused for good (HTTP 422,
  # SMTP 550: the effect did not happen, and asking again with the same
  # arguments cannot change that): the operation is ended, completed with
  # permanent_failure_result(reason) as its result (no longer claimed, and
  # the record says why), and the delivery fails as the queue library fails
  # a job, without a retry (the Sidekiq middleware: the dead set). A later
  # delivery meets that result and fails the same way, without running. The
  # plain calls: fail_permanently.
  class PermanentFailure < StandardError; end

  # the key of the stored result that marks a permanent failure
  PERMANENT_FAILURE = "permanent_failure"

  # the result a permanent failure completes the operation with
  def self.permanent_failure_result(reason) = { PERMANENT_FAILURE => reason.to_s }

  # the reason when a stored result (a completed Claim's result: jsonb text,
  # or a Hash) marks a permanent failure, else nil
  def self.permanent_failure_of(result)
    result = JSON.parse(result) if result.is_a?(String)
    return nil unless result.is_a?(Hash) && result.keys == [PERMANENT_FAILURE]

    result[PERMANENT_FAILURE].is_a?(String) ? result[PERMANENT_FAILURE] : nil
  rescue JSON::ParserError
    nil
  end

  # the sign-off run's variables are wrong, or its runner could not be asked
  # (unreachable, closed without a line, another answer)
  class SignoffError < StandardError; end

  # the version of docs/signoff-protocol.md spoken here
  SIGNOFF_VERSION = 1
  # deprecated (docs/helpers.md): SIGNOFF_VERSION; removed in 0.6.0
  SIGNOFF_PROTOCOL = SIGNOFF_VERSION
  deprecate_constant :SIGNOFF_PROTOCOL

  # the reconnect bound of claim, complete and release when not given (s)
  RECONNECT_FOR = 30.0

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

  # Can the same claim succeed later? No for the caller's bugs: ID002 (the
  # key was claimed with another fingerprint) and class 22 (bad input); yes
  # for everything else, first of all a lost connection
  def self.claim_error_heals?(err)
    code = sqlstate(err)
    !(code && (code == "ID002" || code.start_with?("22")))
  end

  # the error's primary message, one line (the point judged's message)
  def self.error_message(err)
    primary = err.respond_to?(:result) && err.result&.error_field(PG::Result::PG_DIAG_MESSAGE_PRIMARY)
    text = (primary || err.message.to_s).strip
    text.empty? ? err.class.name : text.lines.first.strip
  end

  # the claim's worker column: host/pid-N
  def self.worker_id = "#{Socket.gethostname}/pid-#{Process.pid}"

  # the deprecated keywords within: (now reconnect_for:) and on_reconnect:
  # (now on_lost:), removed in 0.6.0: [reconnect_for, on_lost]
  def self.reconnect_options(reconnect_for, on_lost, within, on_reconnect, default)
    unless within.nil?
      warn("pg_idempotency: within: is deprecated, use reconnect_for: (removed in 0.6.0)",
           uplevel: 2, category: :deprecated)
      reconnect_for = within if reconnect_for.nil?
    end
    unless on_reconnect.nil?
      warn("pg_idempotency: on_reconnect: is deprecated, use on_lost: (removed in 0.6.0)",
           uplevel: 2, category: :deprecated)
      on_lost = on_reconnect if on_lost.nil?
    end
    [reconnect_for.nil? ? default : reconnect_for, on_lost]
  end
  private_class_method :reconnect_options

  # a connection that opens on first use and is replaced when it broke
  class Connection
    def initialize(dsn = nil)
      @dsn = dsn
      @conn = nil
    end

    # exec_params with_reconnect (within: and on_reconnect: are deprecated
    # names of reconnect_for: and on_lost:)
    def exec_params(sql, params, reconnect_for: nil, on_lost: nil, within: nil, on_reconnect: nil)
      reconnect_for, on_lost = PgIdempotency.send(:reconnect_options, reconnect_for, on_lost, within, on_reconnect, 0)
      with_reconnect(reconnect_for: reconnect_for, on_lost: on_lost) { |c| c.exec_params(sql_for(sql), params) }
    end

    IN_PLACE = /\bidempotency\.(claim_operation|complete_operation|release_operation|extend_lease)\(/

    # Citus (extension 0.4): on a worker node that holds the metadata, the
    # four single-key calls go to their *_in_place names, which Citus does
    # not plan as distributed function calls (idempotency.use_in_place()
    # says where, and whether this role may call them); everywhere else,
    # and before 0.4, sql as it is. Decided once per connection (in pg).
    def sql_for(sql)
      @in_place ? sql.gsub(IN_PLACE) { "idempotency.#{Regexp.last_match(1)}_in_place(" } : sql
    end

    # deprecated (docs/helpers.md): with_reconnect; removed in 0.6.0
    def run(on_reconnect: nil, within: nil, &block)
      warn("PgIdempotency::Connection#run is deprecated, use #with_reconnect (removed in 0.6.0)",
           uplevel: 1, category: :deprecated)
      reconnect_for, on_lost = PgIdempotency.send(:reconnect_options, nil, nil, within, on_reconnect, 0)
      with_reconnect(reconnect_for: reconnect_for, on_lost: on_lost, &block)
    end

    # the block with the PG::Connection; again on a new connection while the
    # connection is broken (on_lost is called with the error first): at
    # once, then after 0.1, 0.2 ... 2 s, until `reconnect_for` seconds have
    # passed since the first error (at least once more)
    def with_reconnect(reconnect_for: 0, on_lost: nil)
      deadline = nil
      pause = 0.0
      begin
        yield pg
      rescue PG::Error => e
        raise if healthy? && !PgIdempotency.connection_error?(e)   # an error of the statement itself
        close                                                      # the connection broke
        now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        if deadline.nil?
          deadline = now + reconnect_for.to_f
        elsif now + pause > deadline
          raise
        end
        on_lost&.call(e)
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
        @in_place = in_place?(@conn)
      end
      @conn
    end

    def in_place?(c)
      may = c.exec("SELECT coalesce(pg_catalog.has_function_privilege(" \
                   "pg_catalog.to_regprocedure('idempotency.use_in_place()'), 'EXECUTE'), false)").getvalue(0, 0)
      may == "t" && c.exec("SELECT idempotency.use_in_place()").getvalue(0, 0) == "t"
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
  # a new connection with the same delivery token, for up to `reconnect_for`
  # seconds (on_lost is called with each error first). wait: seconds
  # the claim may wait for another transaction's uncommitted claim of the
  # key (0: wait => false). Raises PG::Error: busy?(e) for a claim that hit
  # its bound, ID002 for the key with another fingerprint, ...
  #
  # An answer that runs nothing (completed, in_progress, held, skipped; the
  # bound: verdict busy; any error, a connection lost for longer than
  # reconnect_for included: verdict error, with its SQLSTATE and message) is
  # the sign-off point :judged, reported here (nothing unless
  # IDEMPOTENCY_SIGNOFF is set), before the caller acknowledges, postpones or
  # fails the job; the first claim of an armed process also reports the
  # point hello (signoff_hello) on the claim's connection, naming what made
  # the claim: the wrapper of signoff_wrapper, else "plain".
  def self.claim(conn, job_type, key, fingerprint: nil, worker: nil, delivery: SecureRandom.uuid,
                 wait: 0, reconnect_for: nil, on_lost: nil, within: nil, on_reconnect: nil)
    reconnect_for, on_lost = reconnect_options(reconnect_for, on_lost, within, on_reconnect, RECONNECT_FOR)
    yours = job_type
    job_type = signoff_job_type(job_type)
    params = [job_type, key.to_s, fingerprint, worker || worker_id, delivery]
    used = []   # the connection the claim went to, for the point hello
    begin
      row = bounded(conn, CLAIM_SQL, params, wait, reconnect_for, on_lost, used).first
    rescue PG::Error => e
      signoff_hello(used.last, wrapper: signoff_wrapper_name || "plain")
      signoff_point(:judged, yours, key, attempt: nil, sqlstate: sqlstate(e), verdict: busy?(e) ? "busy" : "error",
                                         message: error_message(e))
      raise
    end
    signoff_hello(used.last, wrapper: signoff_wrapper_name || "plain")
    claim = Claim.new(verdict: row["verdict"], attempt: row["attempt"].to_i, result: row["result"], delivery: delivery)
    signoff_point(:judged, yours, key, attempt: claim.attempt, verdict: claim.verdict) unless claim.run?
    claim
  end

  # sql with params and wait => wait > 0; with wait > 0 in a transaction of
  # its own under SET LOCAL lock_timeout; with_reconnect
  def self.bounded(conn, sql, params, wait, reconnect_for, on_lost, used = [])
    wait = wait.to_f
    conn.with_reconnect(reconnect_for: reconnect_for, on_lost: on_lost) do |c|
      used.replace([c])
      if wait.positive?
        c.transaction do
          c.exec_params("SELECT set_config('lock_timeout', $1, true)", ["#{[1, (wait * 1000).round].max}ms"])
          c.exec_params(conn.sql_for(sql), params + [true])
        end
      else
        c.exec_params(conn.sql_for(sql), params + [false])
      end
    end
  end
  private_class_method :bounded

  # complete_operation(job_type, key, attempt, result); result: nil, a JSON
  # text or anything JSON.generate takes. Sent again after a lost connection
  # for up to `reconnect_for` seconds. ID003: the claim was taken over after
  # its lease (the new owner records the effect).
  def self.complete(conn, job_type, key, attempt, result = nil, reconnect_for: nil, on_lost: nil, within: nil,
                    on_reconnect: nil)
    reconnect_for, on_lost = reconnect_options(reconnect_for, on_lost, within, on_reconnect, RECONNECT_FOR)
    result = JSON.generate(result) unless result.nil? || result.is_a?(String)
    conn.exec_params("SELECT idempotency.complete_operation($1, $2, $3, $4)",
                     [signoff_job_type(job_type), key.to_s, attempt, result],
                     reconnect_for: reconnect_for, on_lost: on_lost)
    nil
  end

  # End the operation of a permanent refusal (PermanentFailure): the sign-off
  # point ended (nothing unless a runner that answers it started the
  # worker), then complete with permanent_failure_result(reason) as the
  # result. The caller then fails the message the way its queue fails a job,
  # without a retry (and, meeting that result in a later completed verdict,
  # fails it again without running): `delivery` says how, for the sign-off
  # report. ID003 as complete.
  def self.fail_permanently(conn, job_type, key, attempt, reason, reconnect_for: nil, on_lost: nil,
                            delivery: "left to the caller")
    signoff_ended(job_type, key, attempt, reason, delivery: delivery)
    complete(conn, job_type, key, attempt, permanent_failure_result(reason), reconnect_for: reconnect_for,
                                                                             on_lost: on_lost)
  end

  # release_operation(job_type, key, attempt): the effect certainly did not
  # happen; a later claim runs attempt + 1
  def self.release(conn, job_type, key, attempt, reconnect_for: nil, on_lost: nil, within: nil, on_reconnect: nil)
    reconnect_for, on_lost = reconnect_options(reconnect_for, on_lost, within, on_reconnect, RECONNECT_FOR)
    conn.exec_params("SELECT idempotency.release_operation($1, $2, $3)",
                     [signoff_job_type(job_type), key.to_s, attempt],
                     reconnect_for: reconnect_for, on_lost: on_lost)
    nil
  end

  # extend_lease(job_type, key, attempt): a heartbeat (one reconnect, at once)
  def self.extend_lease(conn, job_type, key, attempt, reconnect_for: nil, within: nil)
    reconnect_for, = reconnect_options(reconnect_for, nil, within, nil, 0)
    conn.exec_params("SELECT idempotency.extend_lease($1, $2, $3)",
                     [signoff_job_type(job_type), key.to_s, attempt], reconnect_for: reconnect_for)
    nil
  end

  # -- batches: many keys of one job type in one call (at most 1000) ----------
  CLAIMS_SQL = "SELECT operation_key, verdict, attempt, result FROM idempotency.claim_operations(" \
               "$1, $2::text[], $3::text[], $4, deliveries => $5::text[], wait => $6)"

  # one key's row of complete_batch or release_batch: done (now, or already
  # by this attempt), or the refusal of that key alone (sqlstate ID003 taken
  # over, ID004 no record, ID005 wrong state, and its message)
  Outcome = Struct.new(:key, :attempt, :done, :sqlstate, :message, keyword_init: true) do
    def done? = done
  end

  ARRAY = PG::TextEncoder::Array.new

  # claim_operations(job_type, keys, fingerprints, worker, deliveries, wait):
  # one Claim per key, in the order of keys, each with the verdict claim
  # would give it (a key given twice is two deliveries: run, then
  # in_progress). fingerprints and deliveries are parallel to keys (a uuid
  # per key unless given). Sent again, with the same tokens, while the
  # connection is lost. The server answers or refuses the call as a whole:
  # ID002, class 22 or the bound (55P03, 57014) raise PG::Error and record
  # nothing (claim those keys one by one to find the bad one). Every key
  # answered anything but run or verify is reported at :judged, as claim does;
  # so is every key, with the verdict error, when the call fails otherwise
  # (42501, ID001, a lost connection). The point hello names "plain_batch"
  # (or the wrapper of signoff_wrapper).
  def self.claim_batch(conn, job_type, keys, fingerprints: nil, worker: nil, deliveries: nil, wait: 0,
                       reconnect_for: RECONNECT_FOR, on_lost: nil)
    keys = keys.map(&:to_s)
    deliveries ||= keys.map { SecureRandom.uuid }
    if deliveries.size != keys.size || (fingerprints && fingerprints.size != keys.size)
      raise ArgumentError, "claim_batch: fingerprints and deliveries must be parallel to keys"
    end
    yours = job_type
    params = [signoff_job_type(job_type), ARRAY.encode(keys), fingerprints && ARRAY.encode(fingerprints),
              worker || worker_id, ARRAY.encode(deliveries)]
    used = []
    begin
      rows = bounded(conn, CLAIMS_SQL, params, wait, reconnect_for, on_lost, used).to_a
    rescue PG::Error => e
      signoff_hello(used.last, wrapper: signoff_wrapper_name || "plain_batch")
      if claim_error_heals?(e) && !busy?(e)
        # an error no key alone causes (a grant, a job type, the connection): every key's
        keys.each do |key|
          signoff_point(:judged, yours, key, attempt: nil, verdict: "error", sqlstate: sqlstate(e),
                                             message: error_message(e))
        end
      end
      raise
    end
    signoff_hello(used.last, wrapper: signoff_wrapper_name || "plain_batch")
    unless rows.map { |r| r["operation_key"] } == keys
      raise PG::Error, "claim_operations answered #{rows.size} rows for #{keys.size} keys, not one per key in their order"
    end
    claims = rows.zip(deliveries).map do |r, d|
      Claim.new(verdict: r["verdict"], attempt: r["attempt"].to_i, result: r["result"], delivery: d)
    end
    keys.zip(claims).each do |key, c|
      signoff_point(:judged, yours, key, attempt: c.attempt, verdict: c.verdict) unless c.run?
    end
    claims
  end

  # complete_operations(job_type, keys, attempts, results): one Outcome per
  # key, in their order; results parallel to keys (each nil, a JSON text or
  # anything JSON.generate takes), or nil. Sent again while the connection
  # is lost.
  def self.complete_batch(conn, job_type, keys, attempts, results = nil, reconnect_for: RECONNECT_FOR, on_lost: nil)
    results ||= [nil] * keys.size
    results = results.map { |r| r.nil? || r.is_a?(String) ? r : JSON.generate(r) }
    outcomes(conn, "complete_operations", "$1, $2::text[], $3::int[], $4::jsonb[]", job_type, keys, attempts,
             [results], reconnect_for, on_lost)
  end

  # release_operations(job_type, keys, attempts): one Outcome per key
  def self.release_batch(conn, job_type, keys, attempts, reconnect_for: RECONNECT_FOR, on_lost: nil)
    outcomes(conn, "release_operations", "$1, $2::text[], $3::int[]", job_type, keys, attempts, [],
             reconnect_for, on_lost)
  end

  def self.outcomes(conn, function, args, job_type, keys, attempts, extra, reconnect_for, on_lost)
    keys = keys.map(&:to_s)
    if attempts.size != keys.size || extra.any? { |e| e.size != keys.size }
      raise ArgumentError, "#{function}: attempts (and results) must be parallel to keys"
    end
    params = [signoff_job_type(job_type), ARRAY.encode(keys), ARRAY.encode(attempts.map(&:to_s)),
              *extra.map { |e| ARRAY.encode(e) }]
    conn.exec_params("SELECT operation_key, attempt, done, sqlstate, message FROM idempotency.#{function}(#{args})",
                     params, reconnect_for: reconnect_for, on_lost: on_lost).map do |r|
      Outcome.new(key: r["operation_key"], attempt: r["attempt"].to_i, done: r["done"] == "t",
                  sqlstate: r["sqlstate"], message: r["message"])
    end
  end
  private_class_method :outcomes

  # The sentences below are the same in the three helpers, tested by
  # helpers/conformance/signoff.json (docs/helpers.md).
  MAP_FORM = "yours=run's[,yours2=run's2...]"
  SPACE = /\A[ \t\n\r\f\v]+|[ \t\n\r\f\v]+\z/
  LEASE_FORM = /\A[ \t\n\r\f\v]*\+?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[ \t\n\r\f\v]*\z/

  # IDEMPOTENCY_SIGNOFF_JOB_TYPES's value "yours=run's[,yours2=run's2...]"
  # -> { yours => run's }; nil or "" (unset) -> {}. Spaces around a side are
  # dropped. Raises SignoffError for an entry without exactly one "=", with
  # an empty side, or naming one of your job types twice.
  def self.parse_job_types(text)
    map = {}
    return map if text.nil? || text.empty?
    text.split(",", -1).each do |entry|
      sides = entry.split("=", -1).map { |side| side.gsub(SPACE, "") }
      if sides.size != 2 || sides.any?(&:empty?)
        raise SignoffError, "IDEMPOTENCY_SIGNOFF_JOB_TYPES: malformed entry #{JSON.generate(entry)} in " \
                            "#{JSON.generate(text)} (expected #{MAP_FORM}); no job type is used"
      end
      if map.key?(sides[0])
        raise SignoffError, "IDEMPOTENCY_SIGNOFF_JOB_TYPES: malformed entry #{JSON.generate(entry)} in " \
                            "#{JSON.generate(text)} (the job type #{JSON.generate(sides[0])} is mapped twice); " \
                            "no job type is used"
      end
      map[sides[0]] = sides[1]
    end
    map
  end

  # IDEMPOTENCY_SIGNOFF_LEASE's value -> the run's lease in seconds (a
  # positive, finite decimal number); nil when nil or "". Raises SignoffError
  # for anything else.
  def self.parse_lease(text)
    return nil if text.nil? || text.empty?
    lease = LEASE_FORM.match?(text) ? text.to_f : 0.0
    unless lease.positive? && lease.finite?
      raise SignoffError, "IDEMPOTENCY_SIGNOFF_LEASE: #{JSON.generate(text)} is not a positive number of seconds; " \
                          "no job is claimed"
    end
    lease
  end

  # The sign-off run (docs/signoff-protocol.md). The job type the calls
  # above use for yours: the run's from IDEMPOTENCY_SIGNOFF_JOB_TYPES
  # ("yours=run's[,yours2=run's2...]"), or yours when it is not in the map
  # or the variable is unset. Raises SignoffError for a malformed map
  # (parse_job_types), at every call.
  def self.signoff_job_type(job_type)
    spec = ENV["IDEMPOTENCY_SIGNOFF_JOB_TYPES"]
    return job_type if spec.nil? || spec.empty?
    parse_job_types(spec).fetch(job_type.to_s, job_type)
  end

  SIGNOFF_POINTS = %w[claimed judged handled].freeze
  # the answers each point may get
  SIGNOFF_ANSWERS = { "claimed" => %w[continue fail], "judged" => %w[continue], "handled" => %w[continue] }.freeze

  # The run's lease in seconds (IDEMPOTENCY_SIGNOFF_LEASE), for the timings
  # a helper derives from its configured lease; nil when unset or empty.
  # Raises SignoffError unless it is a positive number.
  def self.signoff_lease = parse_lease(ENV["IDEMPOTENCY_SIGNOFF_LEASE"])

  # the line (JSON and "\n") sent to the runner at `point`; job_type as sent
  # (the run's); sqlstate only with the verdict busy or error; message (the
  # error's) only with the verdict error, when given; pid this process's
  # unless given. ArgumentError for an unknown point.
  def self.signoff_message(point, job_type, key, attempt: nil, verdict: nil, heartbeat: false, sqlstate: nil,
                           pid: Process.pid, message: nil)
    point = point.to_s
    unless SIGNOFF_POINTS.include?(point)
      raise ArgumentError, "sign-off: unknown point #{JSON.generate(point)} (expected claimed, judged or handled)"
    end
    line = { "v" => SIGNOFF_VERSION, "point" => point, "job_type" => job_type, "key" => key.to_s,
             "attempt" => attempt, "verdict" => verdict, "pid" => pid, "heartbeat" => heartbeat ? true : false }
    line["sqlstate"] = sqlstate if %w[busy error].include?(verdict.to_s)
    line["message"] = message.to_s if verdict.to_s == "error" && !message.nil?
    "#{JSON.generate(line)}\n"
  end

  # The runner's answer at `point` from what was read (up to the first
  # newline, or all it sent before it closed the connection): :continue, or
  # :fail at claimed. SignoffError otherwise; its message starts with
  # `where` when given.
  def self.signoff_answer(point, received, where = nil)
    lead = where ? "#{where}: " : ""
    line, newline, = (received || "").partition("\n")
    raise SignoffError, "#{lead}the runner closed the connection without an answer line" if newline.empty?
    allowed = (%w[hello ended].include?(point.to_s) ? %w[continue] : SIGNOFF_ANSWERS.fetch(point.to_s))
    unless allowed.include?(line)
      raise SignoffError, "#{lead}unexpected answer #{JSON.generate(line)} (expected #{allowed.join(' or ')})"
    end
    line.to_sym
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
  # 57014) or "error" (any other error) with attempt nil, the sqlstate and
  # the message. The first point of an armed process is preceded by the
  # point hello (signoff_hello), once.
  def self.signoff_point(point, job_type, key, attempt:, verdict:, heartbeat: false, sqlstate: nil, message: nil)
    point = point.to_s
    unless SIGNOFF_POINTS.include?(point)
      raise ArgumentError, "sign-off: unknown point #{JSON.generate(point)} (expected claimed, judged or handled)"
    end
    path = ENV["IDEMPOTENCY_SIGNOFF"]
    return :continue if path.nil? || path.empty?
    job_type = signoff_job_type(job_type)
    signoff_hello
    line = signoff_message(point, job_type, key, attempt: attempt, verdict: verdict, heartbeat: heartbeat,
                                                 sqlstate: sqlstate, message: message)
    signoff_exchange(path, point, line, "sign-off runner at #{path}, point #{point} of #{job_type}/#{key}")
  end

  # one exchange: connect, send the line, read the answer line
  def self.signoff_exchange(path, point, line, where)
    begin
      received = UNIXSocket.open(path) do |s|
        s.write(line)
        s.gets
      end
    rescue SystemCallError, IOError => e
      raise SignoffError, "#{where}: #{e.message}"
    end
    signoff_answer(point, received&.force_encoding(Encoding::UTF_8)&.scrub, where)
  end

  # -- the point hello (docs/signoff-protocol.md) ------------------------------
  DATABASE_SQL = "SELECT pg_catalog.current_database(), pg_catalog.inet_server_port(), " \
                 "(SELECT system_identifier::text FROM pg_catalog.pg_control_system())"

  # the point hello is sent: IDEMPOTENCY_SIGNOFF is set and the runner
  # exported IDEMPOTENCY_SIGNOFF_HELLO=1 (it answers the point; an older
  # runner, which does not, would refuse it)
  def self.signoff_hello?
    path = ENV["IDEMPOTENCY_SIGNOFF"]
    !(path.nil? || path.empty?) && ENV["IDEMPOTENCY_SIGNOFF_HELLO"] == "1"
  end

  # the line (JSON and "\n") of the point hello: who this worker is, what
  # runs its claims (wrapper: "plain", "plain_batch" or a wrapper's name) and
  # the database its claims go to (nil where unknown)
  def self.signoff_hello_message(helper:, helper_version:, runtime:, runtime_version:, queue_library: nil,
                                 queue_library_version: nil, database: nil, server_port: nil,
                                 system_identifier: nil, wrapper: nil, pid: Process.pid)
    line = { "v" => SIGNOFF_VERSION, "point" => "hello", "pid" => pid, "helper" => helper,
             "helper_version" => helper_version, "runtime" => runtime, "runtime_version" => runtime_version,
             "queue_library" => queue_library,
             "queue_library_version" => queue_library.nil? ? nil : queue_library_version,
             "database" => database, "server_port" => server_port, "system_identifier" => system_identifier,
             "wrapper" => wrapper }
    "#{JSON.generate(line)}\n"
  end

  @hello_pid = nil

  # Inside the block, the claims are made by the wrapper `name`: the point
  # hello reports it as its `wrapper` (the report names it). The Sidekiq
  # middleware says "SidekiqMiddleware"; a wrapper of your own may name
  # itself. Outside any block claim reports "plain", claim_batch
  # "plain_batch". Per fiber (Thread.current[]), like a Sidekiq job.
  def self.signoff_wrapper(name)
    before = Thread.current[:pg_idempotency_wrapper]
    Thread.current[:pg_idempotency_wrapper] = name.to_s
    yield
  ensure
    Thread.current[:pg_idempotency_wrapper] = before
  end

  # the name of signoff_wrapper's block this fiber is in, or nil
  def self.signoff_wrapper_name = Thread.current[:pg_idempotency_wrapper]

  # The point hello, once per process, before its first point: the helper,
  # the runtime, Sidekiq's version when it is loaded, what makes the claims
  # (wrapper; nil: signoff_wrapper's name, else "plain") and the database of
  # pg (a PG::Connection, e.g. the claim's; nil: null). claim and
  # claim_batch call it with the claim's connection; a worker that claims on
  # a connection of its own calls it with that connection first. Nothing
  # unless signoff_hello?; the runner answers continue. SignoffError as at
  # any point.
  def self.signoff_hello(pg = nil, wrapper: nil)
    return if @hello_pid == Process.pid || !signoff_hello?
    @hello_pid = Process.pid
    database, port, sysid = nil
    if pg && !pg.finished? && pg.status == PG::CONNECTION_OK
      begin
        row = pg.exec(DATABASE_SQL).values.first
        database, port, sysid = row[0], row[1]&.to_i, row[2]
      rescue PG::Error
        database = port = sysid = nil
      end
    end
    sidekiq = defined?(::Sidekiq::VERSION) ? ::Sidekiq::VERSION : nil
    line = signoff_hello_message(helper: "pg-idempotency", helper_version: VERSION, runtime: RUBY_ENGINE,
                                 runtime_version: RUBY_VERSION, queue_library: sidekiq && "sidekiq",
                                 queue_library_version: sidekiq, database: database, server_port: port,
                                 system_identifier: sysid, wrapper: wrapper || signoff_wrapper_name || "plain")
    path = ENV["IDEMPOTENCY_SIGNOFF"]
    signoff_exchange(path, "hello", line, "sign-off runner at #{path}, point hello")
  end

  # -- the point ended (docs/signoff-protocol.md) ------------------------------
  # the line (JSON and "\n") of the point ended: the work raised
  # PermanentFailure (reason), the heartbeat stopped, the completion with the
  # refusal as its result not sent yet; delivery: how the delivery then
  # ends, in the queue library's words
  def self.signoff_ended_message(job_type, key, attempt, reason, delivery:, pid: Process.pid)
    text = reason.to_s.strip
    line = { "v" => SIGNOFF_VERSION, "point" => "ended", "job_type" => job_type, "key" => key.to_s,
             "attempt" => attempt, "pid" => pid, "ending" => "PermanentFailure", "delivery" => delivery.to_s,
             "message" => text.empty? ? "" : text.lines.first.strip }
    "#{JSON.generate(line)}\n"
  end

  # The point ended, before a permanent failure's completion: nothing unless
  # IDEMPOTENCY_SIGNOFF is set and the runner exported
  # IDEMPOTENCY_SIGNOFF_ENDED=1 (it answers the point; an older runner, which
  # does not, would refuse it). The runner answers continue and names the
  # ending in its report. SignoffError as at any point.
  def self.signoff_ended(job_type, key, attempt, reason, delivery:)
    path = ENV["IDEMPOTENCY_SIGNOFF"]
    return if path.nil? || path.empty? || ENV["IDEMPOTENCY_SIGNOFF_ENDED"] != "1"

    job_type = signoff_job_type(job_type)
    signoff_hello
    signoff_exchange(path, "ended", signoff_ended_message(job_type, key, attempt, reason, delivery: delivery),
                     "sign-off runner at #{path}, point ended of #{job_type}/#{key}")
    nil
  end
end

require_relative "pg_idempotency/portable"
