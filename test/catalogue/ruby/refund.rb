# refund.rb: the catalogue refund's effect without a provider, and the
# lookup policy's question, shared by ruby/worker.rb (the plain calls) and
# sidekiq/worker.rb (the Sidekiq middleware): one line "KEY ATTEMPT PID" per
# refund in the spool's effects file (test/signoff/effects.sh counts them).

# the refund: a line in the effects file, written through (fsync)
def refund_to_file(spool, run_key, attempt)
  File.open(File.join(spool, "effects"), File::WRONLY | File::APPEND | File::CREAT, 0o644) do |f|
    f.write("#{run_key} #{attempt} #{Process.pid}\n")
    f.fsync
  end
end

# the lookup policy's question (verdict verify): was the refund made? (the
# provider's own record; here the effects file)
def refunded?(spool, run_key)
  File.foreach(File.join(spool, "effects")).any? { |l| l.split(" ", 2).first == run_key }
rescue Errno::ENOENT
  false
end
