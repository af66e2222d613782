# run.rb: all the tests of pg-idempotency in one minitest run (no Rakefile):
#
#   cd helpers/ruby && ruby -Ilib -Itest test/run.rb [minitest options, e.g. -v]
#
# One file alone: ruby -Ilib -Itest test/test_sidekiq.rb
Dir[File.join(__dir__, "test_*.rb")].sort.each { |f| require f }
