# ruby enqueue.rb ORDER [--items N]: enqueue one notify_warehouse job (--items:
# other arguments under the same key, the sign-off's enqueue_other)
require_relative "worker"
abort "usage: ruby enqueue.rb ORDER [--items N]" unless ARGV.size == 1 || (ARGV.size == 3 && ARGV[1] == "--items")
NotifyWarehouse.perform_async(ARGV[0], Integer(ARGV[2] || "1"))
