# The example's mail provider, outside the database. It takes no reference
# and cannot be searched.
#
# With $SMTP_PORT set: every email is sent through SMTP to $SMTP_HOST
# (default 127.0.0.1):$SMTP_PORT with the header X-Operation-Key: <the job's
# key>; the server's 250 means sent (the sign-off run's SMTP endpoint
# counts by that header). A 4xx answer (451: try again later) or a refused
# connection is Refused: nothing was sent, a later try may succeed. A 5xx
# answer (550: no such mailbox) is RefusedForGood: nothing was sent, and a
# retry would be refused again. No answer within $SMTP_TIMEOUT seconds
# (default 30; Net::ReadTimeout) and other errors (a lost connection)
# propagate: the email may have been sent.
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
  # the provider refused the request for now (say HTTP 429, SMTP 451) or
  # could not be reached: nothing was sent
  class Refused < StandardError; end
  # the provider refused the request for good (SMTP 550): nothing was sent,
  # and sending it again would be refused again
  class RefusedForGood < StandardError; end

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
    smtp = Net::SMTP.new(ENV.fetch("SMTP_HOST", "127.0.0.1"), Integer(ENV["SMTP_PORT"]))
    # every connect and read: without it a server that takes the message and
    # never answers holds the worker (and its claim) for ever (Net::SMTP's
    # own default read timeout, 60 s, is longer than most leases allow)
    smtp.open_timeout = smtp.read_timeout = Float(ENV.fetch("SMTP_TIMEOUT", "30"))
    smtp.start(helo: "localhost") { smtp.send_message(message, FROM, to) }
  rescue Net::SMTPServerBusy, Errno::ECONNREFUSED => e   # 4xx, no server: try again later
    raise Refused, "SMTP: #{e.message.strip}: #{to} not sent"
  rescue Net::SMTPFatalError, Net::SMTPSyntaxError => e  # 5xx: refused for good
    raise RefusedForGood, "SMTP: #{e.message.strip}: #{to} not sent"
  end
end
