# The Ruby helper of the PostgreSQL extension `idempotency`:
#   gem build pg-idempotency.gemspec
#   gem install --local --ignore-dependencies -i DIR pg-idempotency-0.5.1.gem

# The portable edition's plain script (PgIdempotency.portable_sql) is made
# here, when the gemspec is loaded (gem build), from the repository's
# portable/*.sql by helpers/portable-sql.sh: in a checkout or a release
# tarball. It is not in git (.gitignore). Without the repository around
# (a gem's unpacked source), the file that is there is used.
portable_sql = "lib/pg_idempotency/idempotency-portable.sql"
Dir.chdir(__dir__) do
  if File.exist?("../portable-sql.sh")
    system("sh", "../portable-sql.sh", portable_sql, exception: true)
  elsif !File.exist?(portable_sql)
    raise "pg-idempotency: neither ../portable-sql.sh nor #{portable_sql}: cannot build the gem " \
          "without the portable edition's script"
  end
end

Gem::Specification.new do |s|
  s.name = "pg-idempotency"
  s.version = "0.5.1"
  s.license = "PostgreSQL"
  s.summary = "Exactly-once effects for Ruby queue workers on the PostgreSQL extension idempotency"
  s.description = "The claim protocol of the PostgreSQL extension idempotency (0.3 or later) on the pg gem: " \
                  "claim, complete, release and extend_lease with a delivery token and reconnects, a heartbeat " \
                  "thread, and a Sidekiq server middleware (require \"pg_idempotency/sidekiq\")."
  s.authors = ["idempotency maintainers"]
  s.email = "maintainers@users.noreply.a-seed-29f2f67c.example"
  s.required_ruby_version = ">= 3.1"   # Debian 12 ships 3.1, Debian 13 3.3 (README: Supported runtimes)
  # the files of this directory, not `git ls-files`: the release tarball has no .git
  s.files = Dir.chdir(__dir__) { Dir["lib/**/*.rb"] + [portable_sql, "README.md", "pg-idempotency.gemspec"] }
  s.require_paths = ["lib"]
  s.add_runtime_dependency "pg", "~> 1.1"
  # the middleware needs Sidekiq 6.4 or later; the core does not: not a dependency
  s.metadata = { "rubygems_mfa_required" => "true" }
end
