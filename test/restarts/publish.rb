# test/restarts/publish.rb: a publisher for test/restarts/run.py that stays
# up for the whole run (one ruby process instead of one per message). Reads
# lines "ORDER COPIES" on stdin, enqueues the send_confirmation job of each
# order COPIES times exactly as examples/sidekiq/publish.rb does (the same
# worker.rb, the same arguments, the gem pg-idempotency from the GEM_HOME
# that examples/sidekiq/install-gem.sh fills), and answers "ok" per line.
#
#   GEM_HOME=examples/sidekiq/gems REDIS_URL=... SIDEKIQ_QUEUE=... JOB_TYPE=... ruby test/restarts/publish.rb
# The answers go to the original stdout; everything else written to stdout
# (Sidekiq 7 logs "connecting to Redis" there) goes to stderr, so it cannot
# be read as an answer.
answers = $stdout.dup
answers.sync = true
$stdout.reopen($stderr)
require_relative "../../examples/sidekiq/worker"

$stdin.each_line do |line|
  order, copies = line.split
  args = SendConfirmation.args_for(order)
  Integer(copies).times { SendConfirmation.perform_async(*args) }
  answers.puts "ok"
end
