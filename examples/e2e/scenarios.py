"""scenarios.py: what a queue adds to the claim protocol, tested by name.

The seed's cases (1-7) and the runner's (9-13) are idempotency-matrix's
(`--job`, examples/e2e/signoff.py): one engine, one meaning per case number.
These are the rest, each through a real queue (harness.py's adapter of
examples/QUEUE/e2e.py) and named, never numbered:

  queue-redelivery-after-kill-claimed, -handled   the queue itself brings a
      killed worker's message back (SQS: its visibility timeout; Celery:
      task_reject_on_worker_lost); it meets the stale claim and the policy
      decides (hold: the sweeper hands it to a person)
  sweeper-retry          a held or skipped record; a person's 'retry'
      (resolve_operation) reaches a worker through the sweeper: sent once
  lost-message-sweeper   the queue lost the message of a claim (its own way);
      the sweeper hands the stale claim to a person or re-enqueues it
  known-failure-backoff  the provider refuses once: released, and the queue
      brings the message back after the helper's backoff (0 < wait <= lease/2)
  heartbeat-long-job     a job longer than two leases: never listed stale; a
      duplicate gets in_progress, is handed back, and comes back completed
  fingerprint-mismatch   the same key with another payload: ID002, and what
      the queue does with the refused message (the adapter checks)
  lost-reply             the reply to the claim is lost (test/faults/pgproxy.py):
      claimed again with the same delivery token, run #1, no lease waited
  stuck-transaction      a delivery behind another transaction's uncommitted
      claim: answered at once (in_progress) twice, sent once after the rollback

plus an adapter's own (own_scenarios). A scenario whose outcome depends on
the policy runs under each policy given; the others under the first only.
Output: one "ok - NAME (POLICY): note" or "not ok - NAME (POLICY): why" line
per run, the adapter's notes, and "N passed, N failed" last.
"""
import argparse
import os
import re
import shutil
import signal
import sys
import tempfile
import time

import psycopg

from harness import LEASE, Failed, FaultProxy, Run

OUTCOME = {"hold": "held", "retry": "run", "skip": "skipped"}
# emails and record after a death (5: before the email, 6: after it) once the
# policy decided, and after a lost message (the same as a death before it)
AFTER_DEATH = {
    "claimed": {"hold": (0, "claimed #1 (stale)"), "retry": (1, "completed #2"), "skip": (0, "skipped #1")},
    "handled": {"hold": (1, "claimed #1 (stale)"), "retry": (2, "completed #2"), "skip": (1, "skipped #1")},
}
STUCK = "stuck transaction"


def expect(r, keys, emails, record, rx, text=None):
    """the emails, the records and the verdict sequence of keys, or Failed"""
    got_e = sum(r.emails(k) for k in keys)
    got_r = ", ".join(r.record(k) for k in keys)
    shown, plain = r.verdicts(keys)
    bad = []
    if got_e != emails:
        bad.append(f"{got_e} emails, expected {emails}")
    if got_r != record:
        bad.append(f"record {got_r}, expected {record}")
    if re.fullmatch(rx, plain) is None:
        bad.append(f"verdicts {shown}, expected {text or rx}")
    if bad:
        raise Failed("; ".join(bad))
    return shown


def death_then_policy(r, key, point):
    """kill the worker at point; then whatever brings the message back (the
    queue, or the sweeper where the queue lost it) meets the stale claim.
    Returns the verdict expression of what happened"""
    a = r.a
    r.pause(key, "after" if point == "handled" else "before")
    a.publish(key)
    r.kill9(key, r.wait_paused(key, "after" if point == "handled" else "before"))
    acks = 0 if a.redelivery == "never" else 1
    r.ensure_workers()
    r.settle([key], acks)
    if r.record(key).startswith("claimed"):
        r.wait_stale(key)
        if r.sweep(key) != "person":
            r.settle([key], acks + 1)
    out = OUTCOME[r.policy]
    if a.redelivery == "never":
        tail = "sweeper: for a person" if r.policy == "hold" else f"sweeper: re-enqueued, {out}"
        return rf"run \(killed, job lost\), {tail}"
    held = ", sweeper: for a person" if r.policy == "hold" else ""
    # "at once" (Celery): inside the lease it is in_progress first
    again = "(in_progress, )?" if a.redelivery == "at once" else ""
    return rf"run \(killed\), {again}{out}{held}"


def redelivery_after_kill(point):
    def run(r, key):
        if r.a.redelivery == "never":
            raise Failed("the queue never brings a killed worker's message back (lost-message-sweeper)")
        rx = death_then_policy(r, key, point)
        emails, rec = AFTER_DEATH[point][r.policy]
        return expect(r, [key], emails, rec, rx)
    return run


def sweeper_retry(r, key):
    # a death before the email, under hold or skip: nothing delivers it again
    # (held or skipped). A person decides the email was not sent; the record
    # becomes released, and the sweeper (released for a lease, no claim)
    # re-enqueues it; the next claim runs attempt 2
    rx = death_then_policy(r, key, "claimed")
    rec = r.record(key)
    if rec not in ("claimed #1 (stale)", "skipped #1"):
        raise Failed(f"{key}: {rec} before the decision, expected held or skipped")
    done = r.done_count([key])
    r.resolve(key, "retry")
    if r.record(key) != "released #1":
        raise Failed(f"{key}: {r.record(key)} after resolve_operation(..., 'retry')")
    if r.sweep(key) != "released":
        raise Failed(f"{key}: the sweeper did not re-enqueue the released record")
    r.settle([key], done + 1)
    return expect(r, [key], 1, "completed #2",
                  rx + r", person: retry, sweeper: re-enqueued \(released\), run")


def lost_message_sweeper(r, key):
    # the worker's message is gone for good (how depends on the system:
    # lose()); only the stale claim remains, and only the sweeper finds it
    a = r.a
    a.lose(r, key)
    r.ensure_workers()
    rec = r.record(key)
    if not rec.startswith("claimed #1"):
        raise Failed(f"{key}: {rec} after the message was lost, expected claimed #1")
    r.wait_stale(key)
    got = r.sweep(key)
    want = "person" if r.policy == "hold" else "stale"
    if got != want:
        raise Failed(f"{key}: the sweeper reported {got!r}, expected {want!r}")
    if want == "stale":
        r.settle([key], 1)   # only the sweeper's copy can bring it to a worker
    tail = ", sweeper: for a person" if r.policy == "hold" else f", sweeper: re-enqueued, {OUTCOME[r.policy]}"
    emails, rec = AFTER_DEATH["claimed"][r.policy]
    return expect(r, [key], emails, rec, a.lost_rx + tail, a.lost_text + tail)


def known_failure_backoff(r, key):
    # the provider refuses the first email: the job raises KnownFailure, the
    # helper releases the claim and the queue brings the job back after a
    # backoff; the next claim runs attempt 2
    r.refuse(key)
    r.a.publish(key)
    evs = r.settle([key], 1)
    rel = [e for e in evs if e["action"] == "released"]
    if len(rel) != 1:
        raise Failed(f"{key}: {len(rel)} releases, expected 1")
    later = [e for e in evs if e["action"] == "work" and e["t"] > rel[0]["t"]]
    gap = later[0]["t"] - rel[0]["t"] if later else None
    wait = float(rel[0].get("retry_in", -1))
    if gap is None or not 0 < wait <= LEASE / 2 or gap < wait - 0.1:
        raise Failed(f"{key}: the next run came {gap} s after the release; "
                     f"the helper said it would wait {wait} s (0 < wait <= lease/2)")
    shown = expect(r, [key], 1, "completed #2", r"run \(released\), run")
    return f"{shown}; next run {gap:.1f} s after the release (backoff {wait:.1f} s)"


def heartbeat_long_job(r, key):
    # the worker stops before the email for more than two leases; its
    # helper's heartbeat (extend_lease) keeps the claim young, so
    # stale_claims() never lists it; a duplicate gets in_progress, is handed
    # back to the queue, and comes back (completed) after the job is done
    r.pause(key, "before")
    r.a.publish(key)
    pid = r.wait_paused(key, "before")
    t0 = time.time()
    late_checks = 0
    dup = False
    while time.time() < t0 + 2 * LEASE + 0.5:
        if r.stale_listed(key):
            raise Failed(f"{key}: listed by stale_claims() {time.time() - t0:.1f} s into the "
                         f"job: the heartbeat did not extend the lease")
        if time.time() - t0 > LEASE:
            late_checks += 1
            if not dup:
                r.a.publish(key)   # a duplicate, after the first lease
                dup = True
        r.check_workers_alive()
        time.sleep(0.05)
    r.wait_events([key], lambda evs: any(e["verdict"] == "in_progress" for e in evs),
                  "the duplicate's in_progress")
    rec = r.record(key)
    if r.stale_listed(key) or rec != "claimed #1 (young)":
        raise Failed(f"{key}: {rec} after {time.time() - t0:.1f} s, expected claimed #1 (young)")
    paused = time.time() - t0
    r.release(key, "before", pid)
    r.settle([key], 2)
    shown = expect(r, [key], 1, "completed #1", "run, in_progress, completed")
    return (f"{shown}; paused {paused:.1f} s ({paused / LEASE:.1f} leases), stale_claims() "
            f"checked {late_checks} times after the first lease: never listed")


def fingerprint_mismatch(r, key):
    # the same key with another payload: the caller's bug; the claim is
    # refused (ID002) and the helper fails loudly; nothing is sent again
    a = r.a
    a.publish(key)
    r.settle([key], 1)
    a.publish(key, other=True)
    evs = r.wait_events([key], lambda evs: any(e["verdict"] == "claim error" for e in evs),
                        "the refused claim")
    err = [e for e in evs if e["verdict"] == "claim error"][0]
    if err.get("sqlstate") != "ID002":
        raise Failed(f"{key}: claim error {err.get('sqlstate')}, expected ID002")
    note = a.check_refused(r, key)
    act = a.refused_action
    shown = expect(r, [key], 1, "completed #1", rf"run, claim error \(ID002, {act}\)")
    return shown + (f"; {note}" if note else "")


def lost_reply(r, key):
    # the workers connect through the fault proxy, which forwards the next
    # claim_operation call, swallows the server's reply and closes the
    # connection. The claim was committed; the helper only saw a lost
    # connection. It claims again on a new connection with the same delivery
    # token and gets its own claim back: run with the same attempt, not
    # in_progress (which would cost a lease, and under hold the email)
    proxy = r.faults.start()
    try:
        r.restart_workers(proxy.env())
        before = len(r.events())
        dropped = proxy.dropped()
        proxy.ctl("drop-reply claim_operation 1")
        t0 = time.time()
        r.a.publish(key)
        evs = r.settle([key], 1)
        done = [e for e in evs if e["action"] in ("completed", "superseded")]
        lost = [e for e in evs if e["verdict"] == "claim error"]
        if not lost:
            others = [e for e in r.events()[before:] if e["verdict"] == "claim error"]
            raise Failed(f"{key}: no claim of it lost its reply"
                         + (f" (the proxy dropped the reply to {others[0]['key']}'s claim)" if others else
                            f" (proxy stats: {proxy.ctl('stats')})"))
        if proxy.dropped() != dropped + 1:
            raise Failed(f"{key}: the proxy dropped {proxy.dropped() - dropped} replies, expected 1")
        if any(e["verdict"] == "in_progress" for e in evs):
            raise Failed(f"{key}: the claim after the lost reply was answered in_progress")
        runs = [e for e in evs if e["action"] == "work"]
        if [e["attempt"] for e in runs] != [1]:
            raise Failed(f"{key}: runs with attempts {[e['attempt'] for e in runs]}, expected [1]")
        shown = expect(r, [key], 1, "completed #1", r.a.lost_reply_rx, r.a.lost_reply_text)
        return (f"{shown}; the claim again on a new connection got run #1 "
                f"{runs[0]['t'] - lost[0]['t']:.2f} s after the lost reply, completed "
                f"{done[0]['t'] - t0:.1f} s after the publish (lease {LEASE:g} s)")
    finally:
        r.restart_workers({})


def stuck_transaction(r, key):
    # another session holds an uncommitted claim of the key (the
    # transactional mode; a worker stuck or idle in transaction). A delivery
    # must not wait for it: the helper answers at once (in_progress, or its
    # lock_timeout) and hands the message back to the queue for later, so the
    # worker is free again while the transaction is still open (twice: the
    # queue's retry meets it too). Once it is rolled back, a later delivery
    # runs, one email
    stuck = psycopg.connect(autocommit=False)
    try:
        stuck.execute("SELECT verdict FROM idempotency.claim_operation(%s, %s, NULL, %s)",
                      (r.job_type, key, "e2e: stuck transaction"))
        r.note(key, f"{STUCK}: claim (uncommitted)")
        t0 = time.time()
        r.a.publish(key)
        busy = ("in_progress", "claim error")
        evs = r.wait_events([key], lambda evs: sum(e["verdict"] in busy for e in evs) >= 2,
                            "two deliveries answered while the transaction is open")
        answers = [e for e in evs if e["verdict"] in busy]
        for e in answers:
            if e["action"] != "retry" or (e["verdict"] == "claim error"
                                          and e.get("sqlstate") not in ("55P03", "57014")):
                raise Failed(f"{key}: a delivery behind the open transaction: {e['verdict']} "
                             f"({e.get('sqlstate')}) -> {e['action']}, expected in_progress -> retry")
        if r.emails(key) or any(e["action"] == "work" for e in evs):
            raise Failed(f"{key}: ran while the other transaction held the claim")
        held = time.time() - t0
        stuck.rollback()
        r.note(key, f"{STUCK}: rolled back")
    finally:
        stuck.close()
    r.settle([key], 1)
    # in_progress (or the helper's bound: 55P03, 57014) until the rollback; a
    # delivery claimed just before it may answer after it
    b = r"(in_progress|claim error \((55P03|57014), retry\))"
    shown = expect(r, [key], 1, "completed #1",
                   rf"{STUCK}: claim \(uncommitted\), {b}(, {b})*, {STUCK}: rolled back, ({b}, )*run")
    return (f"{shown}; answered {answers[0]['t'] - t0:.1f} and {answers[1]['t'] - t0:.1f} s "
            f"after the publish, the transaction open for {held:.1f} s")


# name -> (run(r, key) -> note, policies): "each" (the outcome depends on
# the policy), "once" (the first policy given), or the policies it needs
SCENARIOS = {
    "queue-redelivery-after-kill-claimed": (redelivery_after_kill("claimed"), "each"),
    "queue-redelivery-after-kill-handled": (redelivery_after_kill("handled"), "each"),
    "sweeper-retry": (sweeper_retry, ("hold", "skip")),   # under retry nothing waits for a person
    "lost-message-sweeper": (lost_message_sweeper, "each"),
    "known-failure-backoff": (known_failure_backoff, "once"),
    "heartbeat-long-job": (heartbeat_long_job, "once"),
    "fingerprint-mismatch": (fingerprint_mismatch, "once"),
    "lost-reply": (lost_reply, "once"),
    "stuck-transaction": (stuck_transaction, "once"),
}


def plan(adapter, policies, only):
    """[(policy, [(name, run)])] in the order of the policies"""
    table = dict(SCENARIOS)
    if adapter.redelivery == "never":
        # the queue never brings a killed worker's message back: that is
        # lost-message-sweeper on this system
        table = {n: v for n, v in table.items() if not n.startswith("queue-redelivery-after-kill")}
    table.update({n: (run, pol) for n, _, run, pol in adapter.own_scenarios})
    table = {n: v for n, v in table.items() if n not in adapter.left_out}
    unknown = [n for n in only if n not in table]
    if unknown:
        raise SystemExit(f"unknown scenario {', '.join(unknown)} for {adapter.title}; "
                         f"known: {', '.join(table)}")
    out = []
    for i, policy in enumerate(policies):
        runs = [(n, run) for n, (run, pol) in table.items()
                if (not only or n in only)
                and (pol == "each" or (pol == "once" and i == 0) or (isinstance(pol, tuple) and policy in pol))]
        if runs:
            out.append((policy, runs))
    return out


def main(adapter, argv=None):
    ap = argparse.ArgumentParser(description=f"the end-to-end scenarios through {adapter.title}")
    ap.add_argument("--policy", default=os.environ.get("E2E_POLICIES", "hold,retry,skip"),
                    help="comma-separated: hold,retry,skip (default hold,retry,skip): the "
                    "scenarios that depend on the policy run under each, the others under the first")
    ap.add_argument("--only", default="", help="comma-separated scenario names (default: all)")
    ap.add_argument("--list", action="store_true", help="print the scenarios' names and exit")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args(argv)
    policies = args.policy.split(",")
    runs = plan(adapter, policies, [n for n in args.only.split(",") if n])
    if args.list:
        for policy, names in runs:
            print(policy, " ".join(n for n, _ in names))
        return 0
    # a SIGTERM (scripts/test stopping the hook) ends the run through the
    # finally blocks below, so the workers and the broker are stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix=f"e2e-{adapter.name}-")
    os.chmod(tmp, 0o755)
    passed = failed = 0
    print(f"== {adapter.title}: end-to-end scenarios (policies {', '.join(policies)}; lease {LEASE:g} s)")
    for name, why in adapter.left_out.items():
        print(f"# left out: {name}: {why}")
    faults = FaultProxy(tmp)
    try:
        tb = time.time()
        adapter.start_broker(tmp)
        print(f"broker up in {time.time() - tb:.1f} s: {adapter.broker_desc}", flush=True)
        for policy, names in runs:
            adapter.begin(policy)
            r = Run(adapter, policy, tmp, faults)
            r.setup_db()
            try:
                r.ensure_workers()
                for name, run in names:
                    ts = time.time()
                    try:
                        note = run(r, f"ORD-{name}")
                        print(f"ok - {name} ({policy}): {note} [{time.time() - ts:.1f} s]", flush=True)
                        passed += 1
                    except Failed as e:
                        print(f"not ok - {name} ({policy}): {e} [{time.time() - ts:.1f} s]", flush=True)
                        failed += 1
                        args.keep = True
            finally:
                r.stop_workers()
                for log in r.logs:
                    log.close()
                r.cleanup_db()
    finally:
        faults.stop()
        adapter.stop_broker()
        if args.keep:
            print(f"kept: {tmp} (events.jsonl, outbox.log, worker-*.log, sweeper.log per policy)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    for note in adapter.notes:
        print(note)
    print(f"{adapter.title}: {time.time() - t0:.1f} s in all")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1
