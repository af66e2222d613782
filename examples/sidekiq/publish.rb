# ruby publish.rb ORD-1001 [copies]: enqueue the send_confirmation job of an order
require_relative "worker"
order, copies = ARGV[0], Integer(ARGV[1] || "1")
copies.times { SendConfirmation.perform_async(*SendConfirmation.args_for(order)) }
