# The portable edition's plain script (docs/portable.md), as this release of
# the gem carries it: made from the repository's portable/*.sql when the gem
# was built (pg-idempotency.gemspec), so the script and the helpers are of
# one release. For an app's migrations, as libraries built on pgmq embed
# pgmq's schema:
#
#   PgIdempotency.portable_sql              # the script, as a String
#   PgIdempotency.install_portable(conn)    # or run it on a connection
#
#   ruby -rpg_idempotency -e 'puts PgIdempotency.portable_sql' > idempotency-portable.sql
module PgIdempotency
  PORTABLE_SQL_FILE = File.join(__dir__, "idempotency-portable.sql")

  # The portable edition's plain script of this release: plain SQL with no
  # psql meta-command, one transaction of its own (BEGIN ... COMMIT), run by
  # the database's owner (no superuser). A fresh install, or the in-place
  # upgrade of an older portable install; run again, it changes nothing; it
  # refuses (55000) a database where the C extension is, and a newer
  # portable install.
  def self.portable_sql
    File.read(PORTABLE_SQL_FILE, encoding: "UTF-8")
  rescue Errno::ENOENT
    raise "pg_idempotency: #{File.basename(PORTABLE_SQL_FILE)} is not in this copy of the gem; it is made " \
          "when the gem is built (gem build pg-idempotency.gemspec, which loads the gemspec; in a checkout, " \
          "helpers/portable-sql.sh helpers/ruby/lib/pg_idempotency/idempotency-portable.sql)"
  end

  # Runs portable_sql on conn (a PG::Connection or a
  # PgIdempotency::Connection, as the database's owner) and returns what
  # idempotency.edition() then answers, ["portable", VERSION]. The script is
  # one transaction of its own, so conn must not be in a transaction
  # (ArgumentError otherwise). An error (e.g. 55000: the C extension is
  # installed in that database) is raised after the script's transaction was
  # rolled back: nothing changed.
  def self.install_portable(conn)
    return conn.with_reconnect { |pg| install_portable(pg) } if conn.is_a?(Connection)

    unless conn.transaction_status == PG::PQTRANS_IDLE
      raise ArgumentError, "install_portable: the connection is in a transaction (the script runs its own: " \
                           "BEGIN ... COMMIT); commit or roll back first"
    end
    begin
      conn.exec(portable_sql)   # PQexec: every statement of the script
    rescue PG::Error
      conn.exec("ROLLBACK") if conn.transaction_status == PG::PQTRANS_INERROR
      raise
    end
    conn.exec("SELECT edition, version FROM idempotency.edition()").values.first
  end
end
