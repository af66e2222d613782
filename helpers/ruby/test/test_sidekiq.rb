# test_sidekiq.rb: focused tests of PgIdempotency::SidekiqMiddleware
# (lib/pg_idempotency/sidekiq.rb) and of the connection and heartbeat under
# it, that need a database but no Redis (the middleware is called directly,
# as Sidekiq's processor calls it):
#
#   ruby -Ilib -Itest test/test_sidekiq.rb    # in helpers/ruby; the PG* environment;
#                                             # the extension is created if missing
#
# - a connection the server closed is replaced (and a statement's own error
#   is not sent twice);
# - a failing heartbeat (no connection at all, or one the server closed)
#   logs, keeps trying and never raises into the job;
# - under verdict verify (lookup policy) the job sees idempotency_verify?;
# - extension 0.3: a claim whose reply is lost with its connection (the
#   server recorded it) is sent once more with the same delivery token and
#   gets its own claim back (run #1, not in_progress), also when the
#   database then stays unreachable for a while (refused connections,
#   PgBouncer's 08P01 on a connection that looks OK); another transaction's
#   uncommitted claim of the key answers in_progress at once (wait => false),
#   and with "claim_wait" the claim's lock_timeout (55P03) is re-enqueued like
#   in_progress (perform_in(lease); stubbed here: no Redis);
# - a claim error that cannot heal (ID002, class 22) sends the job to the
#   dead set at once (the dead-set write stubbed: no Redis) with Sidekiq's
#   error fields, once, and raises nothing; the death handlers and
#   sidekiq_retries_exhausted are called; dead: false keeps it out of the
#   dead set; retry: false raises as before (Sidekiq drops the job); an error
#   that may heal (ID001 here) still raises into Sidekiq's retries; under
#   Sidekiq::Testing (fake) the default dead-set write is not made (no
#   Redis): raised into the test as before, unless the test set dead_set.
require "test_helper"
require "sidekiq"
require "pg_idempotency/sidekiq"
if Sidekiq.respond_to?(:testing!)   # Sidekiq 8: the test API without the deprecated require
  require "sidekiq/test_api"
else
  require "sidekiq/testing"          # 6.4, 7 (it sets fake! for the process)
end
Sidekiq::Testing.disable!            # the tests below choose a mode in a block

PgIdempotency::SidekiqCompat.logger = Logger.new(ENV["TEST_LOG"] || File::NULL)

class SidekiqMiddlewareTest < Minitest::Test
  include DatabaseTest
  include SidekiqJobs

  def prefix = "sidekiq_unit"

  def teardown
    super
    Thread.current[:idempotency_pg]&.close
    Thread.current[:idempotency_pg_beat]&.close
    Thread.current[:idempotency_pg] = Thread.current[:idempotency_pg_beat] = nil
  end


  # a connection that runs the first statement on the server (recorded:
  # autocommit), then loses the connection before the reply is read
  class LosesTheReply < PgIdempotency::Connection
    private

    def pg
      return super if @lost
      @lost = true
      real = PgIdempotency.connect(nil)
      Object.new.tap do |o|
        o.define_singleton_method(:exec_params) do |sql, params|
          real.exec_params(sql, params)
          real.close
          raise PG::ConnectionBad, "server closed the connection unexpectedly"
        end
      end
    end
  end

  # the claim is recorded and its reply lost; then the database cannot be
  # reached for a while: a refused connection, then PgBouncer's own error
  # (08P01) on a connection that still looks OK (a PgBouncer or PostgreSQL
  # restart). The claim is tried again with the same token until it works.
  class AwayForAWhile < PgIdempotency::Connection
    def initialize(dsn)
      super
      @tries = 0
    end

    private

    def pg
      @tries += 1
      case @tries
      when 1
        real = PgIdempotency.connect(nil)
        fake { |sql, params| real.exec_params(sql, params); real.close; raise PG::ConnectionBad, "server closed the connection unexpectedly" }
      when 2
        raise PG::ConnectionBad, "connection to server failed: Connection refused"
      when 3
        result = Object.new.tap { |r| r.define_singleton_method(:error_field) { |_f| "08P01" } }
        err = PG::ProtocolViolation.new("server login has been failing, try again later (server_login_retry)")
        err.define_singleton_method(:result) { result }
        @conn = fake { |_sql, _params| raise err }
      else
        super
      end
    end

    def fake(&exec)
      Object.new.tap do |o|
        o.define_singleton_method(:exec_params) { |sql, params| exec.call(sql, params) }
        o.define_singleton_method(:finished?) { false }
        o.define_singleton_method(:status) { PG::CONNECTION_OK }
        o.define_singleton_method(:close) { nil }
      end
    end
  end

  def test_unreachable_database_is_waited_out_with_the_same_token
    type = job_type("hold")
    Thread.current[:idempotency_pg] = AwayForAWhile.new(nil)
    seen, ran, scheduled = verdicts_of(type, "K7")
    assert ran
    # tries after 0, 0.1, 0.2 s: within "reconnect_for", here half the 1 s lease
    assert_equal ["claim error:again"] * 3 + ["run:work", "run:completed"], seen
    assert_equal [], scheduled
    assert_equal "completed #1", record(type, "K7")
  end

  def verdicts_of(type, key, **extra)
    seen = []
    klass = job_class(type, **extra)
    mw = PgIdempotency::SidekiqMiddleware.new(on_verdict: ->(e) { seen << "#{e['verdict']}:#{e['action']}" })
    ran = false
    mw.call(klass.new, { "args" => [key], "jid" => "j-#{key}" }, "q") { ran = true }
    [seen, ran, klass.scheduled]
  end

  def test_lost_reply_gets_its_claim_back
    type = job_type("hold")
    Thread.current[:idempotency_pg] = LosesTheReply.new(nil)
    seen, ran, scheduled = verdicts_of(type, "K4")
    assert ran
    assert_equal ["claim error:again", "run:work", "run:completed"], seen
    assert_equal [], scheduled
    assert_equal "completed #1", record(type, "K4")
  end

  def test_stuck_transaction_answers_in_progress_at_once
    type = job_type("hold")
    stuck = PG.connect
    stuck.exec("BEGIN")
    stuck.exec_params("SELECT idempotency.claim_operation($1, 'K5')", [type])
    t0 = Time.now
    seen, ran, scheduled = verdicts_of(type, "K5")
    assert_operator Time.now - t0, :<, 5   # not blocked by the open transaction
    refute ran
    assert_equal ["in_progress:retry"], seen
    assert_equal [[LEASE, "K5"]], scheduled
  ensure
    stuck&.exec("ROLLBACK")
    stuck&.close
  end

  def test_claim_wait_lock_timeout_is_re_enqueued_like_in_progress
    type = job_type("hold")
    stuck = PG.connect
    stuck.exec("BEGIN")
    stuck.exec_params("SELECT idempotency.claim_operation($1, 'K6')", [type])
    seen, ran, scheduled = verdicts_of(type, "K6", "claim_wait" => 0.2)
    refute ran
    assert_equal ["claim error:retry"], seen
    assert_equal [[LEASE, "K6"]], scheduled
    stuck.exec("ROLLBACK")
    # the connection is usable: the lock_timeout was local to the claim
    seen, ran, = verdicts_of(type, "K6", "claim_wait" => 0.2)
    assert ran
    assert_equal ["run:work", "run:completed"], seen
  ensure
    stuck&.close
  end

  # the middleware on a job of `klass` (job hash: jid and args plus
  # `extra`) with the dead-set write recorded: [seen, ran, dead, raised]
  def dead_run(klass, key, **extra)
    seen = []
    dead = []
    PgIdempotency::SidekiqMiddleware.dead_set = ->(job, err) { dead << [job, err] }
    mw = PgIdempotency::SidekiqMiddleware.new(on_verdict: ->(e) { seen << "#{e['verdict']}:#{e['action']}:#{e['sqlstate']}" })
    ran = false
    job = { "class" => "UnitJob", "args" => [key], "jid" => "j-#{key}", "queue" => "q" }.merge(extra)
    raised = nil
    begin
      mw.call(klass.new, job, "q") { ran = true }
    rescue StandardError => e
      raised = e
    end
    [seen, ran, dead, raised]
  ensure
    PgIdempotency::SidekiqMiddleware.dead_set = nil
  end

  def test_fingerprint_mismatch_goes_to_the_dead_set_at_once
    type = job_type("hold")
    @admin.exec_params("SELECT idempotency.claim_operation($1, 'K20', 'sha256:other', 'w')", [type])
    klass = job_class(type)
    t0 = Time.now.to_f
    seen, ran, dead, raised = dead_run(klass, "K20", "backtrace" => 3)
    assert_nil raised
    refute ran
    assert_equal ["claim error:dead:ID002"], seen
    assert_equal [], klass.scheduled
    assert_equal 1, dead.size
    job, err = dead.first
    assert_equal "ID002", PgIdempotency.sqlstate(err)
    assert_equal ["K20"], job["args"]
    assert_equal "j-K20", job["jid"]
    assert_equal "q", job["queue"]
    assert_equal err.class.name, job["error_class"]
    assert_match(/claimed with a different fingerprint/, job["error_message"])
    assert_equal 0, job["retry_count"]
    assert_operator job["failed_at"], :>=, PgIdempotency::SidekiqCompat::SIDEKIQ_8 ? (t0 * 1000).floor : t0
    refute job.key?("retried_at")
    lines = JSON.parse(Zlib::Inflate.inflate(job["error_backtrace"].unpack1("m0")))
    assert_equal 3, lines.size
    assert_equal "claimed #1", record(type, "K20")   # the other arguments' claim, untouched
  end

  # the middleware on a job whose perform raises PermanentFailure (the
  # provider said 422): [seen, dead, raised]
  def refused_run(klass, key, **extra)
    seen = []
    dead = []
    PgIdempotency::SidekiqMiddleware.dead_set = ->(job, err) { dead << [job, err] }
    mw = PgIdempotency::SidekiqMiddleware.new(on_verdict: ->(e) { seen << "#{e['verdict']}:#{e['action']}" })
    job = { "class" => "UnitJob", "args" => [key], "jid" => "j-#{key}", "queue" => "q" }.merge(extra)
    raised = nil
    begin
      mw.call(klass.new, job, "q") { raise PgIdempotency::PermanentFailure, "provider answered 422" }
    rescue StandardError => e
      raised = e
    end
    [seen, dead, raised]
  ensure
    PgIdempotency::SidekiqMiddleware.dead_set = nil
  end

  def test_permanent_failure_ends_the_operation_and_goes_to_the_dead_set
    type = job_type("retry")
    klass = job_class(type)
    seen, dead, raised = refused_run(klass, "K40")
    assert_nil raised
    assert_equal ["run:work", "run:dead"], seen
    assert_equal [], klass.scheduled   # no retry
    assert_equal 1, dead.size
    job, err = dead.first
    assert_kind_of PgIdempotency::PermanentFailure, err
    assert_equal ["PgIdempotency::PermanentFailure", "provider answered 422"], [job["error_class"], job["error_message"]]
    assert_equal "completed #1", record(type, "K40")
    result = @admin.exec_params("SELECT result::text FROM idempotency.operations WHERE job_type = $1 AND " \
                                "operation_key = 'K40'", [type]).getvalue(0, 0)
    assert_equal({ "permanent_failure" => "provider answered 422" }, JSON.parse(result))
    assert_equal "provider answered 422", PgIdempotency.permanent_failure_of(result)
    # a later delivery meets the ended operation: the dead set again, perform not run
    seen, dead, raised = refused_run(klass, "K40")
    assert_nil raised
    assert_equal ["completed:dead"], seen
    assert_equal 1, dead.size
    assert_equal "completed #1", record(type, "K40")
  end

  def test_permanent_failure_with_retry_false_raises_for_sidekiq_to_drop
    type = job_type("retry")
    seen, dead, raised = refused_run(job_class(type), "K41", "retry" => false)
    assert_kind_of PgIdempotency::PermanentFailure, raised
    assert_equal ["run:work", "run:failed permanently"], seen
    assert_equal [], dead
    assert_equal "completed #1", record(type, "K41")
  end

  def test_a_retried_job_dies_with_sidekiqs_retry_fields
    type = job_type("hold")
    @admin.exec_params("SELECT idempotency.claim_operation($1, 'K21', 'sha256:other', 'w')", [type])
    _seen, _ran, dead, = dead_run(job_class(type), "K21", "retry_count" => 2, "failed_at" => 1.0,
                                                         "retry_queue" => "later")
    job, = dead.first
    assert_equal [3, 1.0, "later"], [job["retry_count"], job["failed_at"], job["queue"]]
    assert_kind_of Numeric, job["retried_at"]   # Float s; from Sidekiq 8 on, integer ms
    refute job.key?("error_backtrace")
  end

  def test_bad_input_goes_to_the_dead_set_at_once
    type = job_type("hold")
    seen, ran, dead, raised = dead_run(job_class(type), "")   # an empty key: 22023
    assert_nil raised
    refute ran
    assert_equal ["claim error:dead:22023"], seen
    assert_equal ["22023"], dead.map { |_j, e| PgIdempotency.sqlstate(e) }
  end

  def test_death_handlers_and_retries_exhausted_see_the_dead_job
    type = job_type("hold")
    @admin.exec_params("SELECT idempotency.claim_operation($1, 'K22', 'sha256:other', 'w')", [type])
    exhausted = []
    klass = job_class(type)
    klass.sidekiq_retries_exhausted { |job, err| exhausted << [job["jid"], PgIdempotency.sqlstate(err)] }
    died = []
    handler = ->(job, err) { died << [job["jid"], job["error_class"], PgIdempotency.sqlstate(err)] }
    PgIdempotency::SidekiqCompat.death_handlers << handler
    _seen, _ran, dead, raised = dead_run(klass, "K22")
    assert_nil raised
    assert_equal 1, dead.size
    assert_equal [["j-K22", "ID002"]], exhausted
    assert_equal [["j-K22", dead.first[0]["error_class"], "ID002"]], died
  ensure
    PgIdempotency::SidekiqCompat.death_handlers.delete(handler)
  end

  def test_dead_false_keeps_the_job_out_of_the_dead_set
    type = job_type("hold")
    @admin.exec_params("SELECT idempotency.claim_operation($1, 'K23', 'sha256:other', 'w')", [type])
    seen, ran, dead, raised = dead_run(job_class(type), "K23", "dead" => false)
    assert_nil raised
    refute ran
    assert_equal ["claim error:dead:ID002"], seen
    assert_equal [], dead
  end

  # dead_run's result: the claim error `code` was raised (to Sidekiq's
  # retries, or for Sidekiq to drop), perform not called, no dead-set write
  def assert_raised_not_dead(result, code)
    seen, ran, dead, raised = result
    assert_kind_of PG::Error, raised
    assert_equal code, PgIdempotency.sqlstate(raised)
    refute ran
    assert_equal ["claim error:raise:#{code}"], seen
    assert_equal [], dead
  end

  def test_retry_false_raises_as_before
    type = job_type("hold")
    @admin.exec_params("SELECT idempotency.claim_operation($1, 'K24', 'sha256:other', 'w')", [type])
    assert_raised_not_dead(dead_run(job_class(type), "K24", "retry" => false), "ID002")
  end

  def test_an_error_that_may_heal_still_raises
    # the job type is not registered (ID001): a deployment may register it
    type = "sidekiq_unit_unregistered_#{Process.pid}"
    assert_raised_not_dead(dead_run(job_class(type), "K25"), "ID001")
  end

  def test_under_sidekiq_testing_the_default_raises_as_before
    type = job_type("hold")
    @admin.exec_params("SELECT idempotency.claim_operation($1, 'K26', 'sha256:other', 'w')", [type])
    refute PgIdempotency::SidekiqCompat.testing?
    Sidekiq::Testing.fake! do
      assert PgIdempotency::SidekiqCompat.testing?
      seen = []
      mw = PgIdempotency::SidekiqMiddleware.new(on_verdict: ->(e) { seen << "#{e['verdict']}:#{e['action']}" })
      err = assert_raises(PG::Error) do
        mw.call(job_class(type).new, { "args" => ["K26"], "jid" => "j-K26" }, "q") { flunk "performed" }
      end
      assert_equal "ID002", PgIdempotency.sqlstate(err)
      assert_equal ["claim error:raise"], seen
      # a dead set of the test's own is used there too
      seen, ran, dead, raised = dead_run(job_class(type), "K26")
      assert_nil raised
      refute ran
      assert_equal ["claim error:dead:ID002"], seen
      assert_equal 1, dead.size
    end
  end

  def test_the_default_dead_set_is_sidekiqs
    assert_same PgIdempotency::SidekiqMiddleware::DEAD_SET, PgIdempotency::SidekiqMiddleware.dead_set
  end

  # the middleware's fingerprint of UnitJob with args [key]
  def fp(key) = "sha256:" + Digest::SHA256.hexdigest(JSON.generate(["UnitJob", [key]]))

  def test_connection_closed_by_the_server_is_replaced
    c = PgIdempotency::Connection.new(nil)
    pid = terminate(c)
    # the old connection still looks fine to the client until it is used
    assert_equal "1", c.exec_params("SELECT 1", []).getvalue(0, 0)
    refute_equal pid, c.exec_params("SELECT pg_backend_pid()", []).getvalue(0, 0)
  ensure
    c&.close
  end

  def test_statement_error_is_not_repeated
    type = job_type("hold")
    c = PgIdempotency::Connection.new(nil)
    err = assert_raises(PG::Error) do
      c.exec_params("SELECT idempotency.claim_operation($1, '')", [type])   # an empty key: 22023
    end
    assert_equal "22023", PgIdempotency.sqlstate(err)
    assert c.healthy?
  ensure
    c&.close
  end

  def test_heartbeat_without_a_database_keeps_trying_and_never_raises
    tries = 0
    down = PgIdempotency::Connection.new("host=/nonexistent-idempotency-test port=1")
    beat = PgIdempotency::Heartbeat.new(down, 0.05) do |hb|
      tries += 1
      hb.exec_params("SELECT 1", [])
    end
    deadline = Time.now + 10
    sleep 0.02 while tries < 3 && Time.now < deadline
    beat.stop   # must not raise PG::ConnectionBad
    assert_operator tries, :>=, 3
  end

  def test_middleware_completes_although_the_heartbeat_cannot_connect
    type = job_type("hold")
    # this thread's heartbeat connection cannot be opened (too many
    # connections, a wrong host...); before, its error ended the heartbeat
    # thread and came back from Thread#join after perform had sent the email
    Thread.current[:idempotency_pg_beat] = PgIdempotency::Connection.new("host=/nonexistent-idempotency-test port=1")
    worker = job_class(type).new
    ran = false
    PgIdempotency::SidekiqMiddleware.new.call(worker, { "args" => ["K1"], "jid" => "j1" }, "q") do
      sleep LEASE / 2   # two beats fail meanwhile
      ran = true
    end
    assert ran
    assert_equal "completed #1", record(type, "K1")
  end

  def test_heartbeat_survives_a_closed_connection_and_keeps_the_lease
    type = job_type("hold")
    worker = job_class(type).new
    verdict = nil
    PgIdempotency::SidekiqMiddleware.new.call(worker, { "args" => ["K2"], "jid" => "j2" }, "q") do
      sleep LEASE / 3                                   # the first beat opened its connection
      terminate(Thread.current[:idempotency_pg_beat].send(:pg))   # the server closes it
      sleep LEASE                                       # without beats the claim would be stale
      verdict = @admin.exec_params("SELECT verdict FROM idempotency.claim_operation($1, 'K2', $2)",
                                   [type, fp("K2")]).getvalue(0, 0)
    rescue PG::Error => e
      verdict = e.message
    end
    # a stale claim under hold would be held: in_progress is the lease kept
    assert_equal "in_progress", verdict
    assert_equal "completed #1", record(type, "K2")
  end

  def test_verify_reaches_the_job
    type = job_type("lookup")
    # a worker claimed K3 and died; after the lease the next one gets verify
    @admin.exec_params("SELECT idempotency.claim_operation($1, 'K3', $2)", [type, fp("K3")])
    sleep LEASE + 0.1
    worker = job_class(type).new
    seen = nil
    PgIdempotency::SidekiqMiddleware.new.call(worker, { "args" => ["K3"], "jid" => "j3" }, "q") do
      seen = [worker.idempotency_verify?, worker.idempotency_attempt]
    end
    assert_equal [true, 2], seen
    assert_equal "completed #2", record(type, "K3")
  end
end
