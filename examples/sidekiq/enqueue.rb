# ruby enqueue.rb ORDER [--email ADDRESS]: enqueue one send_confirmation job
# of an order on $SIDEKIQ_QUEUE, the enqueue command of signoff.job. With
# --email: the same order to another address, i.e. other arguments under the
# same key (enqueue_other: the claim must refuse it, ID002).
require_relative "worker"
usage = "usage: ruby enqueue.rb ORDER [--email ADDRESS]"
abort usage unless ARGV.size == 1 || (ARGV.size == 3 && ARGV[1] == "--email")
args = SendConfirmation.args_for(ARGV[0])
args[1] = ARGV[2] if ARGV[1]
SendConfirmation.perform_async(*args)
