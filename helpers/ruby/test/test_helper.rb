# test_helper.rb: what the tests of pg-idempotency share. They need a
# PostgreSQL with the extension `idempotency` 0.3 or later from libpq's
# environment (PGHOST, PGPORT, PGUSER, PGDATABASE); the extension is created
# if missing. Each test makes job types of its own (named after the process)
# with a lease of LEASE seconds and deletes them afterwards.
#
# IDEMPOTENCY_EDITION=portable: the database must hold the portable edition;
# where no edition answers, it is installed with this gem's
# install_portable (as the database's owner: PGUSER), where the C edition
# answers the tests stop. IDEMPOTENCY_EDITION=c: the C extension (created if
# missing). Unset: whichever answers, else the C extension is created.
require "minitest/autorun"
require "logger"
require "pg"
require "pg_idempotency"

# the gem under test is this checkout's lib (-Ilib), not an installed gem:
# its portable script made as gem build makes it
CHECKOUT_LIB = File.expand_path("../lib", __dir__)
if PgIdempotency::PORTABLE_SQL_FILE.start_with?("#{CHECKOUT_LIB}/")
  system("sh", File.expand_path("../../portable-sql.sh", __dir__), PgIdempotency::PORTABLE_SQL_FILE,
         exception: true)
end

EDITION = ENV["IDEMPOTENCY_EDITION"].to_s.empty? ? nil : ENV["IDEMPOTENCY_EDITION"]
abort "IDEMPOTENCY_EDITION must be c or portable, not #{EDITION.inspect}" unless [nil, "c", "portable"].include?(EDITION)

# [edition, version] of the idempotency that answers in pg's database, or nil
def installed_edition(pg)
  if pg.exec("SELECT pg_catalog.to_regprocedure('idempotency.edition()') IS NOT NULL").getvalue(0, 0) == "t"
    return pg.exec("SELECT edition, version FROM idempotency.edition()").values.first
  end
  v = pg.exec("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'").values.first
  v && ["c", v.first]
end

# once per run: the edition the tests want
PG.connect.tap do |pg|
  pg.exec("SET client_min_messages = warning")
  installed = installed_edition(pg)
  if installed.nil?
    EDITION == "portable" ? PgIdempotency.install_portable(pg) : pg.exec("CREATE EXTENSION IF NOT EXISTS idempotency")
    installed = installed_edition(pg)
  end
  if EDITION && installed.first != EDITION
    abort "IDEMPOTENCY_EDITION=#{EDITION}, but the #{installed.first} edition (#{installed.last}) answers in " \
          "database #{pg.db}"
  end
  pg.close
end

LEASE = 1.0

# failed heartbeats are logged: to TEST_LOG, else nowhere
PgIdempotency.logger = Logger.new(ENV["TEST_LOG"] || File::NULL)

module DatabaseTest
  def prefix = "ruby_unit"

  def setup
    @admin = PG.connect
    @admin.exec("SET client_min_messages = warning")
    @types = []
  end

  def teardown
    @types.each do |t|
      @admin.exec_params("DELETE FROM idempotency.operations WHERE job_type = $1", [t])
      @admin.exec_params("DELETE FROM idempotency.job_types WHERE job_type = $1", [t])
    end
    @admin.close
  end

  # a job type of this test with the policy and a lease of LEASE seconds
  # (name: another stem than prefix_policy, for a second type of the policy)
  def job_type(policy, name: "#{prefix}_#{policy}")
    t = "#{name}_#{Process.pid}"
    @admin.exec_params("DELETE FROM idempotency.operations WHERE job_type = $1", [t])
    @admin.exec_params("DELETE FROM idempotency.job_types WHERE job_type = $1", [t])
    @admin.exec_params("INSERT INTO idempotency.job_types (job_type, lease, stale_policy) " \
                       "VALUES ($1, make_interval(secs => $2), $3)", [t, LEASE, policy])
    @types << t
    t
  end

  # "status #attempt" of the record, or "none"
  def record(type, key)
    r = @admin.exec_params("SELECT status::text || ' #' || attempt FROM idempotency.operations " \
                           "WHERE job_type = $1 AND operation_key = $2", [type, key])
    r.ntuples.zero? ? "none" : r.getvalue(0, 0)
  end

  # the server ends the connection's backend (as a restart or an idle
  # timeout would); returns its pid once it is gone
  def terminate(conn)
    pid = conn.exec_params("SELECT pg_backend_pid()", []).getvalue(0, 0)
    @admin.exec_params("SELECT pg_terminate_backend($1::int)", [pid])
    deadline = Time.now + 10
    sleep 0.01 while @admin.exec_params("SELECT 1 FROM pg_stat_activity WHERE pid = $1::int",
                                        [pid]).ntuples.positive? && Time.now < deadline
    pid
  end
end

# The Sidekiq tests' job class: job type `type`, class name `name` (part of
# the middleware's fingerprint), the middleware's options. No Redis:
# perform_in records what would be scheduled (klass.scheduled).
module SidekiqJobs
  def job_class(type, name: "UnitJob", **extra)
    Class.new do
      include Sidekiq::Job
      include PgIdempotency::Job
      sidekiq_options idempotency: { "job_type" => type, "lease" => LEASE }.merge(extra)
      define_singleton_method(:name) { name }
      def perform(_key); end

      def self.scheduled = (@scheduled ||= [])
      def self.set(**) = self
      def self.perform_in(delay, *args) = scheduled << [delay, *args]
    end
  end
end
