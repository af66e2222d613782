# dirqueue.rb: the directory queue of test/signoff/dirqueue.py in Ruby (the
# same files: a message is a JSON file, written whole into tmp/ and renamed
# into queue/, taken by a rename into the worker's processing directory),
# for the catalogue's Ruby workers (worker.rb on the plain calls,
# ../sidekiq/worker.rb on the Sidekiq middleware).
require "fileutils"
require "json"
require "securerandom"

def spool
  base = [ENV["SIGNOFF_TEST_DIR"], ENV["TMPDIR"], "/tmp"].find { |d| d && !d.empty? }
  run = ENV["IDEMPOTENCY_SIGNOFF_RUN"] or abort("#{$PROGRAM_NAME}: IDEMPOTENCY_SIGNOFF_RUN is not set")
  path = File.join(base, "spool-#{run}")
  # with its parents, as dirqueue.py and dirqueue.mjs do: a worker may start
  # before the runner's first enqueue has made the spool
  %w[queue tmp processing pids].each { |d| FileUtils.mkdir_p(File.join(path, d)) }
  path
end

def put(spool, message, delay = 0.0)
  message = message.reject { |k, _| k == "not_before" }.merge("not_before" => Time.now.to_f + delay)
  name = format("%020d-%d-%s.msg", Process.clock_gettime(Process::CLOCK_REALTIME, :nanosecond), Process.pid,
                SecureRandom.hex(4))
  tmp = File.join(spool, "tmp", name)
  File.open(tmp, "w") { |f| f.write(JSON.generate(message)); f.flush; f.fsync }
  File.rename(tmp, File.join(spool, "queue", name))
end

def take(spool, mine)
  now = Time.now.to_f
  Dir.children(File.join(spool, "queue")).sort.each do |name|
    src = File.join(spool, "queue", name)
    message = begin
      JSON.parse(File.read(src))
    rescue Errno::ENOENT, JSON::ParserError
      next
    end
    next if message.fetch("not_before", 0) > now
    dst = File.join(mine, name)
    begin
      File.rename(src, dst)
    rescue Errno::ENOENT
      next
    end
    return [dst, message]
  end
  nil
end

# this worker's processing directory (made) and its pid file, in the spool
def register(spool)
  mine = File.join(spool, "processing", Process.pid.to_s)
  FileUtils.mkdir_p(mine)
  File.write(File.join(spool, "pids", Process.pid.to_s), "#{Process.pid}\n")
  mine
end

# yields each message taken (path, message) until stop.call is true,
# looking again every 20 ms while the queue has nothing due
def each_message(spool, mine, stop)
  until stop.call
    taken = take(spool, mine)
    if taken.nil?
      sleep 0.02
      next
    end
    yield(*taken)
  end
end
