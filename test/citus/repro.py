#!/usr/bin/python3
"""The cases of issue 11 against a distributed install (see repro.sh).

Connects with PGHOST/PGPORT/PGDATABASE (the coordinator; CITUS_PORT_W1 and
CITUS_PORT_W2 name the workers). Every case runs in two modes:
  autocommit         each call is one autocommit statement;
  transaction block  each call inside BEGIN ... COMMIT.
In both Citus delegates the call to the worker that holds the key
(distribute() delegates with force_delegation, so that a transaction's own
writes to colocated tables go to the same worker in the same connection).
Prints, per case and mode, what a single node answers ("want") and what
this cluster answered ("got"), and OK or WRONG. Exit status 0 when it ran.
"""
import os
import select
import sys
import threading
import time

import psycopg

MODES = ("autocommit", "transaction block")
rows = []


def connect(port=None, user="postgres", autocommit=True):
    kw = {}
    if port:
        kw["port"] = port
    return psycopg.connect(user=user, autocommit=autocommit, **kw)


class Caller:
    """Calls the worker functions in one mode over one connection."""

    def __init__(self, mode, user="postgres"):
        self.mode = mode
        self.conn = connect(user=user)

    def call(self, sql, args=()):
        if self.mode == "autocommit":
            cur = self.conn.execute(sql, args)
            return cur.fetchall() if cur.description else None
        with self.conn.transaction():
            cur = self.conn.execute(sql, args)
            return cur.fetchall() if cur.description else None

    def claim(self, jt, key, fp=None):
        r = self.call("SELECT verdict, attempt FROM idempotency.claim_operation(%s, %s, %s)",
                      (jt, key, fp))
        return "%s|%s" % r[0]

    def complete(self, jt, key, attempt):
        self.call("SELECT idempotency.complete_operation(%s, %s, %s)", (jt, key, attempt))

    def release(self, jt, key, attempt):
        self.call("SELECT idempotency.release_operation(%s, %s, %s)", (jt, key, attempt))


def outcome(fn):
    """fn's value, or 'ERROR <sqlstate>: <message>'."""
    try:
        v = fn()
        return "ok" if v is None else str(v)
    except psycopg.Error as e:
        msg = (e.diag.message_primary or str(e)).splitlines()[0]
        return "ERROR %s: %s" % (e.sqlstate, msg[:90])


def report(case, mode, want, got, ok=None):
    if ok is None:
        ok = got == want
    rows.append((case, mode, want, got, "OK" if ok else "WRONG"))
    print("%-46s %-14s want %-34s got %-40s %s" % (case, mode, want, got, "OK" if ok else "WRONG"),
          flush=True)


def admin(sql, args=()):
    with connect() as c:
        cur = c.execute(sql, args)
        return cur.fetchall() if cur.description else None


def main():
    admin("""INSERT INTO idempotency.job_types (job_type, lease, stale_policy) VALUES
             ('email', '10 minutes', 'hold'), ('retry1s', '1 second', 'retry'),
             ('hold1s', '1 second', 'hold'), ('purge', '10 minutes', 'hold')""")
    # purge: a retention the records are already past
    admin("UPDATE idempotency.job_types SET retention = '1 second' WHERE job_type = 'purge'")

    for m, mode in enumerate(MODES):
        p = "m%d-" % m
        c = Caller(mode)

        # 1. a completed key claimed again (100 keys)
        n_run = 0
        for i in range(100):
            k = "%sdone-%d" % (p, i)
            v = c.claim("email", k)
            c.complete("email", k, int(v.split("|")[1]))
            if c.claim("email", k).startswith("run"):
                n_run += 1
        report("completed key claimed again: run (of 100)", mode, "0", str(n_run))

        # 2. 4 concurrent clients on the same 150 keys
        keys = ["%srace-%d" % (p, i) for i in range(150)]
        counts = []
        lock = threading.Lock()

        def client():
            cc = Caller(mode)
            n = 0
            for k in keys:
                try:
                    if cc.claim("email", k).startswith("run"):
                        n += 1
                except psycopg.Error:
                    pass
            with lock:
                counts.append(n)
            cc.conn.close()

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        report("4 clients x 150 keys: run", mode, "150", str(sum(counts)))

        # 3. release, then claim
        k = p + "rel"
        c.claim("email", k)
        c.release("email", k, 1)
        report("release, then claim", mode, "run|2", outcome(lambda: c.claim("email", k)))

        # 4. another fingerprint
        k = p + "fp"
        c.claim("email", k, "sha:a")
        got = outcome(lambda: c.claim("email", k, "sha:b"))
        report("claim with another fingerprint", mode, "ERROR ID002", got,
               got.startswith("ERROR ID002"))

        # 5. a stale claim under retry, and the old attempt's completion
        k = p + "stale-retry"
        c.claim("retry1s", k)
        time.sleep(1.2)
        report("stale claim under retry", mode, "run|2", outcome(lambda: c.claim("retry1s", k)))
        got = outcome(lambda: c.complete("retry1s", k, 1))
        report("completion by the taken-over attempt 1", mode, "ERROR ID003", got,
               got.startswith("ERROR ID003"))

        # 6. a stale claim under hold, and the NOTIFY: the call runs on the
        # worker holding the key (in both modes: delegated), and notifies
        # there; the README says to LISTEN on every node. Listeners on the
        # three nodes; the node that must hear it.
        k = p + "stale-hold"
        c.claim("hold1s", k)
        time.sleep(1.2)
        holder = admin("""SELECT n.nodeport FROM pg_dist_placement pl JOIN pg_dist_node n USING (groupid)
                          WHERE pl.shardid = get_shard_id_for_distribution_column('idempotency.operations', %s::text)""",
                       (k,))[0][0]
        nodes = {"coordinator": None, "w1": os.environ["CITUS_PORT_W1"], "w2": os.environ["CITUS_PORT_W2"]}
        want_node = [n for n, port in nodes.items() if port and int(port) == holder][0]
        listeners = {}
        heard = {}
        for n, port in nodes.items():
            listeners[n] = connect(port=port)
            listeners[n].execute("LISTEN idempotency_held")
            heard[n] = []
            listeners[n].add_notify_handler(heard[n].append)
        report("stale claim under hold", mode, "held|1", outcome(lambda: c.claim("hold1s", k)))
        deadline = time.time() + 2
        while time.time() < deadline and not any(heard.values()):
            select.select([l.fileno() for l in listeners.values()], [], [], 0.2)
            for l in listeners.values():
                l.execute("SELECT 1")    # reads what arrived
        time.sleep(0.2)
        for l in listeners.values():
            l.execute("SELECT 1")
            l.close()
        got = ",".join("%s:%d" % (n, len(h)) for n, h in heard.items() if h) or "none"
        report("idempotency_held NOTIFY heard where the call ran", mode, want_node + ":1", got)

        # 7. extend_lease
        k = p + "extend"
        c.claim("email", k)
        got = outcome(lambda: c.call("SELECT idempotency.extend_lease('email', %s, 1) IS NOT NULL", (k,))[0][0])
        report("extend_lease of a young claim", mode, "True", got)

        # 8. transactional mode: a duplicate waits for the first transaction
        k = p + "tx"
        a = connect(autocommit=False)
        a.execute("SELECT * FROM idempotency.claim_operation('email', %s)", (k,))
        result = {}

        def dup():
            b = Caller(mode)
            result["v"] = outcome(lambda: b.claim("email", k))
            b.conn.close()

        t = threading.Thread(target=dup)
        t.start()
        time.sleep(0.5)
        a.execute("SELECT idempotency.complete_operation('email', %s, 1)", (k,))
        a.commit()
        a.close()
        t.join(timeout=60)
        report("transactional: duplicate after commit", mode, "completed|1", result.get("v", "timeout"))

        c.conn.close()

    # mode-independent cases (operator functions run on the coordinator)
    c = Caller("autocommit")
    got = outcome(lambda: c.call("SELECT count(*) FROM idempotency.stale_claims() "
                                 "WHERE job_type IN ('hold1s', 'retry1s')")[0][0])
    # the held claims of both modes, and the attempts 2 that took the
    # retry1s claims over and were never completed (lease 1 s: stale by now)
    report("stale_claims() (m0/m1: hold1s claims, retry1s attempts 2)", "-", "4", got)
    got = outcome(lambda: c.call(
        "SELECT completed FROM idempotency.job_type_stats WHERE job_type = 'email'")[0][0])
    report("job_type_stats: completed of email", "-", "200 + 2 tx", got, got == "202")
    got = outcome(lambda: c.call(
        "SELECT idempotency.resolve_operation('hold1s', 'm0-stale-hold', 'retry', 'repro')")
        and None)   # returns void: a row with an empty value
    report("resolve_operation of a held claim", "-", "ok", got)
    for i in range(20):
        k = "purge-%d" % i
        c.claim("purge", k)
        c.complete("purge", k, 1)
    time.sleep(1.2)
    got = outcome(lambda: c.call("SELECT idempotency.purge_operations()")[0][0])
    report("purge_operations() of 20 expired records", "-", "20", got)
    got = outcome(lambda: c.conn.execute("CALL idempotency.purge()").fetchall()[0][0])
    report("CALL idempotency.purge() (after the above)", "-", "20 or 0 if already purged", got,
           got in ("0", "20"))
    left = admin("SELECT count(*) FROM idempotency.operations WHERE job_type = 'purge'")[0][0]
    report("records of 'purge' left after both purges", "-", "0", str(left))
    got = outcome(lambda: c.call("DELETE FROM idempotency.job_types WHERE job_type = 'email' RETURNING 1"))
    report("delete a job type that has records", "-", "ERROR 23503", got, got.startswith("ERROR 23503"))
    got = outcome(lambda: c.call("DELETE FROM idempotency.job_types WHERE job_type = 'hold1s' AND false RETURNING 1"))
    report("a DELETE on job_types that matches nothing", "-", "[]", got)

    # the transactional mode on one shard group: claim, a side-effect row in
    # a table distributed by the key in the records' colocation group, and
    # the completion, in one transaction: Citus's log of the commands it
    # sends (citus.log_remote_commands) shows one worker, and no PREPARE
    # TRANSACTION (two-phase commit); a transaction that writes keys on two
    # workers shows it, so the check can fail
    admin("CREATE TABLE public.emails (operation_key text NOT NULL, body text NOT NULL)")
    admin("SELECT create_distributed_table('public.emails', 'operation_key', "
          "colocate_with => 'idempotency.operations')")

    # as a role that is not the tables' owner, with the README's grants
    # (the claim's statements run with the owner's rights)
    admin("CREATE ROLE txworker LOGIN")
    admin("GRANT USAGE ON SCHEMA idempotency TO txworker")
    admin("GRANT EXECUTE ON FUNCTION idempotency.claim_operation(text, text, text, text, text, boolean), "
          "idempotency.complete_operation(text, text, integer, jsonb) TO txworker")
    admin("GRANT SELECT, INSERT ON public.emails TO txworker")
    admin("SELECT idempotency.distribute_grants()")

    def remote_log(keys):
        notices = []
        with connect(user="txworker", autocommit=False) as t:
            t.add_notice_handler(lambda d: notices.append((d.message_primary or "", d.message_detail or "")))
            t.execute("SET LOCAL citus.log_remote_commands = on")
            t.execute("SET LOCAL client_min_messages = notice")
            for k in keys:
                t.execute("SELECT * FROM idempotency.claim_operation('email', %s)", (k,))
                t.execute("INSERT INTO public.emails VALUES (%s, 'hello')", (k,))
                t.execute("SELECT idempotency.complete_operation('email', %s, 1)", (k,))
            t.commit()
        servers = {d for m, d in notices if m.startswith("issuing ") and d.startswith("on server ")}
        prepared = sum(m.startswith("issuing PREPARE TRANSACTION") for m, d in notices)
        committed = sum(m == "issuing COMMIT" for m, d in notices)
        return "%d node(s), %d PREPARE, %d COMMIT" % (len(servers), prepared, committed)

    got = outcome(lambda: remote_log(["tx-2pc-one"]))
    report("transactional: claim + effect row + complete (txworker)", "-", "1 node(s), 0 PREPARE, 1 COMMIT", got)
    # two keys whose shards are on different workers
    by_group = {}
    for i in range(1, 51):
        k = "tx-2pc-%d" % i
        g = admin("SELECT groupid FROM pg_dist_placement WHERE shardid = "
                  "get_shard_id_for_distribution_column('idempotency.operations', %s::text)", (k,))[0][0]
        by_group.setdefault(g, k)
    got = outcome(lambda: remote_log(sorted(by_group.values())[:2]))
    report("the check can fail: two keys on two workers", "-", "2 node(s), 2 PREPARE, 0 COMMIT", got)
    got = outcome(lambda: c.call("SELECT count(*) FROM public.emails e JOIN idempotency.operations o "
                                 "USING (operation_key) WHERE o.status = 'completed'")[0][0])
    report("effect rows of completed records (colocated join)", "-", "3", got)

    # records written before distribution: the coordinator's local copy
    # (not readable through SQL, which Citus routes to the shards: its
    # tuples on disk, with pageinspect)
    admin("CREATE EXTENSION IF NOT EXISTS pageinspect")
    local = admin("""SELECT count(*) FROM generate_series(0,
                        pg_relation_size('idempotency.operations') / current_setting('block_size')::int - 1) b,
                     heap_page_items(get_raw_page('idempotency.operations', b::int)) t
                     WHERE t.t_xmax = 0 AND t.lp_flags = 1""")[0][0]
    shards = admin("SELECT count(*) FROM idempotency.operations WHERE job_type = 'pre'")[0][0]
    report("pre-distribution records, through Citus", "-", "3", str(shards))
    for mode in MODES:
        cm = Caller(mode)
        report("claim of a key completed before distribution", mode, "completed|1",
               outcome(lambda: cm.claim("pre", "done-before")))
        # the same key in both modes: the first claim takes it over (attempt
        # 2), the second finds that young claim
        report("claim of a key released before distribution", mode,
               "run|2" if mode == MODES[0] else "in_progress|2",
               outcome(lambda: cm.claim("pre", "released-before")))
        cm.conn.close()
    admin("DELETE FROM idempotency.operations WHERE operation_key = 'done-before'")
    for mode in MODES:
        cm = Caller(mode)
        report("key completed before distribution, deleted after", mode, "run|1",
               outcome(lambda: cm.claim("pre", "done-before")))
        cm.conn.close()
        admin("DELETE FROM idempotency.operations WHERE operation_key = 'done-before'")

    # the other statuses made before distribution: skipped, held, resolved
    for mode in MODES:
        cm = Caller(mode)
        report("claim of a key skipped before distribution", mode, "skipped|1",
               outcome(lambda: cm.claim("pre_skip", "skipped-before")))
        report("claim of a claim held before distribution", mode, "held|1",
               outcome(lambda: cm.claim("pre_hold", "held-before")))
        report("claim of a key resolved before distribution", mode, "completed|1",
               outcome(lambda: cm.claim("pre_hold", "resolved-before")))
        cm.conn.close()
    got = outcome(lambda: c.call("SELECT string_agg(operation_key || ':' || resolution, ',') "
                                 "FROM idempotency.resolutions WHERE job_type = 'pre_hold'")[0][0])
    report("audit row made before distribution", "-", "resolved-before:completed", got)
    got = outcome(lambda: c.call("SELECT string_agg(operation_key, ',') FROM idempotency.stale_claims('pre_hold')")[0][0])
    report("stale_claims() of a claim held before distribution", "-", "held-before", got)

    # per-job-type roles: alice is a member of mailer (job type made before distribution)
    for mode in MODES:
        ca = Caller(mode, user="alice")
        report("claim by a member of worker_role (alice)", mode, "run|1",
               outcome(lambda: ca.claim("pre_roled", "roled-" + mode)))
        ca.conn.close()
    # grants made after distribute(): the schema's do not reach the workers
    # (the schema belongs to the extension), so a delegated call fails there;
    # idempotency.distribute_grants() copies them, and a REVOKE the same way
    admin("CREATE ROLE late LOGIN")
    admin("GRANT USAGE ON SCHEMA idempotency TO late")
    admin("GRANT EXECUTE ON FUNCTION idempotency.claim_operation(text, text, text, text, text, boolean) TO late")
    cl = Caller("autocommit", user="late")
    got = outcome(lambda: cl.claim("email", "late-before-sync"))
    report("grant made after distribute(), before distribute_grants()", "autocommit",
           "ERROR 42501 (on the worker)", got, got.startswith("ERROR 42501"))
    got = outcome(lambda: admin("SELECT idempotency.distribute_grants()") and None)
    report("distribute_grants()", "-", "ok", got)
    got = outcome(lambda: cl.claim("email", "late-after-sync"))
    report("the same call after distribute_grants()", "autocommit", "run|1", got)
    admin("REVOKE USAGE ON SCHEMA idempotency FROM late")
    admin("SELECT idempotency.distribute_grants()")
    cl.conn.close()
    cl = Caller("autocommit", user="late")
    got = outcome(lambda: cl.claim("email", "late-after-revoke"))
    report("after REVOKE and distribute_grants()", "autocommit", "ERROR 42501", got,
           got.startswith("ERROR 42501"))
    cl.conn.close()
    got = outcome(lambda: admin("""SELECT string_agg(result, ',') FROM run_command_on_workers(
        $$SELECT count(*) FROM idempotency.object_grants() WHERE grantee = 'late'$$)""")[0][0])
    report("grants to the revoked role left on the workers", "-", "1,1 (claim_operation's, propagated)", got,
           got == "1,1")
    # per-job-type roles with the grants on the workers (mailer's, made before distribute())
    ca = Caller("autocommit", user="alice")
    report("claim by a member of worker_role, job type made before distribution", "autocommit", "run|1",
           outcome(lambda: ca.claim("pre_roled", "roled-after-grants")))
    ca.conn.close()
    oids = admin("""SELECT 'coordinator: mailer ' || (SELECT oid FROM pg_roles WHERE rolname = 'mailer')
                    || ', job_types.worker_role ' || (SELECT worker_role::oid FROM idempotency.job_types
                                                      WHERE job_type = 'pre_roled')""")[0][0]
    print("role oids: " + oids)
    for r in admin("""SELECT nodeport, result FROM run_command_on_workers($$SELECT
                          'mailer ' || (SELECT oid FROM pg_roles WHERE rolname = 'mailer')
                          || ', job_types.worker_role ' || (SELECT worker_role::oid FROM idempotency.job_types
                                                            WHERE job_type = 'pre_roled')$$)"""):
        print("role oids: worker %s: %s" % r)

    # where the data is
    w1, w2 = os.environ["CITUS_PORT_W1"], os.environ["CITUS_PORT_W2"]
    for name, port in (("w1", w1), ("w2", w2)):
        with connect(port=port) as w:
            n = w.execute("SELECT count(*) FROM idempotency.operations").fetchone()[0]
            print("worker %s: idempotency.operations (through Citus) %d rows" % (name, n))
    with connect() as co:
        n = co.execute("SELECT count(*) FROM idempotency.operations").fetchone()[0]
        print("coordinator: idempotency.operations %d rows through Citus; %s rows left in its local relation "
              "(tuples on disk of the table before distribution, read by the C probe)" % (n, local))

    wrong = [r for r in rows if r[4] == "WRONG"]
    print("\nsummary: %d cases, %d as on one node, %d WRONG" % (len(rows), len(rows) - len(wrong), len(wrong)))
    # REPRO_STRICT=1 (hook 93): every case must answer as on one node
    if os.environ.get("REPRO_STRICT") == "1" and wrong:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
