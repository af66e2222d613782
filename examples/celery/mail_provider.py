"""The mail provider, outside the database. With $SMTP_PORT set, send()
sends a real email through SMTP to $SMTP_HOST (default 127.0.0.1), with the
header X-Operation-Key: <key> (the job's operation key, which the sign-off
run's SMTP sink counts by); the server's 250 to DATA means sent. An SMTP
refusal (the sender, every recipient, or the message refused) raises
Refused: nothing was sent. Without $SMTP_PORT it is a fake: every email is
one line appended to $MAIL_LOG and fsync'd before send() returns, so an
email that left cannot be rolled back. Either way it takes no reference
and cannot be searched.

Test hook (only when $E2E_DIR is set): the end-to-end test stops a worker
exactly before or after an email by creating the FIFO
$E2E_DIR/pause-<key>-<before|after>. The first worker to reach that point
takes it (rename), writes $E2E_DIR/at-<key>-<point> with its pid and blocks
on the FIFO until the test writes to it, or kill -9s the worker. The test
also makes the provider refuse the next email of a key (Refused, nothing is
sent) by creating the file $E2E_DIR/refuse-<key>, or fail on it with an
unexpected error (before sending, but the caller cannot know that) by
creating $E2E_DIR/crash-<key>.
"""
import datetime
import email.message
import os
import smtplib


def _checkpoint(key, point):
    d = os.environ.get("E2E_DIR")
    if not d:
        return
    fifo = f"{d}/pause-{key}-{point}"
    taken = f"{fifo}.taken-{os.getpid()}"
    try:
        os.rename(fifo, taken)
    except FileNotFoundError:
        return
    with open(f"{d}/at-{key}-{point}.tmp", "w") as f:
        f.write(f"{os.getpid()}\n")
    os.rename(f"{d}/at-{key}-{point}.tmp", f"{d}/at-{key}-{point}")
    with open(taken) as f:   # blocks until the test opens it for writing
        f.read()


class Refused(Exception):
    """The provider refused the request (say HTTP 429): nothing was sent."""


def _taken(what, key):
    d = os.environ.get("E2E_DIR")
    if not d:
        return False
    try:
        os.rename(f"{d}/{what}-{key}", f"{d}/{what}-{key}.taken-{os.getpid()}")
    except FileNotFoundError:
        return False
    return True


def send(to, subject, key):
    if _taken("refuse", key):
        raise Refused(f"429 too many requests: {to} not sent")
    if _taken("crash", key):
        raise ConnectionResetError(f"connection reset by the provider: {to} sent or not?")
    _checkpoint(key, "before")
    if os.environ.get("SMTP_PORT"):
        _smtp(to, subject, key)
    else:
        _log(to, subject, key)
    _checkpoint(key, "after")
    return {"accepted": True}


def _smtp(to, subject, key):
    msg = email.message.EmailMessage()
    msg["From"] = "orders@example.test"
    msg["To"] = to
    msg["Subject"] = subject
    msg["X-Operation-Key"] = key
    msg.set_content(f"Thank you for your order {key}.\n")
    host = os.environ.get("SMTP_HOST") or "127.0.0.1"
    try:
        with smtplib.SMTP(host, int(os.environ["SMTP_PORT"]), timeout=30) as smtp:
            smtp.send_message(msg)
    except (smtplib.SMTPSenderRefused, smtplib.SMTPRecipientsRefused, smtplib.SMTPDataError) as err:
        raise Refused(f"{host}: {err}: {to} not sent") from err


def _log(to, subject, key):
    line = f"{datetime.datetime.now().isoformat()}\t{key}\t{to}\t{subject}\tpid {os.getpid()}\n"
    fd = os.open(os.environ.get("MAIL_LOG", "outbox.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
