# test_signoff.rb: the sign-off protocol (docs/signoff-protocol.md, version 1)
# in lib/pg_idempotency.rb (signoff_job_type, signoff_point) and in the
# Sidekiq middleware, against a fake runner: a UNIXServer in a thread that
# records each line and answers continue, fail, nothing, or kills the worker.
#
#   ruby -Ilib -Itest test/test_signoff.rb    # in helpers/ruby; the PG* environment
#
# - unset: no connection is attempted, one environment lookup per point;
# - the JSON line of each point; continue; fail at claimed releases the claim
#   without calling perform (as KnownFailure); fail at handled is an error;
# - claimed is inside the heartbeat and before perform, handled after perform
#   with the heartbeat stopped;
# - IDEMPOTENCY_SIGNOFF_JOB_TYPES: the records are written under the run's
#   job type (claim, extend_lease, complete, release), the user's has none; a
#   malformed map raises before anything is claimed;
# - an unreachable socket, a connection closed without an answer, another
#   answer: SignoffError;
# - a real kill: a forked worker is SIGKILLed by the runner at claimed (the
#   record stays claimed, perform never ran) and at handled (the effect
#   happened, the record is not completed).
require "test_helper"
require "minitest/mock"
require "tmpdir"
require "sidekiq"
require "pg_idempotency/sidekiq"

PgIdempotency::SidekiqCompat.logger = Logger.new(ENV["TEST_LOG"] || File::NULL)

# the runner's end of the socket: each connection's line is parsed and
# recorded, then answer.call(message) says what to do: a String is written
# back as the answer line, nil closes the connection without one (after
# killing the worker, say). The block may take its time (holding the worker).
class FakeRunner
  attr_reader :path

  def initialize(&answer)
    @answer = answer
    @dir = Dir.mktmpdir("signoff")
    @path = File.join(@dir, "runner.sock")
    @server = UNIXServer.new(@path)
    @mutex = Mutex.new
    @raw = []
    @errors = []
    @thread = Thread.new do
      loop do
        conn = @server.accept
        Thread.new(conn) { |c| exchange(c) }
      end
    rescue IOError, SystemCallError
      nil   # closed by stop
    end
  end

  # the lines received, as sent
  def raw = @mutex.synchronize { @raw.dup }

  def messages = raw.map { |l| JSON.parse(l) }

  def stop
    @server.close
    @thread.join
    FileUtils.rm_rf(@dir)
    raise @errors.first unless @errors.empty?
  end

  private

  def exchange(conn)
    line = conn.gets
    @mutex.synchronize { @raw << line }
    reply = @answer.call(JSON.parse(line))
    conn.write("#{reply}\n") if reply
  rescue StandardError, Minitest::Assertion => e
    @mutex.synchronize { @errors << e }
  ensure
    conn.close
  end
end

class SignoffTest < Minitest::Test
  include DatabaseTest
  include SidekiqJobs

  def prefix = "signoff_unit"

  VARS = %w[IDEMPOTENCY_SIGNOFF IDEMPOTENCY_SIGNOFF_JOB_TYPES IDEMPOTENCY_SIGNOFF_LEASE
            IDEMPOTENCY_SIGNOFF_HELLO IDEMPOTENCY_SIGNOFF_ENDED].freeze

  def setup
    super
    @saved = VARS.to_h { |v| [v, ENV.delete(v)] }
    @runner = nil
    PgIdempotency.instance_variable_set(:@hello_pid, nil)
    Thread.current[:idempotency_pg] = Thread.current[:idempotency_pg_beat] = nil
  end

  def teardown
    @runner&.stop
    VARS.each { |v| ENV[v] = @saved[v] }
    Thread.current[:idempotency_pg]&.close
    Thread.current[:idempotency_pg_beat]&.close
    Thread.current[:idempotency_pg] = Thread.current[:idempotency_pg_beat] = nil
    PgIdempotency::SidekiqMiddleware.dead_set = nil
    super
  end

  # a runner answering with the block; IDEMPOTENCY_SIGNOFF points at it
  def runner(&answer)
    @runner = FakeRunner.new(&answer)
    ENV["IDEMPOTENCY_SIGNOFF"] = @runner.path
    @runner
  end

  def job_class(type, **extra) = super(type, name: "SignoffJob", **extra)

  # the middleware on the job of `key` (perform: the block); the events
  def run_job(klass, key, &perform)
    seen = []
    mw = PgIdempotency::SidekiqMiddleware.new(on_verdict: ->(e) { seen << "#{e['verdict']}:#{e['action']}" })
    mw.call(klass.new, { "args" => [key], "jid" => "j-#{key}" }, "q", &perform)
    seen
  ensure
    @seen = seen
  end

  # the user's job type (hold) and the run's (retry), mapped by the variable
  def mapped_types
    yours = job_type("hold")
    runs = job_type("retry", name: "signoff_run")
    ENV["IDEMPOTENCY_SIGNOFF_JOB_TYPES"] = "other=signoff_other,#{yours}=#{runs}"
    [yours, runs]
  end

  def heartbeat_at(type, key)
    @admin.exec_params("SELECT heartbeat_at FROM idempotency.operations WHERE job_type = $1 AND operation_key = $2",
                       [type, key]).getvalue(0, 0)
  end

  def test_unset_is_one_environment_lookup_and_no_connection
    lookups = []
    ENV.stub(:[], ->(name) { lookups << name; nil }) do
      assert_equal :continue, PgIdempotency.signoff_point(:claimed, "t", "k", attempt: 1, verdict: "run", heartbeat: true)
    end
    assert_equal ["IDEMPOTENCY_SIGNOFF"], lookups
    type = job_type("hold")
    ran = false
    connect = ->(*) { flunk "connected although IDEMPOTENCY_SIGNOFF is unset" }
    UNIXSocket.stub(:open, connect) do
      UNIXSocket.stub(:new, connect) do
        Socket.stub(:unix, connect) do
          run_job(job_class(type), "S0") { ran = true }
        end
      end
    end
    assert ran
    assert_equal ["run:work", "run:completed"], @seen
    assert_equal "completed #1", record(type, "S0")
    assert_equal type, PgIdempotency.signoff_job_type(type)
  end

  def test_the_lines_and_continue
    type = job_type("hold")
    ran = 0
    r = runner { |_m| "continue" }
    run_job(job_class(type), "S1") { ran += 1 }
    assert_equal 1, ran
    assert_equal ["run:work", "run:completed"], @seen
    assert_equal "completed #1", record(type, "S1")
    line = { "v" => 1, "job_type" => type, "key" => "S1", "attempt" => 1, "verdict" => "run",
             "pid" => Process.pid, "heartbeat" => true }
    assert_equal [line.merge("point" => "claimed"), line.merge("point" => "handled")], r.messages
    r.raw.each { |l| assert_match(/\A\{[^\n]*\}\n\z/, l) }   # one line of JSON each
    assert_equal %w[v point job_type key attempt verdict pid heartbeat], r.messages.first.keys
  end

  def test_verify_is_sent_with_its_attempt
    type = job_type("lookup")
    fp = "sha256:" + Digest::SHA256.hexdigest(JSON.generate(["SignoffJob", ["S2"]]))
    @admin.exec_params("SELECT idempotency.claim_operation($1, 'S2', $2)", [type, fp])
    sleep LEASE + 0.1   # the first claim went stale: lookup gives verify
    r = runner { |_m| "continue" }
    run_job(job_class(type), "S2") {}
    assert_equal [%w[claimed verify 2], %w[handled verify 2]],
                 r.messages.map { |m| [m["point"], m["verdict"], m["attempt"].to_s] }
    assert_equal "completed #2", record(type, "S2")
  end

  def test_claimed_inside_the_heartbeat_and_handled_after_it_under_the_runs_job_type
    yours, runs = mapped_types
    performed = false
    beating = stopped = nil
    r = runner do |m|
      if m["point"] == "claimed"
        refute performed
        # the runner holds the worker: the heartbeat keeps the run's record young
        t0 = heartbeat_at(runs, "S3")
        deadline = Time.now + 10
        sleep 0.01 until heartbeat_at(runs, "S3") > t0 || Time.now > deadline
        beating = heartbeat_at(runs, "S3") > t0
      else
        assert performed
        t0 = heartbeat_at(runs, "S3")
        sleep 0.3   # six beats if the heartbeat were still running
        stopped = heartbeat_at(runs, "S3") == t0
        assert_equal "claimed #1", record(runs, "S3")   # not completed yet
      end
      "continue"
    end
    run_job(job_class(yours, "heartbeat" => 0.05), "S3") { performed = true }
    assert beating, "no extend_lease of the run's record while held at claimed"
    assert stopped, "extend_lease while held at handled"
    assert_equal [runs, runs], r.messages.map { |m| m["job_type"] }
    assert_equal "completed #1", record(runs, "S3")
    assert_equal "none", record(yours, "S3")
  end

  def fingerprint_of(key) = "sha256:" + Digest::SHA256.hexdigest(JSON.generate(["SignoffJob", [key]]))

  def test_judged_reports_every_other_answer
    yours, runs = mapped_types
    r = runner { |_m| "continue" }
    klass = job_class(yours)
    run_job(klass, "S7") {}
    run_job(klass, "S7") { flunk "performed a completed job" }                 # completed
    @admin.exec_params("SELECT idempotency.claim_operation($1, 'S8', $2, 'dead-worker')", [runs, fingerprint_of("S8")])
    run_job(klass, "S8") { flunk "performed a claimed job" }                    # in_progress
    @admin.exec_params("SELECT idempotency.claim_operation($1, 'S9', 'sha256:other', 'w')", [runs])
    # ID002 cannot heal: the job goes to the dead set at once, nothing raised
    dead = []
    PgIdempotency::SidekiqMiddleware.dead_set = ->(job, e) { dead << [job["jid"], PgIdempotency.sqlstate(e)] }
    run_job(klass, "S9") { flunk "performed" }
    assert_equal ["claim error:dead"], @seen
    assert_equal [["j-S9", "ID002"]], dead
    got = r.messages.map { |m| [m["point"], m["key"], m["verdict"], m["attempt"], m.fetch("sqlstate", "-")] }
    assert_equal [["claimed", "S7", "run", 1, "-"], ["handled", "S7", "run", 1, "-"],
                  ["judged", "S7", "completed", 1, "-"], ["judged", "S8", "in_progress", 1, "-"],
                  ["judged", "S9", "error", nil, "ID002"]], got
    assert_equal [runs], r.messages.map { |m| m["job_type"] }.uniq
    @runner.stop
    runner { |_m| "fail" }
    err = assert_raises(PgIdempotency::SignoffError) do   # judged takes continue only
      PgIdempotency.signoff_point(:judged, yours, "S9", attempt: nil, verdict: "error", sqlstate: "ID002")
    end
    assert_match(/point judged of .*: unexpected answer "fail" \(expected continue\)\z/, err.message)
  end

  def test_the_runs_lease_sets_the_timings
    yours, runs = mapped_types
    ENV["IDEMPOTENCY_SIGNOFF_LEASE"] = "0.4"
    beating = nil
    runner do |m|
      if m["point"] == "claimed"
        # the job's own lease is 600 s (a heartbeat every 150 s); the run's,
        # 0.4 s, makes it one every 0.1 s
        t0 = heartbeat_at(runs, "S10")
        deadline = Time.now + 5
        sleep 0.01 until heartbeat_at(runs, "S10") > t0 || Time.now > deadline
        beating = heartbeat_at(runs, "S10") > t0
      end
      "continue"
    end
    klass = job_class(yours, "lease" => 600)
    run_job(klass, "S10") {}
    assert beating, "no extend_lease within 5 s at the run's lease of 0.4 s"
    @admin.exec_params("SELECT idempotency.claim_operation($1, 'S11', $2, 'dead-worker')", [runs, fingerprint_of("S11")])
    run_job(klass, "S11") {}
    assert_equal [[0.4, "S11"]], klass.scheduled   # in_progress: looked at again after the run's lease
    ["0", "-1", "soon", "NaN"].each do |bad|
      ENV["IDEMPOTENCY_SIGNOFF_LEASE"] = bad
      err = assert_raises(PgIdempotency::SignoffError) { run_job(klass, "S12") { flunk "performed" } }
      assert_match(/IDEMPOTENCY_SIGNOFF_LEASE/, err.message)
    end
    assert_equal "none", record(runs, "S12")
  end

  def test_fail_at_claimed_releases_without_perform
    yours, runs = mapped_types
    r = runner { |_m| "fail" }
    klass = job_class(yours)
    ran = false
    run_job(klass, "S4") { ran = true }
    refute ran
    assert_equal ["run:work", "run:released"], @seen
    assert_equal "released #1", record(runs, "S4")
    assert_equal "none", record(yours, "S4")
    assert_equal ["claimed"], r.messages.map { |m| m["point"] }
    assert_equal 1, klass.scheduled.size   # re-enqueued after a backoff, as for KnownFailure
    delay, key = klass.scheduled.first
    assert_equal "S4", key
    assert_operator delay, :<=, LEASE / 2
  end

  def test_fail_at_handled_is_an_error
    type = job_type("hold")
    runner { |m| m["point"] == "claimed" ? "continue" : "fail" }
    ran = false
    err = assert_raises(PgIdempotency::SignoffError) { run_job(job_class(type), "S5") { ran = true } }
    assert_match(/point handled of .*: unexpected answer "fail" \(expected continue\)\z/, err.message)
    assert ran
    assert_equal ["run:work", "run:failed"], @seen
    assert_equal "claimed #1", record(type, "S5")   # left to its lease
  end

  def test_plain_calls_use_the_runs_job_type
    yours, runs = mapped_types
    assert_equal runs, PgIdempotency.signoff_job_type(yours)
    assert_equal "not_mapped", PgIdempotency.signoff_job_type("not_mapped")
    db = PgIdempotency::Connection.new
    c = PgIdempotency.claim(db, yours, "S6")
    assert_equal "claimed #1", record(runs, "S6")
    PgIdempotency.extend_lease(db, yours, "S6", c.attempt)
    PgIdempotency.release(db, yours, "S6", c.attempt)
    assert_equal "released #1", record(runs, "S6")
    c = PgIdempotency.claim(db, yours, "S6")
    PgIdempotency.complete(db, yours, "S6", c.attempt)
    assert_equal "completed #2", record(runs, "S6")
    assert_equal "none", record(yours, "S6")
  ensure
    db&.close
  end

  # the plain claim reports judged itself, once per answer that runs nothing
  def test_plain_claim_reports_judged
    yours, runs = mapped_types
    r = runner { |_m| "continue" }
    db = PgIdempotency::Connection.new
    c = PgIdempotency.claim(db, yours, "S13", fingerprint: "fp")
    assert_equal ["run", []], [c.verdict, r.messages]
    assert_equal "in_progress", PgIdempotency.claim(db, yours, "S13", fingerprint: "fp").verdict
    PgIdempotency.complete(db, yours, "S13", c.attempt)
    assert_equal "completed", PgIdempotency.claim(db, yours, "S13", fingerprint: "fp").verdict
    err = assert_raises(PG::Error) { PgIdempotency.claim(db, yours, "S13", fingerprint: "other") }
    assert_equal "ID002", PgIdempotency.sqlstate(err)
    stuck = PG.connect
    stuck.exec("BEGIN")
    stuck.exec_params("SELECT idempotency.claim_operation($1, 'S14', 'fp', 'stuck')", [runs])
    err = assert_raises(PG::Error) { PgIdempotency.claim(db, yours, "S14", fingerprint: "fp", wait: 0.05) }
    assert PgIdempotency.busy?(err)
    base = { "v" => 1, "point" => "judged", "job_type" => runs, "pid" => Process.pid, "heartbeat" => false }
    assert_equal [base.merge("key" => "S13", "attempt" => 1, "verdict" => "in_progress"),
                  base.merge("key" => "S13", "attempt" => 1, "verdict" => "completed"),
                  base.merge("key" => "S13", "attempt" => nil, "verdict" => "error", "sqlstate" => "ID002",
                             "message" => "operation \"S13\" of job type \"#{runs}\" was claimed with a different fingerprint"),
                  base.merge("key" => "S14", "attempt" => nil, "verdict" => "busy", "sqlstate" => "55P03")],
                 r.messages
  ensure
    stuck&.exec("ROLLBACK")
    stuck&.close
    db&.close
  end

  # every claim error is judged, verdict error, with its SQLSTATE and
  # message: a role without the grant (42501; the batch: each key), an
  # unknown job type (ID001), a connection that does not come back within
  # reconnect_for (no SQLSTATE)
  def test_claim_errors_reach_the_runner
    type = job_type("hold")
    role = "rb_unit_nogrant_#{Process.pid}"
    @admin.exec("DROP ROLE IF EXISTS #{role}")
    @admin.exec("CREATE ROLE #{role} LOGIN")
    r = runner { |_m| "continue" }
    nogrant = PgIdempotency::Connection.new("user=#{role}")
    err = assert_raises(PG::Error) { PgIdempotency.claim(nogrant, type, "S20", fingerprint: "fp") }
    assert_equal "42501", PgIdempotency.sqlstate(err)
    err = assert_raises(PG::Error) { PgIdempotency.claim_batch(nogrant, type, %w[S21 S22]) }
    assert_equal "42501", PgIdempotency.sqlstate(err)
    db = PgIdempotency::Connection.new
    err = assert_raises(PG::Error) { PgIdempotency.claim(db, "rb_unit_no_such_type", "S23", fingerprint: "fp") }
    assert_equal "ID001", PgIdempotency.sqlstate(err)
    lost = PgIdempotency::Connection.new("host=/nonexistent-socket-dir port=1")
    assert_raises(PG::Error) { PgIdempotency.claim(lost, type, "S24", fingerprint: "fp", reconnect_for: 0) }
    denied = "permission denied for schema idempotency"
    got = r.messages.map { |m| [m["point"], m["key"], m["verdict"], m["attempt"], m["sqlstate"], m["message"]] }
    assert_equal [["judged", "S20", "error", nil, "42501", denied],
                  ["judged", "S21", "error", nil, "42501", denied],
                  ["judged", "S22", "error", nil, "42501", denied],
                  ["judged", "S23", "error", nil, "ID001", "job type \"rb_unit_no_such_type\" is not registered"]],
                 got[0, 4]
    assert_equal ["judged", "S24", "error", nil, nil], got[4][0, 5]
    assert_match(/nonexistent-socket-dir|connection/, got[4][5])
    refute_includes got[4][5], "\n"
    assert_equal 5, got.size
  ensure
    nogrant&.close
    db&.close
    @admin.exec("DROP ROLE IF EXISTS #{role}") if role
  end

  # with IDEMPOTENCY_SIGNOFF_HELLO=1 the process's first exchange is the
  # point hello: the helper, the runtime, Sidekiq (loaded by these tests)
  # and the database of the claim's connection; once per process
  def test_hello_once_per_process
    type = job_type("hold")
    r = runner { |_m| "continue" }
    ENV["IDEMPOTENCY_SIGNOFF_HELLO"] = "1"
    db = PgIdempotency::Connection.new
    c = PgIdempotency.claim(db, type, "S30", fingerprint: "fp")
    PgIdempotency.signoff_point(:claimed, type, "S30", attempt: c.attempt, verdict: c.verdict)
    assert_equal "in_progress", PgIdempotency.claim(db, type, "S30", fingerprint: "fp").verdict
    assert_equal %w[hello claimed judged], r.messages.map { |m| m["point"] }
    database, port, sysid = @admin.exec(PgIdempotency::DATABASE_SQL).values.first
    assert_equal({ "v" => 1, "point" => "hello", "pid" => Process.pid, "helper" => "pg-idempotency",
                   "helper_version" => PgIdempotency::VERSION, "runtime" => RUBY_ENGINE,
                   "runtime_version" => RUBY_VERSION, "queue_library" => "sidekiq",
                   "queue_library_version" => Sidekiq::VERSION, "database" => database,
                   "server_port" => port&.to_i, "system_identifier" => sysid, "wrapper" => "plain" },
                 r.messages.first)
    assert_match(/\A\d+\z/, sysid)
  ensure
    db&.close
  end

  # the hello's wrapper: the Sidekiq middleware names itself; claim_batch
  # says plain_batch; a block of signoff_wrapper names a wrapper of one's
  # own, and ends with the block
  def test_hello_names_the_wrapper
    type = job_type("hold")
    r = runner { |_m| "continue" }
    ENV["IDEMPOTENCY_SIGNOFF_HELLO"] = "1"
    run_job(job_class(type), "S32") { nil }
    assert_equal %w[hello claimed handled], r.messages.map { |m| m["point"] }
    assert_equal %w[SidekiqMiddleware sidekiq], r.messages.first.values_at("wrapper", "queue_library")
    assert_nil PgIdempotency.signoff_wrapper_name
    db = PgIdempotency::Connection.new
    PgIdempotency.instance_variable_set(:@hello_pid, nil)   # as a new process
    PgIdempotency.claim_batch(db, type, %w[S33 S34])
    assert_equal "plain_batch", r.messages.last["wrapper"]
    PgIdempotency.instance_variable_set(:@hello_pid, nil)
    PgIdempotency.signoff_wrapper("MyConsumer") { PgIdempotency.claim(db, type, "S35") }
    assert_equal "MyConsumer", r.messages.last["wrapper"]
    assert_nil PgIdempotency.signoff_wrapper_name
  ensure
    db&.close
  end

  # with IDEMPOTENCY_SIGNOFF_ENDED=1 a PermanentFailure sends the point
  # ended after claimed, before its completion (the record still claimed),
  # with the refusal and how the job then ends; without it, none
  def test_ended_before_a_permanent_failures_completion
    yours, runs = mapped_types
    seen = {}
    r = runner do |m|
      seen[:record] = record(runs, m["key"]) if m["point"] == "ended"
      "continue"
    end
    ENV["IDEMPOTENCY_SIGNOFF_ENDED"] = "1"
    PgIdempotency::SidekiqMiddleware.dead_set = ->(_job, _err) {}
    run_job(job_class(yours), "S50") { raise PgIdempotency::PermanentFailure, "provider answered 422" }
    assert_equal %w[claimed ended], r.messages.map { |m| m["point"] }
    assert_equal({ "v" => 1, "point" => "ended", "job_type" => runs, "key" => "S50", "attempt" => 1,
                   "pid" => Process.pid, "ending" => "PermanentFailure",
                   "delivery" => "the job in Sidekiq's dead set, not retried",
                   "message" => "provider answered 422" }, r.messages.last)
    assert_equal({ record: "claimed #1" }, seen)
    assert_equal "completed #1", record(runs, "S50")
    ENV.delete("IDEMPOTENCY_SIGNOFF_ENDED")
    run_job(job_class(yours), "S51") { raise PgIdempotency::PermanentFailure, "provider answered 422" }
    assert_equal %w[claimed ended claimed], r.messages.map { |m| m["point"] }
  ensure
    PgIdempotency::SidekiqMiddleware.dead_set = nil
  end

  # an older runner exports no IDEMPOTENCY_SIGNOFF_HELLO (and would refuse
  # the point): no hello
  def test_no_hello_for_a_runner_that_does_not_ask
    type = job_type("hold")
    r = runner { |_m| "continue" }
    db = PgIdempotency::Connection.new
    c = PgIdempotency.claim(db, type, "S31", fingerprint: "fp")
    PgIdempotency.signoff_point(:claimed, type, "S31", attempt: c.attempt, verdict: c.verdict)
    assert_equal %w[claimed], r.messages.map { |m| m["point"] }
  ensure
    db&.close
  end

  def test_malformed_map_raises_before_anything_is_claimed
    type = job_type("hold")
    r = runner { |_m| "continue" }
    ["#{type}", "#{type}=", "=#{type}", "#{type}=x,", "#{type}=x,,y=z", "#{type}=x,#{type}=y"].each do |spec|
      ENV["IDEMPOTENCY_SIGNOFF_JOB_TYPES"] = spec
      err = assert_raises(PgIdempotency::SignoffError, spec) { PgIdempotency.signoff_job_type("unrelated") }
      assert_match(/IDEMPOTENCY_SIGNOFF_JOB_TYPES: malformed entry/, err.message)
      db = PgIdempotency::Connection.new
      assert_raises(PgIdempotency::SignoffError, spec) { PgIdempotency.claim(db, type, "S7") }
      db.close
      ran = false
      assert_raises(PgIdempotency::SignoffError, spec) { run_job(job_class(type), "S7") { ran = true } }
      refute ran
      assert_equal "none", record(type, "S7"), spec
    end
    assert_equal [], r.raw
  end

  def test_unreachable_socket_raises
    type = job_type("hold")
    ENV["IDEMPOTENCY_SIGNOFF"] = File.join(Dir.tmpdir, "no-such-signoff-runner-#{Process.pid}.sock")
    ran = false
    err = assert_raises(PgIdempotency::SignoffError) { run_job(job_class(type), "S8") { ran = true } }
    assert_match(/no-such-signoff-runner/, err.message)
    refute ran
    assert_equal ["run:work", "run:failed"], @seen
    assert_equal "claimed #1", record(type, "S8")
  end

  def test_closed_without_an_answer_or_another_answer_raises
    runner { |m| m["key"] == "closed" ? nil : "maybe" }
    err = assert_raises(PgIdempotency::SignoffError) do
      PgIdempotency.signoff_point(:claimed, "t", "closed", attempt: 1, verdict: "run", heartbeat: false)
    end
    assert_match(/without an answer/, err.message)
    err = assert_raises(PgIdempotency::SignoffError) do
      PgIdempotency.signoff_point(:handled, "t", "other", attempt: 1, verdict: "run", heartbeat: false)
    end
    assert_match(/point handled of t\/other: unexpected answer "maybe" \(expected continue\)\z/, err.message)
    assert_equal [false, false], @runner.messages.map { |m| m["heartbeat"] }
    assert_raises(ArgumentError) do
      PgIdempotency.signoff_point(:started, "t", "k", attempt: 1, verdict: "run", heartbeat: false)
    end
    assert_equal 2, @runner.raw.size   # the bad point was not sent
  end

  # a forked worker runs the middleware (perform writes the effect file);
  # the runner SIGKILLs it at `point`; the child's exit status
  def killed_at(point, type, key, effect)
    killed = nil
    r = runner do |m|
      next "continue" unless m["point"] == point
      killed = m["pid"]
      Process.kill(:KILL, m["pid"])
      nil   # no answer: the worker is dead
    end
    pid = fork do
      Thread.current[:idempotency_pg] = Thread.current[:idempotency_pg_beat] = nil
      PgIdempotency::SidekiqMiddleware.new.call(job_class(type).new, { "args" => [key], "jid" => "j" }, "q") do
        File.write(effect, "sent")
      end
      exit!(0)
    rescue Exception => e # rubocop:disable Lint/RescueException
      $stderr.puts "worker: #{e.class}: #{e.message}"   # warn is silent under -W0
      exit!(1)
    end
    deadline = Time.now + 30
    status = nil
    loop do
      _, status = Process.wait2(pid, Process::WNOHANG)
      break if status
      if Time.now > deadline
        Process.kill(:KILL, pid)
        Process.wait(pid)
        flunk "the worker was not killed at #{point}"
      end
      sleep 0.01
    end
    assert status.signaled?, "the worker exited (#{status.inspect}) instead of being killed at #{point}"
    assert_equal Signal.list["KILL"], status.termsig
    assert_equal pid, killed
    [r.messages.map { |m| m["point"] }, status]
  end

  def test_killed_at_claimed
    type = job_type("hold")
    effect = File.join(Dir.tmpdir, "signoff-effect-#{Process.pid}-claimed")
    points, = killed_at("claimed", type, "S9", effect)
    assert_equal ["claimed"], points
    refute File.exist?(effect), "perform ran before claimed"
    assert_equal "claimed #1", record(type, "S9")
  ensure
    File.delete(effect) if effect && File.exist?(effect)
  end

  def test_killed_at_handled
    type = job_type("hold")
    effect = File.join(Dir.tmpdir, "signoff-effect-#{Process.pid}-handled")
    points, = killed_at("handled", type, "S10", effect)
    assert_equal %w[claimed handled], points
    assert_equal "sent", File.read(effect)   # the effect happened
    assert_equal "claimed #1", record(type, "S10")   # and was never completed
  ensure
    File.delete(effect) if effect && File.exist?(effect)
  end
end
