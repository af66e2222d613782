# test_portable.rb: the portable edition's plain script that the gem carries
# (docs/helpers.md, "The portable edition's script"):
# PgIdempotency.portable_sql, install_portable(conn) and
# `ruby -rpg_idempotency -e 'puts PgIdempotency.portable_sql'`. The script is
# installed twice in a database of its own (created and dropped here: the
# role needs CREATEDB): edition() answers 'portable' at the release's
# version, and the second run changes no catalog row (the same oids too) and
# no record. Where the C edition answers in the tests' database, the script
# refuses it (55000) and nothing changes.
#
#   ruby -Ilib -Itest test/test_portable.rb   # in helpers/ruby; the PG* environment
require "test_helper"
require "open3"
require "rbconfig"

class PortableTest < Minitest::Test
  # the same text in the three helpers' tests (tests/test_portable.py)
  SNAPSHOT_SQL = <<~SQL
    SELECT md5(string_agg(t, E'\\n' ORDER BY t)) FROM (
        SELECT p.oid::int || ' ' || p.oid::regprocedure::text || p.prosrc || coalesce(p.proacl::text, '')
               || coalesce(p.proconfig::text, '') || coalesce(obj_description(p.oid, 'pg_proc'), '') AS t
        FROM pg_proc p WHERE p.pronamespace = 'idempotency'::regnamespace
        UNION ALL SELECT c.oid::int || ' ' || c.oid::regclass::text || c.relkind::text || coalesce(c.relacl::text, '')
               || coalesce(obj_description(c.oid, 'pg_class'), '')
        FROM pg_class c WHERE c.relnamespace = 'idempotency'::regnamespace
        UNION ALL SELECT t.oid::int || ' ' || pg_get_triggerdef(t.oid)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = 'idempotency'::regnamespace
        UNION ALL SELECT 'j ' || j::text FROM idempotency.job_types j
        UNION ALL SELECT 'o ' || o::text FROM idempotency.operations o) x
  SQL
  # the lib the tests load (this checkout's, or the installed gem's), for a ruby -r of it
  LIB = File.dirname(PgIdempotency::PORTABLE_SQL_FILE, 2)
  RELEASE = PgIdempotency::VERSION.split(".")[0, 2].join(".")   # the gem 0.5.0 carries the script of 0.5

  def setup
    @admin = PG.connect
    @admin.exec("SET client_min_messages = warning")
  end

  def teardown
    @admin.exec("DROP DATABASE IF EXISTS #{@scratch} WITH (FORCE)") if @scratch
    @admin.close
  end

  # a new database of the test, owned by the tests' role
  def scratch
    @scratch = "ruby_unit_portable_#{Process.pid}"
    @admin.exec("DROP DATABASE IF EXISTS #{@scratch}")
    begin
      @admin.exec("CREATE DATABASE #{@scratch}")
    rescue PG::InsufficientPrivilege
      @scratch = nil
      skip "the tests' role may not create a database (CREATEDB)"
    end
    @scratch
  end

  def test_the_script_is_plain_sql_of_this_release
    sql = PgIdempotency.portable_sql
    assert sql.start_with?("/*\n * idempotency #{RELEASE}, portable edition, as a plain script")
    lines = sql.lines(chomp: true)
    assert_includes lines, "BEGIN;"
    assert_equal "COMMIT;", lines.last
    assert_empty lines.grep(/\A\\/), "a psql meta-command"
  end

  def test_ruby_e_prints_the_script
    out, err, status = Open3.capture3(RbConfig.ruby, "-I#{LIB}",
                                      "-rpg_idempotency", "-e", "puts PgIdempotency.portable_sql")
    assert status.success?, err
    assert_equal PgIdempotency.portable_sql, out
  end

  def test_install_portable_twice_changes_nothing
    conn = PG.connect(dbname: scratch)
    conn.exec("SET client_min_messages = warning")
    assert_equal ["portable", RELEASE], PgIdempotency.install_portable(conn)
    assert_equal PG::PQTRANS_IDLE, conn.transaction_status
    # a job type and a claim in flight, kept by the second run
    conn.exec("INSERT INTO idempotency.job_types (job_type, lease, stale_policy) " \
              "VALUES ('portable_t', interval '1 minute', 'retry')")
    conn.exec("SELECT idempotency.claim_operation('portable_t', 'K1', 'fp', 'w', delivery => 'd1')")
    before = conn.exec(SNAPSHOT_SQL).getvalue(0, 0)
    # through a PgIdempotency::Connection this time
    db = PgIdempotency::Connection.new("dbname=#{@scratch} options='-c client_min_messages=warning'")
    assert_equal ["portable", RELEASE], PgIdempotency.install_portable(db)
    db.close
    assert_equal before, conn.exec(SNAPSHOT_SQL).getvalue(0, 0)
    assert_equal [%w[claimed 1]], conn.exec("SELECT status::text, attempt FROM idempotency.operations " \
                                            "WHERE job_type = 'portable_t'").values
    # in a transaction of the caller's: refused, nothing run
    conn.exec("BEGIN")
    assert_raises(ArgumentError) { PgIdempotency.install_portable(conn) }
    conn.exec("ROLLBACK")
  ensure
    conn&.close
  end

  def test_the_printed_script_installs_with_psql
    db = scratch
    out, status = Open3.capture2(RbConfig.ruby, "-I#{LIB}",
                                 "-rpg_idempotency", "-e", "puts PgIdempotency.portable_sql")
    assert status.success?
    _, err, status = Open3.capture3("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", db,
                                    "-c", "SET client_min_messages = warning", "-f", "-", stdin_data: out)
    assert status.success?, err
    conn = PG.connect(dbname: db)
    assert_equal [["portable", RELEASE]], conn.exec("SELECT edition, version FROM idempotency.edition()").values
    conn.close
  end

  def test_refused_where_the_c_edition_answers
    skip "the C edition does not answer in the tests' database" unless installed_edition(@admin)&.first == "c"
    conn = PG.connect
    e = assert_raises(PG::ObjectNotInPrerequisiteState) { PgIdempotency.install_portable(conn) }
    assert_match(/extension/, e.message)
    assert_equal PG::PQTRANS_IDLE, conn.transaction_status
    assert_equal [["c"]], conn.exec("SELECT edition FROM idempotency.edition()").values
    conn.close
  end
end
