"""The mail provider, outside the database. With $SMTP_PORT set, send()
sends a real email through SMTP to $SMTP_HOST (default 127.0.0.1), with the
header X-Operation-Key: <key> (the job's operation key, which the sign-off
run's SMTP endpoint counts by); the server's 250 to DATA means sent. A
refusal for now (a 4xx reply: 451, 421, ...) or no server listening raises
Refused: nothing was sent, try again later. A refusal for good (a 5xx
reply: 550 no such mailbox, ...) raises RefusedForGood: nothing was sent,
and asking again changes nothing. No reply within $SMTP_TIMEOUT seconds
(default 30) raises TimeoutError: the server may have taken the email, the
caller cannot know. Without $SMTP_PORT it is a fake: every email is
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
    """The provider refused the request for now (say HTTP 429, SMTP 451) or
    could not be reached: nothing was sent; a later try may succeed."""


class RefusedForGood(Exception):
    """The provider refused the request for good (SMTP 550): nothing was
    sent, and sending again would be refused again."""


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
    # every connect, read and write; without it a server that takes the
    # message and never answers holds the worker (and its claim) for ever
    timeout = float(os.environ.get("SMTP_TIMEOUT") or 30)
    try:
        with smtplib.SMTP(host, int(os.environ["SMTP_PORT"]), timeout=timeout) as smtp:
            smtp.send_message(msg)
    except smtplib.SMTPRecipientsRefused as err:   # every recipient refused: {rcpt: (code, text)}
        codes = [code for code, _ in err.recipients.values()]
        if all(500 <= code < 600 for code in codes):
            raise RefusedForGood(f"{host}: {err}: {to} not sent") from err
        raise Refused(f"{host}: {err}: {to} not sent") from err
    except (smtplib.SMTPSenderRefused, smtplib.SMTPDataError) as err:
        if 500 <= err.smtp_code < 600:   # 550: refused for good
            raise RefusedForGood(f"{host}: {err}: {to} not sent") from err
        raise Refused(f"{host}: {err}: {to} not sent") from err   # 4xx: try again later
    except ConnectionRefusedError as err:   # nothing listens: nothing was sent
        raise Refused(f"{host}: {err}: {to} not sent") from err
    # anything else (TimeoutError: no reply in time, a connection reset
    # after DATA) propagates: the email may have been sent


def _log(to, subject, key):
    line = f"{datetime.datetime.now().isoformat()}\t{key}\t{to}\t{subject}\tpid {os.getpid()}\n"
    fd = os.open(os.environ.get("MAIL_LOG", "outbox.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
