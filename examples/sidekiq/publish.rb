# ruby publish.rb ORD-1001 [copies [email]]: enqueue the send_confirmation job
# of an order (email: another payload under the same key)
require_relative "worker"
order, copies, email = ARGV[0], Integer(ARGV[1] || "1"), ARGV[2]
args = SendConfirmation.args_for(order)
args[1] = email if email
copies.times { SendConfirmation.perform_async(*args) }
