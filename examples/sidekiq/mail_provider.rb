# The example's mail provider, outside the database. It takes no reference
# and cannot be searched.
#
# With $SMTP_PORT set: every email is sent through SMTP to $SMTP_HOST
# (default 127.0.0.1):$SMTP_PORT with the header X-Operation-Key: <the job's
# key>; the server's 250 means sent (the sign-off run's sink,
# examples/e2e/sink.py, counts by that header). A 4xx or 5xx answer, or
# a refused connection, is Refused: nothing was sent. Other errors (a lost
# connection) leave it uncertain.
# Without it (the end-to-end test): every email is one line appended to
# $MAIL_LOG and fsync'd before send returns, so an email that left cannot be
# rolled back.
#
# Test hook (only when $E2E_DIR is set): the end-to-end test stops a worker
# exactly before or after an email by creating the FIFO
# $E2E_DIR/pause-<key>-<before|after>. The first worker to reach that point
# takes it (rename), writes $E2E_DIR/at-<key>-<point> with its pid and blocks
# on the FIFO until the test writes to it, or kill -9s the worker. The test
# also makes the provider refuse the next email of a key (Refused, nothing is
# sent) by creating the file $E2E_DIR/refuse-<key>.
require "net/smtp"
require "time"

module MailProvider
  # the provider refused the request (say HTTP 429): nothing was sent
  class Refused < StandardError; end

  def self.refused?(key)
    dir = ENV["E2E_DIR"] or return false
    File.rename("#{dir}/refuse-#{key}", "#{dir}/refuse-#{key}.taken-#{Process.pid}")
    true
  rescue Errno::ENOENT
    false
  end

  def self.checkpoint(key, point)
    dir = ENV["E2E_DIR"] or return
    fifo = "#{dir}/pause-#{key}-#{point}"
    taken = "#{fifo}.taken-#{Process.pid}"
    begin
      File.rename(fifo, taken)
    rescue Errno::ENOENT
      return
    end
    File.write("#{dir}/at-#{key}-#{point}.tmp", "#{Process.pid}\n")
    File.rename("#{dir}/at-#{key}-#{point}.tmp", "#{dir}/at-#{key}-#{point}")
    File.open(taken, "r", &:read)   # blocks this thread until the test writes
  end

  def self.send_email(to:, subject:, key:)
    raise Refused, "429 too many requests: #{to} not sent" if refused?(key)
    checkpoint(key, "before")
    if ENV["SMTP_PORT"]
      smtp(to: to, subject: subject, key: key)
    else
      File.open(ENV.fetch("MAIL_LOG", "outbox.log"), "a") do |f|
        f.write("#{Time.now.iso8601(6)}\t#{key}\t#{to}\t#{subject}\tpid #{Process.pid}\n")
        f.fsync
      end
    end
    checkpoint(key, "after")
    { "accepted" => true }
  end

  FROM = "orders@shop.example.test"

  # one email through SMTP; returns when the server answered 250 to the data
  def self.smtp(to:, subject:, key:)
    message = <<~MAIL.gsub("\n", "\r\n")
      From: #{FROM}
      To: #{to}
      Subject: #{subject}
      Date: #{Time.now.rfc2822}
      X-Operation-Key: #{key}

      Thank you for your order #{key}.
    MAIL
    Net::SMTP.start(ENV.fetch("SMTP_HOST", "127.0.0.1"), Integer(ENV["SMTP_PORT"]), helo: "localhost") do |smtp|
      smtp.send_message(message, FROM, to)
    end
  rescue Net::SMTPServerBusy, Net::SMTPFatalError, Errno::ECONNREFUSED => e   # 4xx, 5xx, no server
    raise Refused, "SMTP: #{e.message.strip}: #{to} not sent"
  end
end
