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
    res = Net::HTTP.post(uri, JSON.generate({ "order" => order, "items" => items }),
                         "Content-Type" => "application/json", "Idempotency-Key" => order)
    # 4xx: refused, nothing done (release, retry after a backoff); anything
    # else that is not 2xx is uncertain: the claim is left to its lease
    raise PgIdempotency::KnownFailure, "HTTP #{res.code}" if res.is_a?(Net::HTTPClientError)
    raise "HTTP #{res.code}" unless res.is_a?(Net::HTTPSuccess)
  end
end

Sidekiq.configure_server do |config|
  config.server_middleware { |chain| chain.add PgIdempotency::SidekiqMiddleware }
end
