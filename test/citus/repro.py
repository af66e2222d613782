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
# the same cases with the client on worker w1 (issue 20): keys w1 holds are
# worked on their shard directly in autocommit (src/store_shard.c), through
# Citus's local execution in a transaction block; w2's keys are delegated
# there
W1_MODES = ("w1 autocommit", "w1 tx block")
# and again through the calls in place (0.4: the *_in_place names, which
# Citus does not delegate): w1's keys on their shard directly in autocommit,
# through Citus in a transaction block; w2's keys through Citus from w1
IN_PLACE_MODES = ("w1 in place autocommit", "w1 in place tx block")
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
        port = os.environ["CITUS_PORT_W1"] if mode.startswith("w1") else None
        self.conn = connect(port=port, user=user)
        self.suffix = "_in_place" if "in place" in mode else ""

    def fn(self, name):
        """the function's name in this mode"""
        return "idempotency." + name + self.suffix

    def call(self, sql, args=()):
        if self.mode.endswith("autocommit"):
            cur = self.conn.execute(sql, args)
            return cur.fetchall() if cur.description else None
        with self.conn.transaction():
            cur = self.conn.execute(sql, args)
            return cur.fetchall() if cur.description else None

    def claim(self, jt, key, fp=None):
        r = self.call("SELECT verdict, attempt FROM " + self.fn("claim_operation") + "(%s, %s, %s)",
                      (jt, key, fp))
        return "%s|%s" % r[0]

    def complete(self, jt, key, attempt):
        self.call("SELECT " + self.fn("complete_operation") + "(%s, %s, %s)", (jt, key, attempt))

    def release(self, jt, key, attempt):
        self.call("SELECT " + self.fn("release_operation") + "(%s, %s, %s)", (jt, key, attempt))


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

    for m, mode in enumerate(MODES + W1_MODES + IN_PLACE_MODES):
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

        # 3b. wait => false (0.4: its write waits at most 1 s), a key of
        # the node the call is made on (w1 in w1's modes): another
        # transaction's uncommitted claim of the key answers in_progress at
        # once where the call runs on the key's shard (delegated, or on its
        # worker outside a transaction block); inside a transaction block
        # on the worker, where Citus runs the statements (local execution),
        # there is no such check and the write raises 55P03 after the bound.
        # A lock on the key's shard, held on its worker, raises 55P03 after
        # the bound (were the bound not where the write runs, the call would
        # wait for the holder until statement_timeout: 57014), and nothing
        # is recorded
        k = keys_on(os.environ["CITUS_PORT_W1"], 1, p + "nowait-")[0] if mode.startswith("w1") else p + "nowait"
        nowait = ("SELECT verdict, attempt FROM " + c.fn("claim_operation") +
                  "('email', %s, NULL, NULL, %s, wait => false)")
        holder = connect(autocommit=False)
        holder.execute("SELECT idempotency.claim_operation('email', %s)", (k,))
        got = outcome(lambda: "%s|%s" % c.call(nowait, (k, "d1"))[0])
        report("wait => false: a claim another transaction has not committed", mode,
               "ERROR 55P03" if mode.startswith("w1") and mode.endswith("tx block") else "in_progress|1",
               got.split(":")[0])
        holder.rollback()
        holder.close()
        sid, port = held_by(k)
        holder = connect(port=port, autocommit=False)
        holder.execute("SET citus.enable_manual_changes_to_shards = on")
        holder.execute("LOCK TABLE idempotency.operations_%d IN SHARE ROW EXCLUSIVE MODE" % sid)
        c.conn.execute("SET statement_timeout = '20s'")
        got = outcome(lambda: "%s|%s" % c.call(nowait, (k, "d2"))[0])
        c.conn.execute("RESET statement_timeout")
        report("wait => false: the key's shard locked on its worker", mode, "ERROR 55P03", got,
               got.startswith("ERROR 55P03"))
        holder.rollback()
        holder.close()
        got = admin("SELECT count(*) FROM idempotency.operations WHERE operation_key = %s", (k,))[0][0]
        report("... records of the key", mode, "0", str(got))
        got = outcome(lambda: "%s|%s" % c.call(nowait, (k, "d3"))[0])
        report("... the key once the lock is gone", mode, "run|1", got)

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
        if "in place" in mode:
            want_node = "w1"    # not delegated: the call, and its NOTIFY, run where it is made
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
        got = outcome(lambda: c.call("SELECT " + c.fn("extend_lease") + "('email', %s, 1) IS NOT NULL", (k,))[0][0])
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
    # the held claims of every mode, and the attempts 2 that took the
    # retry1s claims over and were never completed (lease 1 s: stale by now)
    n = len(MODES + W1_MODES + IN_PLACE_MODES)
    report("stale_claims() (hold1s claims, retry1s attempts 2)", "-", str(2 * n), got)
    got = outcome(lambda: c.call(
        "SELECT completed FROM idempotency.job_type_stats WHERE job_type = 'email'")[0][0])
    report("job_type_stats: completed of email", "-", "%d x (100 + 1 tx)" % n, got, got == str(101 * n))
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
    # the fenced updates compare the role where they run (issue 20): a
    # caller outside worker_role is refused, alice's claim is unchanged, and
    # alice completes it; on the coordinator, through Citus from w1, and on
    # the shard directly on w1 (a key w1 holds). pre_quoted's worker_role is
    # "Mail Team", a name that must be quoted: it goes from this node's
    # job_types to the statement where it runs, unquoted
    w1 = os.environ["CITUS_PORT_W1"]
    for jt in ("pre_roled", "pre_quoted"):
        for mode in MODES + W1_MODES:
            key = keys_on(w1, 1, "fenced-%s-%s-" % (jt, mode.replace(" ", "-")))[0]
            ca, co = Caller(mode, user="alice"), Caller(mode, user="outsider")
            report("claim by a member of %s's worker_role (alice), on w1's shard" % jt, mode, "run|1",
                   outcome(lambda: ca.claim(jt, key)))
            for fn in ("complete_operation", "release_operation", "extend_lease"):
                got = outcome(lambda: co.call("SELECT idempotency.%s(%%s, %%s, 1)" % fn, (jt, key)))
                report("%s() by a caller outside worker_role" % fn, mode, "ERROR 42501", got,
                       got.startswith("ERROR 42501"))
            got = outcome(lambda: admin("SELECT status || '|' || attempt FROM idempotency.operations"
                                        " WHERE job_type = %s AND operation_key = %s", (jt, key))[0][0])
            report("... the record after those refusals", mode, "claimed|1", got)
            report("complete_operation() by alice", mode, "ok",
                   outcome(lambda: ca.complete(jt, key, 1)))
            got = outcome(lambda: admin("SELECT status || '|' || attempt FROM idempotency.operations"
                                        " WHERE job_type = %s AND operation_key = %s", (jt, key))[0][0])
            report("... the record", mode, "completed|1", got)
            ca.conn.close()
            co.conn.close()
    # a worker_role naming a role dropped since: as on one node, only a
    # superuser may work the job type; anyone else gets 42501
    admin("CREATE ROLE gone")
    admin("INSERT INTO idempotency.job_types (job_type, lease, stale_policy, worker_role)"
          " VALUES ('orphaned', '10 minutes', 'hold', 'gone')")
    admin("DROP ROLE gone")
    for mode in MODES + W1_MODES:
        key = keys_on(w1, 1, "orphaned-%s-" % mode.replace(" ", "-"))[0]
        cs, co = Caller(mode), Caller(mode, user="outsider")
        report("claim by a superuser, worker_role dropped", mode, "run|1",
               outcome(lambda: cs.claim("orphaned", key)))
        got = outcome(lambda: co.call("SELECT idempotency.complete_operation('orphaned', %s, 1)", (key,)))
        report("... its completion by another role", mode, "ERROR 42501", got, got.startswith("ERROR 42501"))
        report("... its completion by the superuser", mode, "ok",
               outcome(lambda: cs.complete("orphaned", key, 1)))
        cs.conn.close()
        co.conn.close()
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

    direct_path_cases()
    in_place_cases()
    batch_cases()
    nowait_routed_cases()

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
    # "right": the answer one node gives, or for the few cases docs/citus.md
    # names (wait => false in a transaction block on a worker, or where the
    # statements go to another node) the bounded answer it documents
    print("\nsummary: %d cases, %d right, %d WRONG" % (len(rows), len(rows) - len(wrong), len(wrong)))
    # REPRO_STRICT=1 (hook 93): every case must answer as it should
    if os.environ.get("REPRO_STRICT") == "1" and wrong:
        return 1
    return 0


def held_by(key):
    """(shard id, port of the worker that holds it) of an operation key."""
    return admin("""SELECT pl.shardid, n.nodeport FROM pg_dist_placement pl JOIN pg_dist_node n USING (groupid)
                    WHERE pl.shardid = get_shard_id_for_distribution_column('idempotency.operations', %s::text)""",
                 (key,))[0]


def keys_on(port, n, prefix, shard=None, other_than=None):
    """n keys held by the worker on `port` (in `shard`, or not in `other_than`)."""
    keys = []
    i = 0
    while len(keys) < n and i < 5000:
        k = "%s%d" % (prefix, i)
        sid, p = held_by(k)
        if p == int(port) and (shard is None or sid == shard) and (other_than is None or sid != other_than):
            keys.append(k)
        i += 1
    assert len(keys) == n, "no %d keys on port %s" % (n, port)
    return keys


def direct_path_cases():
    """Issue 20: the call on the node that holds its key works on the shard
    directly (src/store_shard.c); Citus's local execution logs every statement it
    runs on a local shard (citus.log_local_commands), the direct path none."""
    w1 = os.environ["CITUS_PORT_W1"]
    mode = "w1 direct"

    def citus_statements(conn, calls):
        seen = []
        conn.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
        got = [outcome(f) for f in calls]
        conn.execute("SELECT 1")
        n = sum(1 for m in seen if m.startswith("executing the command locally"))
        return got, n

    # 1. autocommit on the key's worker: no statement through Citus
    k = keys_on(w1, 1, "direct-a-")[0]
    with connect(port=w1) as c:
        c.execute("SET citus.log_local_commands = on")
        got, n = citus_statements(c, [
            lambda: "%s|%s" % c.execute("SELECT verdict, attempt FROM idempotency.claim_operation('email', %s)",
                                        (k,)).fetchone(),
            lambda: c.execute("SELECT idempotency.complete_operation('email', %s, 1, '{\"ok\": 1}')", (k,)) and None,
            lambda: "%s|%s|%s" % c.execute("SELECT * FROM idempotency.claim_operation('email', %s)",
                                           (k,)).fetchone()])
    report("on the key's worker: run, complete, duplicate", mode,
           "run|1,ok,completed|1|{'ok': 1}", ",".join(got))
    report("... statements through Citus's local execution", mode, "0", str(n))

    # 2. the same with idempotency.direct_shard_path = off, and in a
    # transaction block: through Citus, the same verdicts
    for label, setup, block in (("direct_shard_path off", "SET idempotency.direct_shard_path = off", False),
                                ("transaction block", "SELECT 1", True)):
        k = keys_on(w1, 1, "direct-b-%s-" % label[:2])[0]
        with connect(port=w1) as c:
            c.execute("SET citus.log_local_commands = on")
            c.execute(setup)

            def run(sql, args):
                if block:
                    with c.transaction():
                        return c.execute(sql, args).fetchone()
                return c.execute(sql, args).fetchone()
            got, n = citus_statements(c, [
                lambda: "%s|%s" % run("SELECT verdict, attempt FROM idempotency.claim_operation('email', %s)", (k,)),
                lambda: run("SELECT idempotency.complete_operation('email', %s, 1)", (k,)) and None,
                lambda: "%s|%s" % run("SELECT verdict, attempt FROM idempotency.claim_operation('email', %s)", (k,))])
        report("%s: run, complete, duplicate" % label, mode, "run|1,ok,completed|1", ",".join(got))
        report("... statements through Citus's local execution", mode, "> 0", str(n), n > 0)

    # 3. the shard-metadata lock: one Citus's lock_shard_metadata() takes
    # (as shard moves and splits do) holds the direct path back on that
    # shard only
    k, other = keys_on(w1, 1, "direct-c-")[0], None
    sid = held_by(k)[0]
    other = keys_on(w1, 1, "direct-d-", other_than=sid)[0]
    locker = connect(port=w1, autocommit=False)
    locker.execute("SELECT lock_shard_metadata(7, ARRAY[%s]::bigint[])", (sid,))
    with connect(port=w1) as c:
        c.execute("SET lock_timeout = '300ms'")
        got = outcome(lambda: "%s|%s" % c.execute(
            "SELECT verdict, attempt FROM idempotency.claim_operation('email', %s)", (k,)).fetchone())
        report("claim while a move holds the shard's metadata lock", mode, "ERROR 55P03", got,
               got.startswith("ERROR 55P03"))
        got = outcome(lambda: "%s|%s" % c.execute(
            "SELECT verdict, attempt FROM idempotency.claim_operation('email', %s)", (other,)).fetchone())
        report("... a key of another shard meanwhile", mode, "run|1", got)
        locker.rollback()
        locker.close()
        got = outcome(lambda: "%s|%s" % c.execute(
            "SELECT verdict, attempt FROM idempotency.claim_operation('email', %s)", (k,)).fetchone())
        report("... the key once the lock is gone", mode, "run|1", got)

    # 4. one statement for keys on both workers: through Citus, every key
    ks = keys_on(w1, 2, "direct-e-") + keys_on(os.environ["CITUS_PORT_W2"], 2, "direct-f-")
    with connect(port=w1) as c:
        got = outcome(lambda: ",".join(r[0] for r in c.execute(
            "SELECT c.verdict FROM unnest(%s::text[]) WITH ORDINALITY k(key, n),"
            " LATERAL idempotency.claim_operation('email', k.key) c ORDER BY k.n", (ks,)).fetchall()))
    report("one statement claiming keys of both workers", mode, "run,run,run,run", got)
    got = outcome(lambda: admin("SELECT count(*) FROM idempotency.operations WHERE operation_key = ANY(%s)",
                                (ks,))[0][0])
    report("... their records", mode, "4", got)

    # 5. the key's shard moves to w2 after a direct call on w1: the next
    # calls on w1 (the same connection, its map cached) go through Citus to
    # w2, and nothing is written to the copy left behind on w1
    k = keys_on(w1, 1, "direct-g-")[0]
    sid = held_by(k)[0]
    k2 = keys_on(w1, 1, "direct-h-", shard=sid)[0]
    with connect(port=w1) as c:
        first = outcome(lambda: "%s|%s" % c.execute(
            "SELECT verdict, attempt FROM idempotency.claim_operation('email', %s)", (k,)).fetchone())
        ports = admin("SELECT nodename, nodeport FROM pg_dist_node WHERE noderole = 'primary' AND groupid > 0 "
                      "ORDER BY nodeport")
        src = [r for r in ports if r[1] == int(w1)][0]
        dst = [r for r in ports if r[1] != int(w1)][0]
        admin("SELECT citus_move_shard_placement(%s, %s, %s, %s, %s, shard_transfer_mode => 'block_writes')",
              (sid, src[0], src[1], dst[0], dst[1]))
        orphan = "idempotency.operations_%d" % sid
        before = c.execute("SELECT to_regclass(%s) IS NOT NULL", (orphan,)).fetchone()[0]
        rows_before = c.execute("SELECT count(*) FROM %s" % orphan).fetchone()[0] if before else None
        got = ",".join([first] + [outcome(lambda kk=kk: "%s|%s" % c.execute(
            "SELECT verdict, attempt FROM idempotency.claim_operation('email', %s)", (kk,)).fetchone())
            for kk in (k, k2)])
        after = c.execute("SELECT count(*) FROM %s" % orphan).fetchone()[0] if before else None
    report("claims on w1 before and after its shard moved to w2", mode, "run|1,in_progress|1,run|1", got)
    report("... the copy left on w1 (rows before, after)", mode,
           "%s,%s" % (rows_before, rows_before), "%s,%s" % (rows_before, after))
    got = outcome(lambda: ",".join(str(r[0]) for r in admin(
        "SELECT n.nodeport FROM pg_dist_placement pl JOIN pg_dist_node n USING (groupid) WHERE pl.shardid = %s",
        (sid,))))
    report("... the shard's placement", mode, str(dst[1]), got)
    got = outcome(lambda: admin("SELECT count(*) FROM idempotency.operations WHERE operation_key = ANY(%s)",
                                ([k, k2],))[0][0])
    report("... both records, through Citus", mode, "2", got)


def in_place_cases():
    """0.4: the calls in place on a worker. use_in_place() where it applies;
    the verdicts of one node for keys on both workers, in autocommit and in
    transaction blocks under each isolation level; w1's keys in autocommit
    on the shard directly; a prepared statement gets its generic plan (the
    delegated name's never does)."""
    w1, w2 = os.environ["CITUS_PORT_W1"], os.environ["CITUS_PORT_W2"]
    mode = "w1 in place"
    got = outcome(lambda: admin("SELECT idempotency.use_in_place()")[0][0])
    report("use_in_place() on the coordinator", "-", "False", got)
    with connect(port=w1) as c:
        got = outcome(lambda: c.execute("SELECT idempotency.use_in_place()").fetchone()[0])
    report("use_in_place() on a worker", mode, "True", got)
    admin("CREATE ROLE ipworker LOGIN")
    admin("GRANT USAGE ON SCHEMA idempotency TO ipworker")
    admin("GRANT EXECUTE ON FUNCTION idempotency.use_in_place(), "
          "idempotency.claim_operation(text, text, text, text, text, boolean) TO ipworker")
    admin("SELECT idempotency.distribute_grants()")
    with connect(port=w1, user="ipworker") as c:
        got = outcome(lambda: c.execute("SELECT idempotency.use_in_place()").fetchone()[0])
    report("... as a role without EXECUTE on the four", mode, "False", got)
    admin("GRANT EXECUTE ON FUNCTION idempotency.claim_operation_in_place(text, text, text, text, text, boolean), "
          "idempotency.complete_operation_in_place(text, text, integer, jsonb), "
          "idempotency.release_operation_in_place(text, text, integer), "
          "idempotency.extend_lease_in_place(text, text, integer) TO ipworker")
    admin("SELECT idempotency.distribute_grants()")
    with connect(port=w1, user="ipworker") as c:
        got = outcome(lambda: c.execute("SELECT idempotency.use_in_place()").fetchone()[0])
    report("... once granted them (distribute_grants())", mode, "True", got)

    # the verdicts: each key claimed, claimed again, completed, claimed
    # again, released after a second claim of a new key; as ipworker
    levels = (None, "READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE")
    for where, port in (("w1's key", w1), ("w2's key", w2)):
        for level in levels:
            label = "%s, %s" % (where, level or "autocommit")
            k, k2 = keys_on(port, 2, "inplace-%s-%s-" % (where[:2], (level or "ac").replace(" ", "")))
            with connect(port=w1, user="ipworker") as c:
                def run(sql, args):
                    if level is None:
                        return c.execute(sql, args).fetchone()
                    with c.transaction():
                        c.execute("SET TRANSACTION ISOLATION LEVEL " + level)
                        return c.execute(sql, args).fetchone()
                claim = "SELECT verdict, attempt FROM idempotency.claim_operation_in_place('email', %s)"
                got = [outcome(lambda: "%s|%s" % run(claim, (k,))),
                       outcome(lambda: "%s|%s" % run(claim, (k,))),
                       outcome(lambda: run("SELECT idempotency.extend_lease_in_place('email', %s, 1) IS NOT NULL",
                                           (k,))[0]),
                       outcome(lambda: run("SELECT idempotency.complete_operation_in_place('email', %s, 1, '{\"n\": 1}')",
                                           (k,)) and None),
                       outcome(lambda: "%s|%s" % run(claim, (k,))),
                       outcome(lambda: run("SELECT idempotency.complete_operation_in_place('email', %s, 2)",
                                           (k,)) and None),
                       outcome(lambda: "%s|%s" % run(claim, (k2,))),
                       outcome(lambda: run("SELECT idempotency.release_operation_in_place('email', %s, 1)",
                                           (k2,)) and None),
                       outcome(lambda: "%s|%s" % run(claim, (k2,)))]
            got[5] = got[5].split(":")[0]
            report(label, mode, "run|1,in_progress|1,True,ok,completed|1,ERROR 22023,run|1,ok,run|2",
                   ",".join(got))
            rec = admin("SELECT string_agg(status || '/' || attempt, ',' ORDER BY operation_key) "
                        "FROM idempotency.operations WHERE operation_key IN (%s, %s)", (k, k2))[0][0]
            report("... the records, through the coordinator", mode, "completed/1,claimed/2", rec)

    # w1's key in autocommit: on the shard directly (no statement through
    # Citus's local execution); w2's: through Citus, to w2 (its records'
    # statements sent there; the job type read from w1's placement of the
    # reference table, locally)
    for where, port, want in (("w1's key", w1, "0 local, 0 remote"),
                              ("w2's key", w2, "0 local on operations, > 0 remote")):
        k = keys_on(port, 1, "inplace-path-%s-" % where[:2])[0]
        with connect(port=w1) as c:
            seen = []
            c.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
            c.execute("SET citus.log_local_commands = on")
            c.execute("SET citus.log_remote_commands = on")
            v = outcome(lambda: "%s|%s" % c.execute(
                "SELECT verdict, attempt FROM idempotency.claim_operation_in_place('email', %s)", (k,)).fetchone())
            c.execute("SELECT 1")
        local = sum(1 for m in seen if m.startswith("executing the command locally") and "operations" in m)
        remote = sum(1 for m in seen if m.startswith("issuing "))
        got = "%s, %d local%s, %d remote" % (v, local, "" if where.startswith("w1") else " on operations", remote)
        ok = v == "run|1" and local == 0 and ((remote == 0) if where.startswith("w1") else remote > 0)
        report("autocommit, %s: where the statements ran" % where, mode, "run|1, " + want, got, ok)

    # a prepared statement (psycopg prepares from the fifth execution):
    # after ten claims the in-place call has used generic plans, the
    # delegated one never
    for name in ("claim_operation_in_place", "claim_operation"):
        ks = keys_on(w1, 10, "inplace-prep-%s-" % name[-5:])
        with connect(port=w1) as c:
            c.prepare_threshold = 0
            for k in ks:
                c.execute("SELECT verdict FROM idempotency.%s('email', %%s)" % name, (k,), prepare=True)
            generic = c.execute("SELECT coalesce(sum(generic_plans), 0) FROM pg_prepared_statements "
                                "WHERE statement LIKE %s", ("%%idempotency.%s(%%" % name,)).fetchone()[0]
        if name.endswith("in_place"):
            report("prepared, 10 claims: generic plans used", mode, "> 0", str(generic), generic > 0)
        else:
            report("... the delegated name: generic plans used", "w1 delegated", "0", str(generic))

    # a transaction block on w1 that writes a colocated table of the key's
    # shard group and claims and completes in place: one commit for w1's
    # key; for w2's, Citus refuses the write (25001: the call's statements
    # reached w2's placement over the table owner's connection; the
    # delegated names are the ones for that, docs/citus.md)
    for where, port, want in (("w1's key", w1, "completed,1"), ("w2's key", w2, "ERROR 25001")):
        k = keys_on(port, 1, "inplace-tx-%s-" % where[:2])[0]
        def tx():
            with connect(port=w1, user="txworker", autocommit=False) as t:
                t.execute("SELECT * FROM idempotency.claim_operation_in_place('email', %s)", (k,))
                t.execute("INSERT INTO public.emails VALUES (%s, 'hello')", (k,))
                t.execute("SELECT idempotency.complete_operation_in_place('email', %s, 1)", (k,))
                t.commit()
            return admin("SELECT o.status || ',' || count(e.*) FROM idempotency.operations o "
                         "LEFT JOIN public.emails e USING (operation_key) WHERE o.operation_key = %s "
                         "GROUP BY o.status", (k,))[0][0]
        admin("GRANT EXECUTE ON FUNCTION idempotency.claim_operation_in_place(text, text, text, text, text, boolean), "
              "idempotency.complete_operation_in_place(text, text, integer, jsonb) TO txworker")
        admin("SELECT idempotency.distribute_grants()")
        got = outcome(tx)
        report("tx block: claim + colocated row + complete, %s" % where, mode + " (txworker)", want, got,
               got.startswith(want))


def nowait_routed_cases():
    """0.4: wait => false where the call's statements go to another node
    (src/store_citus.c carries the bound there with a SET LOCAL): a batch
    through the coordinator, in autocommit and in a transaction block, and
    an in-place call in a transaction block on w1 for a key of w2. Another
    transaction's uncommitted claim of a key holds the write at most 1 s
    (55P03, nothing recorded), where it used to wait for that transaction
    to end (here: it rolls back after 4 s, so an unbounded wait would
    answer run after 4 s); after the call, in the same transaction, the
    worker's connection has its own lock_timeout again (both keys on w2:
    the statements go there)."""
    w1, w2 = os.environ["CITUS_PORT_W1"], os.environ["CITUS_PORT_W2"]
    tag = "%d" % (time.time() * 1000)
    batch = ("SELECT operation_key, verdict FROM idempotency.claim_operations("
             "'email', %s, NULL, NULL, %s, wait => false)")
    in_place = ("SELECT verdict, attempt FROM idempotency.claim_operation_in_place("
                "'email', %s, NULL, NULL, %s, wait => false)")
    cases = (("coordinator autocommit", None, True), ("coordinator tx block", None, False),
             ("w1 in place tx block", w1, False))
    for n, (mode, port, autocommit) in enumerate(cases):
        held = keys_on(w2, 1, "nw-%s-%d-h-" % (tag, n))[0]
        other = keys_on(w2, 1, "nw-%s-%d-o-" % (tag, n))[0]
        holder = connect(autocommit=False)
        holder.execute("SELECT idempotency.claim_operation('email', %s)", (held,))
        undo = threading.Timer(4, holder.rollback)
        undo.start()
        with connect(port=port, autocommit=autocommit) as c:
            c.execute("SET lock_timeout = '30s'")
            if port is None:
                call = lambda: c.execute(batch, ([held, other], ["d1", "d2"])).fetchall()
            else:
                call = lambda: c.execute(in_place, (held, "d1")).fetchall()
            got = outcome(call)
            report("wait => false, statements sent to w2: a claim not committed", mode, "ERROR 55P03",
                   got.split(":")[0])
            if not autocommit:
                c.rollback()
                # the bound stays the call's: the workers' connections of
                # the same transaction have their own setting after it
                c.execute("SET LOCAL lock_timeout = '30s'")
                if port is None:
                    c.execute(batch, ([other], ["d3"])).fetchall()
                else:
                    c.execute(in_place, (other, "d3")).fetchall()
                got = ",".join(sorted(r[0] for r in c.execute(
                    "SELECT current_setting('lock_timeout') FROM idempotency.operations "
                    "WHERE job_type = 'email' AND operation_key = %s", (other,)).fetchall()))
                report("... the worker's lock_timeout after a call, same transaction", mode, "0", got)
                report("... this session's", mode, "30s", c.execute("SHOW lock_timeout").fetchone()[0])
                c.rollback()
        undo.join()
        holder.close()
        got = admin("SELECT count(*) FROM idempotency.operations WHERE operation_key = ANY(%s)",
                    ([held, other],))[0][0]
        report("... records of its keys", mode, "0", str(got))


def batch_cases():
    """0.4: the batches through the coordinator go by shard: one statement
    reads a shard's keys, one inserts them, one completes or releases them (the routed
    store's batch statements, src/store_citus.c); the verdicts and refusals
    are one node's, under each isolation level; two batches racing on the
    same keys run each key once and never deadlock."""
    w1, w2 = os.environ["CITUS_PORT_W1"], os.environ["CITUS_PORT_W2"]
    mode = "batch"
    claim = ("SELECT operation_key, verdict, attempt, result::text FROM idempotency.claim_operations("
             "'email', %s, %s, 'w', %s)")
    complete = ("SELECT operation_key, done, sqlstate FROM idempotency.complete_operations("
                "'email', %s, %s, %s::jsonb[])")
    levels = (None, "READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE")
    for level in levels:
        tag = (level or "autocommit").replace(" ", "")
        label = level or "autocommit"
        # several keys on each of three shards of each worker, and more
        # keys on shards of their own
        keys = []
        for port in (w1, w2):
            first = keys_on(port, 1, "b-%s-a-" % tag)[0]
            sid = held_by(first)[0]
            keys += [first] + keys_on(port, 3, "b-%s-s%s-" % (tag, sid), shard=sid)
            keys += keys_on(port, 6, "b-%s-o-" % tag, other_than=sid)
        done_key, claimed_key = keys[0], keys[4]
        admin("SELECT * FROM idempotency.claim_operation('email', %s)", (done_key,))
        admin("SELECT idempotency.complete_operation('email', %s, 1, '{\"sent\": 1}')", (done_key,))
        admin("SELECT * FROM idempotency.claim_operation('email', %s)", (claimed_key,))
        # the caller's order is not the batch's; a key repeated
        ask = list(reversed(keys)) + [keys[7]]
        shards = {held_by(k)[0] for k in keys}
        with connect() as c:
            seen = []
            c.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
            c.execute("SET citus.log_remote_commands = on")

            def run(sql, args):
                if level is None:
                    return c.execute(sql, args).fetchall()
                with c.transaction():
                    c.execute("SET TRANSACTION ISOLATION LEVEL " + level)
                    return c.execute(sql, args).fetchall()
            got = outcome(lambda: run(claim, (ask, None, None)))
            lookups = sum(1 for m in seen if m.startswith("issuing SELECT operation_key"))
            inserts = sum(1 for m in seen if m.startswith("issuing INSERT INTO idempotency.operations_"))
            want_rows = []
            for i, k in enumerate(ask):
                if k == done_key:
                    want_rows.append((k, "completed", 1, '{"sent": 1}'))
                elif k == claimed_key or i == len(ask) - 1:
                    want_rows.append((k, "in_progress", 1, None))
                else:
                    want_rows.append((k, "run", 1, None))
            report("claim batch, %d keys on %d shards, %s" % (len(ask), len(shards), label), mode,
                   "one node's verdicts", "one node's verdicts" if got == str(want_rows) else got)
            new_shards = {held_by(k)[0] for k in keys if k not in (done_key, claimed_key)}
            report("... statements: a lookup per shard, an insert per shard of new keys", mode,
                   "%d, %d" % (len(shards), len(new_shards)), "%d, %d" % (lookups, inserts))

            # complete: the right attempts, one superseded (released and
            # claimed again), one without a record, a repeat; results
            other = keys[9]
            admin("SELECT idempotency.release_operation('email', %s, 1)", (other,))
            admin("SELECT * FROM idempotency.claim_operation('email', %s)", (other,))
            fin = [k for k in keys if k not in (done_key, claimed_key)] + ["b-%s-none" % tag, keys[2]]
            attempts = [1] * len(fin)
            results = ['{"n": %d}' % i if i % 3 else None for i in range(len(fin))]
            results[1] = "null"
            results[-1] = '{"repeat": true}'
            seen.clear()
            got = outcome(lambda: run(complete, (fin, attempts, results)))
            updates = sum(1 for m in seen if m.startswith("issuing UPDATE idempotency.operations_"))
            want_rows = [(k, k not in (other, "b-%s-none" % tag),
                          "ID003" if k == other else "ID004" if k.endswith("-none") else None) for k in fin]
            report("complete batch: done, ID003 superseded, ID004 no record, a repeat, %s" % label, mode,
                   "one node's outcomes", "one node's outcomes" if got == str(want_rows) else got)
            fin_shards = {held_by(k)[0] for k in fin}
            report("... statements: an update per shard, and one per refused or repeated key", mode,
                   str(len(fin_shards) + 3), str(updates))
            done_keys = sorted(set(fin) - {other, "b-%s-none" % tag})
            stored = admin("SELECT string_agg(coalesce(result::text, 'NULL'), ',' ORDER BY operation_key) "
                           "FROM idempotency.operations WHERE operation_key = ANY(%s) AND status = 'completed'",
                           (done_keys,))[0][0]
            # the repeat (last) is done by its first occurrence, whose result stays
            given = admin("SELECT string_agg(coalesce(r::jsonb::text, 'NULL'), ',' ORDER BY k) "
                          "FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS u(k, r, n) "
                          "WHERE k = ANY(%s) AND n < %s",
                          (fin, results, done_keys, len(fin)))[0][0]
            report("... the results stored (JSON null and no result apart)", mode, "as given",
                   "as given" if stored == given and "null" in stored and "NULL" in stored else stored)

            # release: fresh claims, and a completed key (ID005)
            rel = keys_on(w1, 4, "b-%s-rel-" % tag) + keys_on(w2, 4, "b-%s-rel-" % tag)
            admin("SELECT count(*) FROM idempotency.claim_operations('email', %s)", (rel,))
            rel_shards = {held_by(k)[0] for k in rel} | {held_by(done_key)[0]}
            seen.clear()
            got = outcome(lambda: run("SELECT operation_key, done, sqlstate FROM idempotency.release_operations("
                                      "'email', %s, %s)", (rel + [done_key], [1] * (len(rel) + 1))))
            updates = sum(1 for m in seen if m.startswith("issuing UPDATE idempotency.operations_"))
            want_rows = [(k, True, None) for k in rel] + [(done_key, False, "ID005")]
            report("release batch: done, ID005 completed, %s" % label, mode, "one node's outcomes",
                   "one node's outcomes" if got == str(want_rows) else got)
            report("... statements: an update per shard, and one per refused key", mode,
                   str(len(rel_shards) + 1), str(updates))
            got = admin("SELECT string_agg(DISTINCT status::text, ',') FROM idempotency.operations "
                        "WHERE operation_key = ANY(%s)", (rel,))[0][0]
            report("... the records", mode, "released", got)

        # the same batches, with fingerprints, deliveries, wait => false,
        # repeats, refusals and takeovers, on a plain one-node database on
        # the coordinator (no Citus there) and through Citus: the same rows
        # and the same errors, statement by statement
        same, first_diff = batch_differential(tag, level)
        report("batches with deliveries etc.: Citus answers as a plain database, %s" % label, mode,
               "the same", "the same" if same else first_diff)

        # 20 new keys of one shard: the insert goes 16 rows a statement
        # (once, in autocommit: the statement count does not depend on the level)
        if level is None:
            first = keys_on(w1, 1, "b-one-")[0]
            one = [first] + keys_on(w1, 19, "b-one-s-", shard=held_by(first)[0])
            with connect() as c:
                seen = []
                c.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
                c.execute("SET citus.log_remote_commands = on")
                got = outcome(lambda: sorted({r[1] for r in c.execute(claim, (one, None, None)).fetchall()}))
            inserts = sum(1 for m in seen if m.startswith("issuing INSERT INTO idempotency.operations_"))
            report("claim batch of 20 keys on one shard", mode, "['run'], 2 inserts",
                   "%s, %d inserts" % (got, inserts))

        # a fingerprint mismatch raises ID002 and records nothing
        fresh = keys_on(w1, 2, "b-%s-fp-" % tag) + keys_on(w2, 2, "b-%s-fp-" % tag)
        admin("SELECT * FROM idempotency.claim_operation('email', %s, 'one')", (fresh[3],))
        with connect() as c:
            def fp_batch():
                if level is None:
                    return c.execute(claim, (fresh, ["two"] * 4, None)).fetchall()
                with c.transaction():
                    c.execute("SET TRANSACTION ISOLATION LEVEL " + level)
                    return c.execute(claim, (fresh, ["two"] * 4, None)).fetchall()
            got = outcome(fp_batch).split(":")[0]
        n = admin("SELECT count(*) FROM idempotency.operations WHERE operation_key = ANY(%s)", (fresh,))[0][0]
        report("claim batch with a fingerprint mismatch, %s" % label, mode, "ERROR ID002, 1 record",
               "%s, %d record%s" % (got, n, "" if n == 1 else "s"))

        # two batches on the same 60 keys (both workers), each in its own
        # order, in transaction blocks at this level, retried on 40001:
        # every key run exactly once, no deadlock
        if level is None:
            continue
        race = keys_on(w1, 30, "b-%s-race-" % tag) + keys_on(w2, 30, "b-%s-race-" % tag)
        runs = []
        errors = []
        lock = threading.Lock()

        def racer(order):
            with connect(autocommit=False) as c:
                for attempt in range(20):
                    try:
                        c.execute("SET TRANSACTION ISOLATION LEVEL " + level)
                        got = c.execute(claim, (order, None, None)).fetchall()
                        c.commit()
                        with lock:
                            runs.extend(r[0] for r in got if r[1] == "run")
                        return
                    except psycopg.errors.SerializationFailure:
                        c.rollback()
                    except psycopg.Error as e:
                        c.rollback()
                        with lock:
                            errors.append(e.sqlstate)
                        return
        ts = [threading.Thread(target=racer, args=(o,)) for o in (race, list(reversed(race)), race[::2] + race[1::2])]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        dup = len(runs) - len(set(runs))
        report("three batches racing on 60 keys, %s" % label, mode, "60 run once, 0 errors",
               "%d run once%s, %d errors%s" % (len(set(runs)), " (%d twice)" % dup if dup else "",
                                                len(errors), (" " + ",".join(errors)) if errors else ""))


def batch_differential(tag, level):
    """Run one script of batch calls on the coordinator's distributed tables
    and on a plain database of the coordinator (created once, no Citus in
    it); returns (True, None) when every statement answered alike, else
    (False, the first difference)."""
    with connect() as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = 'plain_batches'").fetchone():
            c.execute("CREATE DATABASE plain_batches")
    plain = psycopg.connect(user="postgres", dbname="plain_batches", autocommit=True)
    if not plain.execute("SELECT 1 FROM pg_extension WHERE extname = 'idempotency'").fetchone():
        plain.execute("CREATE EXTENSION idempotency")
        plain.execute("INSERT INTO idempotency.job_types (job_type, lease, stale_policy) "
                      "VALUES ('email', '10 minutes', 'hold')")
    k = ["bd-%s-%d" % (tag, i) for i in range(8)]
    script = [
        ("claim", [k[:4], ["f", "f", None, "g"], ["t1", "t2", "t3", None], True]),
        ("claim", [[k[3], k[2], k[1], k[0], k[4]], ["g", None, "f", "f", "h"],
                   [None, "t3", "x2", "t1", "t5"], False]),
        ("complete", [[k[0], k[1], k[4]], [1, 1, 1], ['{"a": 1}', None, '"s"']]),
        ("claim", [[k[0], k[1], k[2], k[4], k[4]], ["f", "f", None, "h", "h"],
                   ["t1", "t9", "t3", "t5", "t5"], True]),
        ("release", [[k[2], k[3], k[0]], [1, 1, 1]]),
        ("claim", [[k[2], k[3], k[5]], None, ["n3", "n4", "n6"], True]),
        ("complete", [[k[2], k[3], k[5], k[6]], [1, 2, 1, 1], None]),
        ("claim", [[k[0], k[7]], ["zzz", "q"], None, True]),
        ("records", [k]),
    ]
    sql = {
        "claim": "SELECT * FROM idempotency.claim_operations('email', %s::text[], %s::text[], 'w', %s::text[], %s)",
        "complete": "SELECT operation_key, done, sqlstate, message FROM idempotency.complete_operations("
                    "'email', %s::text[], %s::int[], %s::jsonb[])",
        "release": "SELECT operation_key, done, sqlstate, message FROM idempotency.release_operations("
                   "'email', %s::text[], %s::int[])",
        "records": "SELECT operation_key, status::text, attempt, fingerprint, result::text, delivery IS NOT NULL "
                   "FROM idempotency.operations WHERE operation_key = ANY(%s) ORDER BY 1",
    }
    dist = connect()

    def answer(conn, what, args):
        def go():
            if level is None:
                return conn.execute(sql[what], args).fetchall()
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL " + level)
                return conn.execute(sql[what], args).fetchall()
        return outcome(go)
    try:
        for n, (what, args) in enumerate(script):
            a, b = answer(plain, what, args), answer(dist, what, args)
            if a != b:
                return False, "step %d (%s): plain %s, Citus %s" % (n + 1, what, a[:150], b[:150])
        return True, None
    finally:
        plain.close()
        dist.close()

if __name__ == "__main__":
    sys.exit(main())
