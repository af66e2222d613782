# worker.rb: the catalogue's refund job in Ruby (test/catalogue/README.md):
# one worker process on the directory queue of test/signoff/dirqueue.py
# (the same files: a message is a JSON file taken by rename), written with
# pg-idempotency's plain calls and sign-off points. The same job as
# ../python/worker.py, mutation for mutation: CATALOGUE_MUTATION picks one
# change of the correct job, CATALOGUE_KEY the operation key (run, prefix,
# hash); with IDEMPOTENCY_SIGNOFF_HTTP the refund is a POST to the provider.
#
#   ruby -I ../../helpers/ruby/lib ruby/worker.rb
require "digest"
require "json"
require "net/http"
require "securerandom"
require "pg_idempotency"
require_relative "dirqueue"
require_relative "refund"

JOB = "catalogue_refund"
MUTATION = ENV.fetch("CATALOGUE_MUTATION", "").then { |m| m.empty? ? "correct" : m }
KEY_MODE = ENV.fetch("CATALOGUE_KEY", "").then { |m| m.empty? ? "run" : m }
HTTP = ENV["IDEMPOTENCY_SIGNOFF_HTTP"].then { |h| h.nil? || h.empty? ? nil : h }
$stderr.sync = true

class ProviderRefused < StandardError; end

def log(msg) = warn("#{Time.now.utc.strftime('%H:%M:%S.%L')} refund worker #{Process.pid}: #{msg}")

def refund(spool, run_key, op_key, attempt)
  unless HTTP
    refund_to_file(spool, run_key, attempt)
    return { "refunded" => true }
  end
  uri = URI("#{HTTP}/refunds/#{op_key}")
  headers = { "Content-Type" => "application/json", "Idempotency-Key" => op_key }
  tries = 0
  loop do
    tries += 1
    begin
      http = Net::HTTP.new(uri.host, uri.port)
      if MUTATION == "no-timeout"
        http.read_timeout = nil
      else
        http.open_timeout = 5
        http.read_timeout = 5
      end
      res = http.post(uri.path, '{"amount_cents": 1250}', headers)
    rescue Errno::ECONNREFUSED => e
      return { "status" => nil } if MUTATION == "swallow-errors"
      raise PgIdempotency::KnownFailure, "provider unreachable: #{e.message}"
    rescue Net::ReadTimeout, Net::OpenTimeout
      raise unless MUTATION == "retry-without-key" && tries == 1
      headers = headers.except("Idempotency-Key")   # once more inside the handler, the header left out
      next
    end
    return { "status" => res.code.to_i } if res.is_a?(Net::HTTPSuccess)
    if MUTATION == "retry-without-key" && tries == 1 && res.code.to_i != 422
      headers = headers.except("Idempotency-Key")   # once more inside the handler, the header left out
      next
    end
    if MUTATION == "retry-forever"          # every error transient: again, forever
      sleep 0.2
      next
    end
    if MUTATION == "swallow-errors"         # logged, and reported as a success
      log("#{op_key}: provider answered #{res.code} (ignored)")
      return { "status" => res.code.to_i }
    end
    code = res.code.to_i
    raise ProviderRefused, "provider answered #{code}" if code >= 400 && code < 500 && ![408, 429].include?(code)
    raise PgIdempotency::KnownFailure, "provider answered #{code}"
  end
end

def operation_key(run_key, path, message)
  return "msg-#{File.basename(path)}" if MUTATION == "message-id"
  # the queue's retry count in the key
  return "#{run_key}:#{message['retries']}" if MUTATION == "key-retries" && message["retries"].to_i.positive?
  return "refund:#{run_key}" if KEY_MODE == "prefix"
  return Digest::SHA256.hexdigest("refund:#{run_key}")[0, 16] if KEY_MODE == "hash"
  run_key
end

def fingerprint(args) = "sha256:#{Digest::SHA256.hexdigest(JSON.generate(args.sort.to_h))}"

def handle(conn, beat_conn, spool, path, message, lease)
  run_key = message["key"]
  args = message["args"].dup
  args["received_at"] = Time.now.to_f if MUTATION == "args-differ"
  if message["copy"] == "unclaimed"         # the job's own follow-up: no claim at all
    refund(spool, run_key, run_key, 0)
    return File.unlink(path)
  end
  key = message["copy"] == "new-key" ? "#{run_key}:again" : operation_key(run_key, path, message)
  done = -> { File.unlink(path) }
  # the queue's own retry of the message: its retry count one more
  again = ->(delay) { put(spool, message.merge("retries" => message["retries"].to_i + 1), delay); File.unlink(path) }

  refund(spool, run_key, key, 0) if MUTATION == "effect-before-claim"
  begin
    c = PgIdempotency.claim(conn, JOB, key, fingerprint: fingerprint(args))
  rescue PG::Error => e
    return again.call(lease) if PgIdempotency.busy?(e)
    unless PgIdempotency.claim_error_heals?(e)
      log("#{key}: refused (#{PgIdempotency.sqlstate(e)}): #{e.message.lines.first&.strip}")
      return done.call
    end
    log("#{key}: claim failed, again in 1 s: #{e.message}")
    return again.call(1.0)
  end
  unless c.run?                             # claim() reported the point judged
    log("#{key}: #{c.verdict} ##{c.attempt}")
    refund(spool, run_key, key, c.attempt) if MUTATION == "ignore-verdict"
    return again.call(lease) if c.verdict == "in_progress"
    return done.call
  end

  beat = PgIdempotency::Heartbeat.new(beat_conn, lease / 4) { |b| PgIdempotency.extend_lease(b, JOB, key, c.attempt) }
  value = nil
  begin
    if PgIdempotency.signoff_point(:claimed, JOB, key, attempt: c.attempt, verdict: c.verdict, heartbeat: true) == :fail
      beat.stop
      PgIdempotency.release(conn, JOB, key, c.attempt)
      log("#{key}: known failure: released attempt #{c.attempt}")
      return done.call
    end
    if MUTATION == "complete-first"
      beat.stop
      PgIdempotency.complete(conn, JOB, key, c.attempt, { "pid" => Process.pid })
      PgIdempotency.signoff_point(:handled, JOB, key, attempt: c.attempt, verdict: c.verdict, heartbeat: true)
      refund(spool, run_key, key, c.attempt)
      return done.call
    end
    begin
      value = if MUTATION == "effect-before-claim" then { "refunded" => "before the claim" }
              elsif c.verify? && refunded?(spool, run_key) then { "found" => true }   # lookup: look first
              else
                begin
                  refund(spool, run_key, key, c.attempt)
                rescue StandardError
                  # an ensure block: completed, the call failed or not
                  PgIdempotency.complete(conn, JOB, key, c.attempt, { "tried" => true }) if MUTATION == "complete-on-failure"
                  raise
                end
              end
    rescue ProviderRefused => e             # refused for good: the operation ends
      value = { "refused" => e.message }
    rescue PgIdempotency::KnownFailure => e # certainly not refunded: released, retried
      beat.stop
      PgIdempotency.release(conn, JOB, key, c.attempt)
      log("#{key}: #{e.message}: released attempt #{c.attempt}, again in 1 s")
      return again.call(1.0)
    end
  ensure
    beat.stop
  end
  PgIdempotency.signoff_point(:handled, JOB, key, attempt: c.attempt, verdict: c.verdict, heartbeat: true)
  put(spool, message.merge("copy" => "unclaimed"), 1.0) if MUTATION == "reschedule-unclaimed" && !message["copy"]
  put(spool, message.merge("copy" => "new-key"), 1.0) if MUTATION == "reschedule-new-key" && !message["copy"]
  begin
    PgIdempotency.complete(conn, JOB, key, c.attempt, value)
    log("#{key}: #{c.verdict} ##{c.attempt} completed")
  rescue PG::Error => e
    raise unless PgIdempotency.sqlstate(e) == "ID003"
    log("#{key}: attempt #{c.attempt} taken over (ID003)")
  end
  done.call
end

stopping = false
Signal.trap("TERM") { stopping = true }
dir = spool
mine = register(dir)
lease = PgIdempotency.signoff_lease || 30.0
dsn = ENV["IDEMPOTENCY_SIGNOFF_DSN"].then { |d| d.nil? || d.empty? ? nil : d }   # nil: the PG* variables
conn = PgIdempotency::Connection.new(dsn)
beat_conn = PgIdempotency::Connection.new(dsn)
log("started (mutation #{MUTATION}, key #{KEY_MODE}); lease #{lease} s")
each_message(dir, mine, -> { stopping }) do |path, message|
  handle(conn, beat_conn, dir, path, message, lease)
rescue StandardError => e                   # a failed job: logged, its message dropped
  log("#{message['key']} failed: #{e.class}: #{e.message}")
  File.unlink(path) if File.exist?(path)
end
log("stopped (SIGTERM)")
