# test_conformance.rb: the shared sign-off conformance cases
# (helpers/conformance/signoff.json, docs/helpers.md), run against this gem:
# every case of the file, one test each, named after it. The Python and
# Node.js helpers run the same file with their own test runners. No database.
require "minitest/autorun"
require "json"
require "pg_idempotency"

class TestConformance < Minitest::Test
  CASES = JSON.parse(File.read(File.expand_path("../../conformance/signoff.json", __dir__), encoding: "UTF-8"))
  VARIABLES = %w[IDEMPOTENCY_SIGNOFF IDEMPOTENCY_SIGNOFF_JOB_TYPES IDEMPOTENCY_SIGNOFF_LEASE
                 IDEMPOTENCY_SIGNOFF_HELLO].freeze

  def setup
    @saved = VARIABLES.to_h { |v| [v, ENV[v]] }
  end

  def teardown
    @saved.each { |v, value| ENV[v] = value }
  end

  # the case's environment (a variable it does not name is unset)
  def environment(env)
    VARIABLES.each { |v| ENV[v] = env[v] }
  end

  def self.each_case(section, &body)
    CASES.fetch(section).each_with_index do |c, i|
      define_method("test_#{section}_#{format('%02d', i)}_#{c['name'].gsub(/\W+/, '_')}") { instance_exec(c, &body) }
    end
  end

  def test_protocol_version
    assert_equal CASES["protocol_version"], PgIdempotency::SIGNOFF_VERSION
  end

  each_case("job_types") do |c|
    environment(c["env"])
    text = c["env"]["IDEMPOTENCY_SIGNOFF_JOB_TYPES"]
    if c.key?("refusal")
      err = assert_raises(PgIdempotency::SignoffError) { PgIdempotency.parse_job_types(text) }
      assert_equal c["refusal"], err.message
      err = assert_raises(PgIdempotency::SignoffError) { PgIdempotency.signoff_job_type("a") }   # every call
      assert_equal c["refusal"], err.message
    else
      assert_equal c["map"], PgIdempotency.parse_job_types(text)
      c["lookups"].each { |yours, used| assert_equal used, PgIdempotency.signoff_job_type(yours), yours }
    end
  end

  each_case("lease") do |c|
    environment(c["env"])
    text = c["env"]["IDEMPOTENCY_SIGNOFF_LEASE"]
    if c.key?("refusal")
      err = assert_raises(PgIdempotency::SignoffError) { PgIdempotency.parse_lease(text) }
      assert_equal c["refusal"], err.message
      err = assert_raises(PgIdempotency::SignoffError) { PgIdempotency.signoff_lease }
      assert_equal c["refusal"], err.message
    elsif c["lease"].nil?
      assert_nil PgIdempotency.parse_lease(text)
      assert_nil PgIdempotency.signoff_lease
    else
      assert_equal c["lease"].to_f, PgIdempotency.parse_lease(text)
      assert_equal c["lease"].to_f, PgIdempotency.signoff_lease
    end
  end

  each_case("messages") do |c|
    given = c["input"].dup
    point, job_type, key = given.delete("point"), given.delete("job_type"), given.delete("key")
    options = given.transform_keys(&:to_sym)
    if c.key?("error")
      err = assert_raises(ArgumentError) { PgIdempotency.signoff_message(point, job_type, key, **options) }
      assert_equal c["error"], err.message
    else
      line = PgIdempotency.signoff_message(point, job_type, key, **options)
      assert line.end_with?("\n") && line.count("\n") == 1, line
      assert_equal c["line"], JSON.parse(line)
    end
  end

  each_case("hello_armed") do |c|
    environment(c["env"])
    assert_equal c["hello"], PgIdempotency.signoff_hello?
  end

  each_case("hellos") do |c|
    line = PgIdempotency.signoff_hello_message(**c["input"].transform_keys(&:to_sym))
    assert line.end_with?("\n") && line.count("\n") == 1, line
    assert_equal c["line"], JSON.parse(line)
    assert_equal c["line"].keys, JSON.parse(line).keys   # the fields in the documented order
  end

  each_case("answers") do |c|
    if c.key?("error")
      err = assert_raises(PgIdempotency::SignoffError) { PgIdempotency.signoff_answer(c["point"], c["received"]) }
      assert_equal c["error"], err.message
      where = "sign-off runner at /r.sock, point P of t/k"
      err = assert_raises(PgIdempotency::SignoffError) { PgIdempotency.signoff_answer(c["point"], c["received"], where) }
      assert_equal "#{where}: #{c['error']}", err.message
    else
      assert_equal c["answer"].to_sym, PgIdempotency.signoff_answer(c["point"], c["received"])
    end
  end
end
