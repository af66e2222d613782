# test_pg_idempotency.rb: the plain calls of lib/pg_idempotency.rb (no queue
# system): claim / complete / release / extend_lease on a
# PgIdempotency::Connection, the delivery token after a lost reply, the
# bound on a claim that meets another transaction's claim, and which errors
# count as a lost connection.
#
#   ruby -Ilib -Itest test/test_pg_idempotency.rb   # in helpers/ruby; the PG* environment
require "test_helper"

class PgIdempotencyTest < Minitest::Test
  include DatabaseTest

  def setup
    super
    @db = PgIdempotency::Connection.new
  end

  def teardown
    @db.close
    super
  end

  def test_version
    assert_equal "0.5.1", PgIdempotency::VERSION
    assert_equal "0.3", PgIdempotency::EXTENSION_VERSION
  end

  def test_claim_complete_and_the_next_claim_sees_completed
    type = job_type("hold")
    c = PgIdempotency.claim(@db, type, "P1", fingerprint: "sha256:a", worker: "unit")
    assert_equal ["run", 1], [c.verdict, c.attempt]
    assert c.run?
    refute c.verify?
    assert_match(/\A\h{8}-\h{4}-\h{4}-\h{4}-\h{12}\z/, c.delivery)
    assert_nil PgIdempotency.complete(@db, type, "P1", c.attempt, { "id" => 42 })
    assert_equal "completed #1", record(type, "P1")
    again = PgIdempotency.claim(@db, type, "P1", fingerprint: "sha256:a")
    assert_equal ["completed", 1], [again.verdict, again.attempt]
    refute again.run?
    assert_equal({ "id" => 42 }, JSON.parse(again.result))
    # complete is a no-op when repeated
    PgIdempotency.complete(@db, type, "P1", c.attempt, { "id" => 42 })
    assert_equal "completed #1", record(type, "P1")
  end

  def test_another_fingerprint_is_refused
    type = job_type("hold")
    PgIdempotency.claim(@db, type, "P2", fingerprint: "sha256:a")
    err = assert_raises(PG::Error) { PgIdempotency.claim(@db, type, "P2", fingerprint: "sha256:b") }
    assert_equal "ID002", PgIdempotency.sqlstate(err)
    refute PgIdempotency.busy?(err)
    refute PgIdempotency.connection_error?(err)
    assert @db.healthy?   # a statement's error: the connection stays
  end

  def test_release_then_the_next_claim_runs_the_next_attempt
    type = job_type("hold")
    c = PgIdempotency.claim(@db, type, "P3")
    assert_nil PgIdempotency.release(@db, type, "P3", c.attempt)
    assert_equal "released #1", record(type, "P3")
    c2 = PgIdempotency.claim(@db, type, "P3")
    assert_equal ["run", 2], [c2.verdict, c2.attempt]
  end

  def test_extend_lease_keeps_the_claim
    type = job_type("hold")
    c = PgIdempotency.claim(@db, type, "P4")
    3.times do
      sleep LEASE / 2
      PgIdempotency.extend_lease(@db, type, "P4", c.attempt)
    end
    # past its first lease, but beaten: another claim is in_progress, not held
    other = PgIdempotency.claim(PgIdempotency::Connection.new, type, "P4")
    assert_equal "in_progress", other.verdict
  end

  def test_stale_claim_under_lookup_is_verify
    type = job_type("lookup")
    PgIdempotency.claim(@db, type, "P5")
    sleep LEASE + 0.1
    c = PgIdempotency.claim(@db, type, "P5")
    assert_equal ["verify", 2], [c.verdict, c.attempt]
    assert c.run?
    assert c.verify?
  end

  def test_another_transactions_claim_in_progress_at_once_or_busy_with_wait
    type = job_type("hold")
    stuck = PG.connect
    stuck.exec("BEGIN")
    stuck.exec_params("SELECT idempotency.claim_operation($1, 'P6')", [type])
    t0 = Time.now
    assert_equal "in_progress", PgIdempotency.claim(@db, type, "P6").verdict
    assert_operator Time.now - t0, :<, 5
    err = assert_raises(PG::Error) { PgIdempotency.claim(@db, type, "P6", wait: 0.2) }
    assert_equal "55P03", PgIdempotency.sqlstate(err)
    assert PgIdempotency.busy?(err)
    stuck.exec("ROLLBACK")
    # the lock_timeout was local to the claim's transaction
    assert_equal "0", @db.exec_params("SHOW lock_timeout", []).getvalue(0, 0)
    assert_equal "run", PgIdempotency.claim(@db, type, "P6", wait: 0.2).verdict
  ensure
    stuck&.close
  end

  # the first statement runs on the server (recorded: autocommit), then the
  # connection is lost before the reply is read
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

  def test_lost_reply_gets_its_claim_back_with_the_same_token
    type = job_type("hold")
    db = LosesTheReply.new
    errors = []
    c = PgIdempotency.claim(db, type, "P7", on_reconnect: ->(e) { errors << e.class })
    assert_equal [PG::ConnectionBad], errors
    assert_equal ["run", 1], [c.verdict, c.attempt]   # not in_progress: the same token
    # the same claim with another token (another delivery) is in_progress;
    # with this one's token it is this claim again
    assert_equal "in_progress", PgIdempotency.claim(@db, type, "P7").verdict
    again = PgIdempotency.claim(@db, type, "P7", delivery: c.delivery)
    assert_equal ["run", 1], [again.verdict, again.attempt]
  ensure
    db&.close
  end

  def test_a_connection_that_stays_lost_raises_after_within
    db = PgIdempotency::Connection.new("host=/nonexistent-idempotency-test port=1")
    tries = 0
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    assert_raises(PG::ConnectionBad) do
      PgIdempotency.claim(db, "any", "P8", within: 0.5, on_reconnect: ->(_e) { tries += 1 })
    end
    took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
    assert_operator tries, :>=, 3    # at once, after 0.1, 0.2 ...
    assert_operator took, :<, 3
  end

  def fake_error(code)
    result = Object.new.tap { |r| r.define_singleton_method(:error_field) { |_f| code } }
    PG::Error.new("x").tap { |e| e.define_singleton_method(:result) { result } }
  end

  def test_which_errors_are_a_lost_connection
    %w[08000 08006 08P01 57P01 57P02 57P03].each { |c| assert PgIdempotency.connection_error?(fake_error(c)), c }
    %w[22023 ID002 ID003 55P03 57014 40001].each { |c| refute PgIdempotency.connection_error?(fake_error(c)), c }
    assert PgIdempotency.busy?(fake_error("55P03"))
    assert PgIdempotency.busy?(fake_error("57014"))
    refute PgIdempotency.busy?(fake_error("08P01"))
    refute PgIdempotency.connection_error?(PG::ConnectionBad.new("no result"))
  end

  def test_claim_error_heals_and_worker_id
    refute PgIdempotency.claim_error_heals?(fake_error("ID002"))
    refute PgIdempotency.claim_error_heals?(fake_error("22023"))
    %w[42501 40001 55P03 08006].each { |c| assert PgIdempotency.claim_error_heals?(fake_error(c)), c }
    assert PgIdempotency.claim_error_heals?(PG::ConnectionBad.new("no result"))
    assert_equal "#{Socket.gethostname}/pid-#{Process.pid}", PgIdempotency.worker_id
  end

  def test_the_new_names_reconnect_for_and_on_lost
    type = job_type("hold")
    db = LosesTheReply.new
    errors = []
    c = PgIdempotency.claim(db, type, "P9", on_lost: ->(e) { errors << e.class })
    assert_equal [PG::ConnectionBad], errors
    assert_equal ["run", 1], [c.verdict, c.attempt]
    assert_equal "#{Socket.gethostname}/pid-#{Process.pid}",
                 @admin.exec_params("SELECT claimed_by FROM idempotency.operations WHERE job_type = $1 " \
                                    "AND operation_key = 'P9'", [type]).getvalue(0, 0)   # worker_id by default
    gone = PgIdempotency::Connection.new("host=/nonexistent-idempotency-test port=1")
    tries = 0
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    assert_raises(PG::ConnectionBad) do
      PgIdempotency.complete(gone, type, "P9", 1, reconnect_for: 0.5, on_lost: ->(_e) { tries += 1 })
    end
    assert_operator tries, :>=, 3
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0, :<, 3
    tries = 0
    assert_raises(PG::ConnectionBad) { gone.with_reconnect(reconnect_for: 0, on_lost: ->(_e) { tries += 1 }) { |pg| pg } }
    assert_equal 1, tries   # at least once more
  ensure
    db&.close
  end

  def test_deprecated_names_still_work
    old, verbose = Warning[:deprecated], $VERBOSE
    Warning[:deprecated] = false
    assert_equal PgIdempotency::SIGNOFF_VERSION, PgIdempotency::SIGNOFF_PROTOCOL
    assert_equal "1", @db.run { |pg| pg.exec("SELECT 1").getvalue(0, 0) }
    Warning[:deprecated] = true
    $VERBOSE = false   # the hook runs with RUBYOPT=-W0, which silences warn
    assert_output(nil, /within: is deprecated, use reconnect_for:/) do
      @db.exec_params("SELECT 1", [], within: 0)
    end
    assert_output(nil, /Connection#run is deprecated, use #with_reconnect/) { @db.run { |pg| pg } }
  ensure
    Warning[:deprecated], $VERBOSE = old, verbose
  end

  def test_batches_mixed_verdicts_then_complete_and_release
    type = job_type("hold")
    done = PgIdempotency.claim(@db, type, "B-done")
    PgIdempotency.complete(@db, type, "B-done", done.attempt, { "n" => 0 })
    claims = PgIdempotency.claim_batch(@db, type, %w[B-1 B-2 B-done B-1], fingerprints: ["fp1", "fp,2", nil, "fp1"])
    assert_equal [["run", 1], ["run", 1], ["completed", 1], ["in_progress", 1]], claims.map { |c| [c.verdict, c.attempt] }
    assert_equal({ "n" => 0 }, JSON.parse(claims[2].result))
    assert_equal 4, claims.map(&:delivery).uniq.size   # one token per key
    out = PgIdempotency.complete_batch(@db, type, %w[B-1 B-done], [1, 1], [{ "sent" => "a,\"b\"}" }, nil])
    assert_equal PgIdempotency::Outcome.new(key: "B-1", attempt: 1, done: true, sqlstate: nil, message: nil), out[0]
    assert_equal ["B-done", true], [out[1].key, out[1].done?]   # already completed by this attempt
    rel = PgIdempotency.release_batch(@db, type, %w[B-2 B-none], [1, 1])
    assert rel[0].done?
    assert_equal ["B-none", false, "ID004"], [rel[1].key, rel[1].done, rel[1].sqlstate]   # no record
    assert_equal "completed #1", record(type, "B-1")
    assert_equal "released #1", record(type, "B-2")
    assert_equal({ "sent" => "a,\"b\"}" }, JSON.parse(PgIdempotency.claim(@db, type, "B-1").result))
    assert_equal [["run", 2]], PgIdempotency.claim_batch(@db, type, ["B-2"]).map { |c| [c.verdict, c.attempt] }
  end

  def test_batch_refused_as_a_whole_records_nothing
    type = job_type("hold")
    PgIdempotency.claim(@db, type, "B-fp", fingerprint: "fp")
    err = assert_raises(PG::Error) do
      PgIdempotency.claim_batch(@db, type, %w[B-new B-fp], fingerprints: %w[fp other])
    end
    assert_equal "ID002", PgIdempotency.sqlstate(err)
    assert_equal "none", record(type, "B-new")
    assert_raises(ArgumentError) { PgIdempotency.claim_batch(@db, type, %w[B-a B-b], fingerprints: ["fp"]) }
  end

  def test_batch_lost_reply_gets_its_claims_back_with_the_same_tokens
    type = job_type("hold")
    db = LosesTheReply.new
    errors = []
    claims = PgIdempotency.claim_batch(db, type, %w[B-l1 B-l2], on_lost: ->(e) { errors << e.class })
    assert_equal [PG::ConnectionBad], errors
    assert_equal [["run", 1], ["run", 1]], claims.map { |c| [c.verdict, c.attempt] }
    assert_equal [true, true], PgIdempotency.complete_batch(@db, type, %w[B-l1 B-l2], [1, 1]).map(&:done)
  ensure
    db&.close
  end

  def test_batch_stuck_key_in_progress_or_busy_with_wait
    type = job_type("hold")
    stuck = PG.connect
    stuck.exec("BEGIN")
    stuck.exec_params("SELECT idempotency.claim_operation($1, 'B-stuck')", [type])
    assert_equal %w[run in_progress], PgIdempotency.claim_batch(@db, type, %w[B-free B-stuck]).map(&:verdict)
    err = assert_raises(PG::Error) { PgIdempotency.claim_batch(@db, type, %w[B-free2 B-stuck], wait: 0.2) }
    assert PgIdempotency.busy?(err)
    assert_equal "none", record(type, "B-free2")
  ensure
    stuck&.close
  end
end
