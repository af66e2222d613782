# A second Sidekiq job, for the sign-off run only (not in the examples'
# end-to-end tests): notify_warehouse POSTs an order's key to a warehouse's
# HTTP endpoint ($WAREHOUSE_URL), one call per order. The effect is the
# call, counted by the receiving server (in the sign-off, examples/e2e/sink.py).
#
#   GEM_HOME=../gems REDIS_URL=... WAREHOUSE_URL=http://127.0.0.1:PORT/orders \
#     sidekiq -r ./worker.rb -c 1 -q notify_warehouse
require "json"
require "net/http"
require "sidekiq"
require "pg_idempotency/sidekiq"   # the gem pg-idempotency (../install-gem.sh)

class NotifyWarehouse
  include Sidekiq::Job
  sidekiq_options queue: ENV.fetch("SIDEKIQ_QUEUE", "notify_warehouse"),
                  idempotency: { "job_type" => "notify_warehouse", "lease" => 300 }

  def self.idempotency_key(order, _items) = order

  def perform(order, items)
    uri = URI(ENV.fetch("WAREHOUSE_URL"))
    # every connect, write and read: without it a warehouse that takes the
    # call and never answers holds the thread (and its claim) for ever
    # (Net::HTTP's own defaults are 60 s)
    timeout = Float(ENV.fetch("WAREHOUSE_TIMEOUT", "10"))
    res = begin
      Net::HTTP.start(uri.host, uri.port, use_ssl: uri.scheme == "https", open_timeout: timeout,
                      read_timeout: timeout, write_timeout: timeout) do |http|
        http.post(uri.request_uri, JSON.generate({ "order" => order, "items" => items }),
                  "Content-Type" => "application/json", "Idempotency-Key" => order)
      end
    rescue Errno::ECONNREFUSED => e   # nothing listens: nothing done, try again later
      raise PgIdempotency::KnownFailure, "#{uri}: #{e.message}"
    end
    # Net::ReadTimeout (no answer in time) and a lost connection propagate:
    # done or not, the caller cannot know; the claim is left to its lease
    case res
    when Net::HTTPSuccess then { "status" => res.code.to_i }
    when Net::HTTPServiceUnavailable, Net::HTTPTooManyRequests   # busy: nothing done, try again later
      raise PgIdempotency::KnownFailure, "HTTP #{res.code}"
    when Net::HTTPClientError   # 422 and the like: refused for good, the operation ends with it
      { "status" => res.code.to_i, "refused" => res.body.to_s[0, 200] }
    else raise "HTTP #{res.code}"   # other 5xx: done or not, the lease decides
    end
  end
end

Sidekiq.configure_server do |config|
  config.server_middleware { |chain| chain.add PgIdempotency::SidekiqMiddleware }
end
