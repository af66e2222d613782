/*
 * cases.c
 *		The replay cases, and what each must show under each policy.
 *
 * Every case works in its own job type (<prefix>_<policy>_<case>) with its
 * own mailbox, so the cases cannot see each other and the keys can be the
 * seed's own: ORD-1001 (and ORD-1002 in case 4). A case fills three cells
 * from what it observed -- the emails in the provider's mailbox, the record
 * afterwards ("completed #2": status and attempt), and the verdicts the
 * workers got -- and notes on everything else it checked. The expectations
 * come from case_expectations(), per policy: cases 1-7 as the seed writes
 * them, cases 8-13 as issue 3 adds them.
 *
 * Waiting for a lease to run out is done by polling stale_claims() on the
 * runner's connection until it lists the key, never by sleeping a guessed
 * time; a worker dies by SIGKILL while it is paused at the named point.
 *
 * The sign-off run (signoff.c) shares case_expectations(), the notes
 * (case_note, case_fail), the record's text (record_text_of) and the
 * stale_claims() polling (stale_listed, stale_wait) through matrix.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "matrix.h"

#define POLL_MS 10				/* database polling interval */
#define MAX_WORKERS 64

typedef struct case_env
{
	matrix_ctx *ctx;
	policy_t	policy;			/* configured in the job type */
	policy_t	as;				/* whose expectations are checked */
	case_result *cr;
	char		job_type[160];
	char		mailbox[400];
	bool		lookup_provider;
} case_env;

/* ---------------------------------------------------------------------
 * Helpers
 * --------------------------------------------------------------------- */

static void note(case_env *e, const char *fmt,...) MX_PRINTF(2, 3);

static void
note(case_env *e, const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	case_vnote(e->cr, fmt, ap);
	va_end(ap);
}

static void fail(case_env *e, const char *fmt,...) MX_PRINTF(2, 3);

static void
fail(case_env *e, const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	case_vfail(e->cr, fmt, ap);
	va_end(ap);
}

static void
worker_failed(case_env *e, const worker *w)
{
	fail(e, "%s: %s", w->name, w->problem[0] ? w->problem : "failed");
}

static bool
env_setup(matrix_ctx *ctx, policy_t policy, policy_t as, case_result *cr,
		  case_env *e)
{
	char		err[600];
	bool		ok;

	memset(e, 0, sizeof(*e));
	e->ctx = ctx;
	e->policy = policy;
	e->as = as;
	e->cr = cr;
	e->lookup_provider = policy == POLICY_LOOKUP;
	snprintf(e->job_type, sizeof(e->job_type), "%s_%s_%s",
			 ctx->prefix, policy_names[policy], cr->id);
	snprintf(e->mailbox, sizeof(e->mailbox), "%s/%s-%s.mbox",
			 ctx->maildir, policy_names[policy], cr->id);

	ok = job_type_register(ctx, e->job_type, policy, err, sizeof(err));
	if (!ok)
		fail(e, "%s", err);
	cr->ran = ok;
	return ok;
}

static worker_spec
spec_for(case_env *e, const char *key)
{
	worker_spec s;

	memset(&s, 0, sizeof(s));
	s.job_type = e->job_type;
	s.key = key;
	s.mode = W_NORMAL;
	s.mailbox = e->mailbox;
	s.lookup_provider = e->lookup_provider;
	s.heartbeat_s = e->ctx->lease_s / 4.0;
	s.effects_table = e->ctx->effects_table;
	return s;
}

static void
worker_label(case_env *e, const char *w, char *buf, size_t sz)
{
	snprintf(buf, sz, "%s/%s/%s", policy_names[e->policy], e->cr->id, w);
}

/* fork a worker and wait until it is connected */
static bool
start(case_env *e, worker *w, const worker_spec *s, const char *wname,
	  int barrier_rd)
{
	char		name[64];

	worker_label(e, wname, name, sizeof(name));
	if (worker_spawn(e->ctx, w, s, name, barrier_rd) != 0 ||
		!worker_wait(e->ctx, w, "ready"))
	{
		worker_failed(e, w);
		return false;
	}
	return true;
}

/* one delivery, start to end */
static bool
deliver(case_env *e, worker *w, const worker_spec *s, const char *wname)
{
	bool		ok = start(e, w, s, wname, -1);

	if (ok && !worker_wait(e->ctx, w, NULL))
	{
		worker_failed(e, w);
		ok = false;
	}
	worker_dispose(w);
	return ok;
}

/* wait until the worker stands at its pause point, then SIGKILL it */
static bool
kill_at_pause(case_env *e, worker *w, const char *where)
{
	if (!worker_wait(e->ctx, w, "paused"))
	{
		worker_failed(e, w);
		worker_dispose(w);
		return false;
	}
	worker_kill(w);
	note(e, "%s (pid %d) got \"%s\" (attempt %d) and was killed with SIGKILL %s.",
		 w->name, (int) w->pid, w->verdict, w->attempt, where);
	worker_dispose(w);
	return true;
}

static void
record_text(case_env *e, const char *key, char *buf, size_t sz, char *result,
			size_t rsz)
{
	record_text_of(e->ctx, e->cr, e->job_type, key, buf, sz, result, rsz);
}

static int
listed_stale(case_env *e, const char *key)
{
	return stale_listed(e->ctx, e->cr, e->job_type, key);
}

static bool
wait_stale(case_env *e, const char *key)
{
	return stale_wait(e->ctx, e->cr, e->job_type, key, policy_names[e->policy], NULL, NULL);
}

static int
emails(case_env *e, const char *key)
{
	int			n = provider_count(e->mailbox, key);

	if (n < 0)
		fail(e, "cannot read the mailbox %s: %s", e->mailbox, strerror(errno));
	return n;
}

/* a stable fingerprint of a payload (FNV-1a, 64 bits) */
static void
fingerprint(const char *payload, char *buf, size_t sz)
{
	unsigned long long h = 14695981039346656037ULL;
	const unsigned char *p;

	for (p = (const unsigned char *) payload; *p; p++)
	{
		h ^= *p;
		h *= 1099511628211ULL;
	}
	snprintf(buf, sz, "fnv1a64:%016llx", h);
}

/* the common end: the mailbox and the record of the case's main key */
static void
observe(case_env *e, const char *key)
{
	e->cr->obs_emails = emails(e, key);
	record_text(e, key, e->cr->obs_record, sizeof(e->cr->obs_record), NULL, 0);
}

/* ---------------------------------------------------------------------
 * The cases
 * --------------------------------------------------------------------- */

/* 1: first delivery -- sent once */
static void
case_1(matrix_ctx *ctx, policy_t policy, policy_t as, case_result *cr)
{
	case_env	e;
	worker		w;
	worker_spec s;
	char		v[64];

	if (!env_setup(ctx, policy, as, cr, &e))
		return;
	s = spec_for(&e, "ORD-1001");
	deliver(&e, &w, &s, "w1");
	list_append(cr->obs_verdicts, CELL, worker_verdict_text(&w, v, sizeof(v)));
	if (strcmp(w.verdict, "run") == 0 && !w.completed)
		fail(&e, "%s did not complete: %s", w.name, w.complete_error);
	observe(&e, "ORD-1001");
}

/* 2: same message again after success -- skipped, with the stored result */
static void
case_2(matrix_ctx *ctx, policy_t policy, policy_t as, case_result *cr)
{
	case_env	e;
	worker		w1,
				w2;
	worker_spec s;
	char		v[64];

	if (!env_setup(ctx, policy, as, cr, &e))
		return;
	s = spec_for(&e, "ORD-1001");
	deliver(&e, &w1, &s, "w1");
	list_append(cr->obs_verdicts, CELL, worker_verdict_text(&w1, v, sizeof(v)));
	deliver(&e, &w2, &s, "w2");
	list_append(cr->obs_verdicts, CELL, worker_verdict_text(&w2, v, sizeof(v)));
	if (strcmp(w2.verdict, "completed") == 0)
	{
		if (w1.message_id[0] && strstr(w2.result, w1.message_id))
			note(&e, "The redelivery got the stored result back: %s.", w2.result);
		else
			fail(&e, "the redelivery's result %s is not what %s stored (message %s)",
				 w2.result, w1.name, w1.message_id);
	}
	observe(&e, "ORD-1001");
}

/* a verdict list in a fixed order, equal ones counted: "run, 15× in_progress" */
static void
grouped_verdicts(case_env *e, worker *ws, int n, char *out, size_t sz)
{
	static const char *const order[] =
	{"run", "verify", "completed", "in_progress", "held", "skipped"};
	char		texts[MAX_WORKERS][64];
	bool		used[MAX_WORKERS];
	int			i,
				j,
				k;
	const char *x = e->ctx->utf8 ? "\xC3\x97" : "x";

	out[0] = '\0';
	for (i = 0; i < n; i++)
	{
		worker_verdict_text(&ws[i], texts[i], sizeof(texts[i]));
		used[i] = false;
	}
	/* the known verdicts first, in order; then anything else */
	for (k = 0; k <= 6; k++)
		for (i = 0; i < n; i++)
		{
			int			count = 0;
			char		item[96];

			if (used[i])
				continue;
			if (k < 6 && strcmp(texts[i], order[k]) != 0)
				continue;
			for (j = i; j < n; j++)
				if (!used[j] && strcmp(texts[j], texts[i]) == 0)
				{
					used[j] = true;
					count++;
				}
			if (count > 1)
				snprintf(item, sizeof(item), "%d%s %.63s", count, x, texts[i]);
			else
				snprintf(item, sizeof(item), "%.63s", texts[i]);
			list_append(out, sz, item);
		}
}

/*
 * 3 and 3s: n workers, released together by a barrier, claim one message.
 * The one that gets "run" pauses until every other worker has its answer,
 * so the others really meet its claim in flight.
 */
static void
concurrent(case_env *e, int n)
{
	worker		ws[MAX_WORKERS];
	int			barrier[2];
	int			i;
	int			winner = -1;
	int			winners = 0;
	double		t0;
	worker_spec s = spec_for(e, "ORD-1001");

	if (n > MAX_WORKERS)
		n = MAX_WORKERS;
	if (pipe(barrier) != 0)
	{
		fail(e, "pipe: %s", strerror(errno));
		return;
	}
	s.pauses = PAUSE_CLAIMED;
	for (i = 0; i < n; i++)
	{
		char		wname[16];

		snprintf(wname, sizeof(wname), "w%d", i + 1);
		if (!start(e, &ws[i], &s, wname, barrier[0]))
			break;
	}
	close(barrier[0]);
	if (i < n)
	{
		int			j;

		close(barrier[1]);
		for (j = 0; j <= i && j < n; j++)
			worker_dispose(&ws[j]);
		return;
	}
	/* all connected and blocked on the barrier: open it */
	t0 = now_seconds();
	close(barrier[1]);
	for (i = 0; i < n; i++)
	{
		if (!worker_wait(e->ctx, &ws[i], "claim"))
			worker_failed(e, &ws[i]);
		else if (strcmp(ws[i].verdict, "run") == 0 || strcmp(ws[i].verdict, "verify") == 0)
		{
			winner = i;
			winners++;
		}
	}
	note(e, "%d workers, each with its own connection, left a barrier at once; all %d claims were answered within %.0f ms.",
		 n, n, (now_seconds() - t0) * 1000.0);
	if (winners > 1)
		fail(e, "%d workers got run/verify", winners);
	/* let the winner work only now */
	for (i = 0; i < n; i++)
	{
		if (i == winner)
		{
			if (worker_wait(e->ctx, &ws[i], "paused"))
				worker_go(&ws[i]);
		}
		if (!worker_wait(e->ctx, &ws[i], NULL))
			worker_failed(e, &ws[i]);
		if (i == winner && !ws[i].completed)
			fail(e, "%s got run but did not complete", ws[i].name);
	}
	grouped_verdicts(e, ws, n, e->cr->obs_verdicts, CELL);
	for (i = 0; i < n; i++)
		worker_dispose(&ws[i]);
	observe(e, "ORD-1001");
}

static void
case_3(matrix_ctx *ctx, policy_t policy, policy_t as, case_result *cr)
{
	case_env	e;

	if (env_setup(ctx, policy, as, cr, &e))
		concurrent(&e, 2);
}

static void
case_3s(matrix_ctx *ctx, policy_t policy, policy_t as, case_result *cr)
{
	case_env	e;

	if (env_setup(ctx, policy, as, cr, &e))
		concurrent(&e, ctx->stress);
}

/* 4: a different order with similar data, at the same instant: both run */
static void
case_4(matrix_ctx *ctx, policy_t policy, policy_t as, case_result *cr)
{
	case_env	e;
	worker		ws[2];
	worker_spec s[2];
	char		fp[2][40];
	int			barrier[2];
	int			i;
	int			started = 0;
	bool		ok = true;
	char		rec[CELL];
	static const char *const keys[2] = {"ORD-1001", "ORD-1002"};

	if (!env_setup(ctx, policy, as, cr, &e))
		return;
	fingerprint("order=ORD-1001;customer=C-77;items=1;total=42.00", fp[0], sizeof(fp[0]));
	fingerprint("order=ORD-1002;customer=C-77;items=1;total=42.00", fp[1], sizeof(fp[1]));
	if (pipe(barrier) != 0)
	{
		fail(&e, "pipe: %s", strerror(errno));
		return;
	}
	for (i = 0; i < 2 && ok; i++)
	{
		s[i] = spec_for(&e, keys[i]);
		s[i].fingerprint = fp[i];
		ok = start(&e, &ws[i], &s[i], i == 0 ? "w1" : "w2", barrier[0]);
		started = i + 1;
	}
	close(barrier[0]);
	close(barrier[1]);
	for (i = 0; i < 2 && ok; i++)
	{
		char		v[64];

		if (!worker_wait(ctx, &ws[i], NULL))
			worker_failed(&e, &ws[i]);
		list_append(cr->obs_verdicts, CELL, worker_verdict_text(&ws[i], v, sizeof(v)));
	}
	for (i = 0; i < started; i++)
		worker_dispose(&ws[i]);
	cr->obs_emails = emails(&e, NULL);
	for (i = 0; i < 2; i++)
	{
		int			n = emails(&e, keys[i]);

		if (n != 1)
			fail(&e, "%s got %d emails", keys[i], n);
		record_text(&e, keys[i], rec, sizeof(rec), NULL, 0);
		list_append(cr->obs_record, CELL, rec);
	}
	note(&e, "Both orders were delivered at the same instant, with payloads that differ only in the order number; each got its own email.");
}

/*
 * 5 and 6: the worker dies after its claim (before the email), or after the
 * email (before completion); the redelivery comes after the lease ran out.
 * 7a and 7b: the same deaths, the redelivery inside the lease.
 */
static void
death(matrix_ctx *ctx, policy_t policy, policy_t as, case_result *cr,
	  unsigned pause, bool after_lease)
{
	case_env	e;
	worker		w1,
				w2;
	worker_spec s;
	char		v[64];
	char		result[512];

	if (!env_setup(ctx, policy, as, cr, &e))
		return;
	s = spec_for(&e, "ORD-1001");
	s.pauses = pause;
	if (!start(&e, &w1, &s, "w1", -1))
	{
		worker_dispose(&w1);
		return;
	}
	if (!kill_at_pause(&e, &w1, pause == PAUSE_CLAIMED
					   ? "after its claim committed, before the email"
					   : "after the email left, before completion"))
		return;
	list_append(cr->obs_verdicts, CELL, "run (killed)");
	if (after_lease && !wait_stale(&e, "ORD-1001"))
		return;
	s.pauses = 0;
	deliver(&e, &w2, &s, "w2");
	list_append(cr->obs_verdicts, CELL, worker_verdict_text(&w2, v, sizeof(v)));
	observe(&e, "ORD-1001");
	record_text(&e, "ORD-1001", v, sizeof(v), result, sizeof(result));
	if (!after_lease)
	{
		if (strcmp(w2.verdict, "in_progress") == 0)
			note(&e, "The redelivery came inside the lease: %s stopped, and the attempt is still 1.", w2.name);
		else if (strstr(cr->obs_record, "stale"))
			fail(&e, "the lease had already run out at the redelivery: this machine is slow for --lease %s; try a longer one",
				 ctx->lease_sql);
	}
	else if (strcmp(w2.verdict, "held") == 0)
		note(&e, "The record stays claimed, waiting for a person (resolve_operation).");
	else if (w2.verdict[0] && strcmp(w2.verdict, "skipped") != 0)
		note(&e, "%s took the claim over as attempt %d; stored result: %s.",
			 w2.name, w2.attempt, result[0] ? result : "none");
}

static void
case_5(matrix_ctx *ctx, policy_t policy, policy_t as, case_result *cr)
{
	death(ctx, policy, as, cr, PAUSE_CLAIMED, true);
}

static void
case_6(matrix_ctx *ctx, policy_t policy, policy_t as, case_result *cr)
{
	death(ctx, policy, as, cr, PAUSE_SENT, true);
}

static void
case_7a(matrix_ctx *ctx, policy_t policy, policy_t as, case_result *cr)
{
	death(ctx, policy, as, cr, PAUSE_CLAIMED, false);
}

static void
case_7b(matrix_ctx *ctx, policy_t policy, policy_t as, case_result *cr)
{
	death(ctx, policy, as, cr, PAUSE_SENT, false);
}

static int
effect_rows(case_env *e, const char *key)
{
	char		sql[512];
	const char *params[2];
	PGresult   *res;
	int			n = -1;

	snprintf(sql, sizeof(sql),
			 "SELECT count(*) FROM %s WHERE job_type OPERATOR(pg_catalog.=) $1 "
			 "AND operation_key OPERATOR(pg_catalog.=) $2", e->ctx->effects_table);
	params[0] = e->job_type;
	params[1] = key;
	res = db_exec(e->ctx, sql, 2, params);
	if (PQresultStatus(res) == PGRES_TUPLES_OK)
		n = atoi(PQgetvalue(res, 0, 0));
	else
		fail(e, "cannot count effect rows: %s", case_sql_error(res, e->ctx));
	PQclear(res);
	return n;
}

/*
 * 8: the effect is a row in the same database. A worker dies inside the
 * transaction that holds claim + row; once its backend is gone, nothing of
 * it is recorded, and the redelivery runs once, as attempt 1.
 */
static void
case_8(matrix_ctx *ctx, policy_t policy, policy_t as, case_result *cr)
{
	case_env	e;
	worker		w1,
				w2;
	worker_spec s;
	char		v[64];
	char		before[CELL];
	char		after[CELL];
	char		pid[16];
	const char *params[1];
	double		t0;
	int			rows_before;

	if (!env_setup(ctx, policy, as, cr, &e))
		return;
	if (ctx->effects_table[0] == '\0' || ctx->effects_error[0] != '\0')
	{
		fail(&e, "no table for the side-effect rows: %s", ctx->effects_error);
		return;
	}
	s = spec_for(&e, "ORD-1001");
	s.mode = W_TX;
	s.pauses = PAUSE_CLAIMED;
	if (!start(&e, &w1, &s, "w1", -1))
	{
		worker_dispose(&w1);
		return;
	}
	if (!kill_at_pause(&e, &w1, "inside its transaction, after the claim and the effect row, before COMMIT"))
		return;
	snprintf(pid, sizeof(pid), "%d", w1.backend_pid);
	list_append(cr->obs_verdicts, CELL, "run (killed in transaction)");

	/*
	 * The dead client's backend notices, rolls back and exits (through a
	 * pooler it may stay, but leaves the transaction): wait for that.
	 */
	params[0] = pid;
	t0 = now_seconds();
	for (;;)
	{
		PGresult   *res = db_exec(ctx, "SELECT 1 FROM pg_catalog.pg_stat_activity "
								  "WHERE pid OPERATOR(pg_catalog.=) $1::integer "
								  "  AND xact_start IS NOT NULL",
								  1, params);
		bool		gone = PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 0;

		PQclear(res);
		if (gone)
			break;
		if (matrix_interrupted || now_seconds() - t0 > ctx->timeout_s)
		{
			fail(&e, "backend %s of the killed worker did not end its transaction", pid);
			return;
		}
		sleep_ms(POLL_MS);
	}
	record_text(&e, "ORD-1001", before, sizeof(before), NULL, 0);
	rows_before = effect_rows(&e, "ORD-1001");
	note(&e, "Its backend (pid %s) left the transaction %.0f ms later; then the record was \"%s\" and %d effect rows existed.",
		 pid, (now_seconds() - t0) * 1000.0, before, rows_before);
	if (rows_before != 0)
		fail(&e, "the dead transaction's effect row is visible");

	s.pauses = 0;
	deliver(&e, &w2, &s, "w2");
	list_append(cr->obs_verdicts, CELL, worker_verdict_text(&w2, v, sizeof(v)));
	record_text(&e, "ORD-1001", after, sizeof(after), NULL, 0);
	snprintf(cr->obs_record, CELL, "%.90s, then %.90s", before, after);
	cr->obs_emails = effect_rows(&e, "ORD-1001");
	note(&e, "The effect here is a row in the claim's own transaction, not an email: the emails column counts effect rows.");
}

/*
 * 9: a slow (not dead) worker: it sent the email, then stalls past its
 * lease; a redelivery meets the stale claim; then the slow one completes.
 */
static void
case_9(matrix_ctx *ctx, policy_t policy, policy_t as, case_result *cr)
{
	case_env	e;
	worker		w1,
				w2;
	worker_spec s;
	char		v[96];
	char		result[512];

	if (!env_setup(ctx, policy, as, cr, &e))
		return;
	s = spec_for(&e, "ORD-1001");
	s.pauses = PAUSE_SENT;
	if (!start(&e, &w1, &s, "w1", -1))
	{
		worker_dispose(&w1);
		return;
	}
	if (!worker_wait(ctx, &w1, "paused"))
	{
		worker_failed(&e, &w1);
		worker_dispose(&w1);
		return;
	}
	list_append(cr->obs_verdicts, CELL, "run (slow)");
	note(&e, "%s claimed (attempt %d), sent the email and stalled (alive, connected).",
		 w1.name, w1.attempt);
	if (!wait_stale(&e, "ORD-1001"))
	{
		worker_dispose(&w1);
		return;
	}
	s.pauses = 0;
	deliver(&e, &w2, &s, "w2");
	list_append(cr->obs_verdicts, CELL, worker_verdict_text(&w2, v, sizeof(v)));

	/* the slow worker wakes up and completes with its old attempt */
	worker_go(&w1);
	if (!worker_wait(ctx, &w1, NULL))
		worker_failed(&e, &w1);
	worker_dispose(&w1);
	if (w1.completed)
		list_append(cr->obs_verdicts, CELL, "late completion ok");
	else
	{
		snprintf(v, sizeof(v), "late completion %s",
				 w1.complete_error[0] ? w1.complete_error : "no answer");
		list_append(cr->obs_verdicts, CELL, v);
		if (w1.complete_error[0])
			note(&e, "%s's completion with attempt %d was refused: %s (%s).",
				 w1.name, w1.attempt, w1.complete_error, w1.error_text);
	}
	observe(&e, "ORD-1001");
	record_text(&e, "ORD-1001", v, sizeof(v), result, sizeof(result));
	if (w2.attempt > w1.attempt && (w2.completed))
	{
		if (strstr(result, w2.name))
			note(&e, "The record keeps the new owner's result: %s.", result);
		else
			fail(&e, "the record's result %s is not %s's", result, w2.name);
	}
	else if (w1.completed && !strstr(result, w1.name))
		fail(&e, "the record's result %s is not %s's", result, w1.name);
}

/* 10: a known failure is released; the next delivery runs */
static void
case_10(matrix_ctx *ctx, policy_t policy, policy_t as, case_result *cr)
{
	case_env	e;
	worker		w1,
				w2;
	worker_spec s;
	char		v[64];

	if (!env_setup(ctx, policy, as, cr, &e))
		return;
	s = spec_for(&e, "ORD-1001");
	s.mode = W_RELEASE;
	deliver(&e, &w1, &s, "w1");
	list_append(cr->obs_verdicts, CELL, worker_verdict_text(&w1, v, sizeof(v)));
	list_append(cr->obs_verdicts, CELL, w1.released ? "released" : "release failed");
	s.mode = W_NORMAL;
	deliver(&e, &w2, &s, "w2");
	list_append(cr->obs_verdicts, CELL, worker_verdict_text(&w2, v, sizeof(v)));
	note(&e, "%s: the provider refused before sending, so the worker released the claim; %s then ran as attempt %d.",
		 w1.name, w2.name, w2.attempt);
	observe(&e, "ORD-1001");
}

/* 11: the same key with a different payload is refused, not "completed" */
static void
case_11(matrix_ctx *ctx, policy_t policy, policy_t as, case_result *cr)
{
	case_env	e;
	worker		w1,
				w2,
				w3;
	worker_spec s;
	char		v[64];
	char		fp1[40];
	char		fp2[40];
	char		result[512];

	if (!env_setup(ctx, policy, as, cr, &e))
		return;
	fingerprint("order=ORD-1001;customer=C-77;items=1;total=42.00", fp1, sizeof(fp1));
	fingerprint("order=ORD-1001;customer=C-77;items=2;total=84.00", fp2, sizeof(fp2));
	s = spec_for(&e, "ORD-1001");
	s.fingerprint = fp1;
	deliver(&e, &w1, &s, "w1");
	list_append(cr->obs_verdicts, CELL, worker_verdict_text(&w1, v, sizeof(v)));
	s.fingerprint = fp2;
	deliver(&e, &w2, &s, "w2");
	list_append(cr->obs_verdicts, CELL, worker_verdict_text(&w2, v, sizeof(v)));
	if (w2.claim_error[0])
		note(&e, "%s (different payload) got %s: %s.", w2.name, w2.claim_error, w2.error_text);
	s.fingerprint = fp1;
	deliver(&e, &w3, &s, "w3");
	list_append(cr->obs_verdicts, CELL, worker_verdict_text(&w3, v, sizeof(v)));
	note(&e, "%s (the original payload again) got \"%s\".", w3.name, w3.verdict);
	observe(&e, "ORD-1001");
	record_text(&e, "ORD-1001", v, sizeof(v), result, sizeof(result));
	if (w1.message_id[0] && !strstr(result, w1.message_id))
		fail(&e, "the stored result changed: %s", result);
}

/*
 * 12: a long job heartbeats with extend_lease (every lease/4). It runs for
 * 1.5 leases; then a redelivery must still see it in progress, and
 * stale_claims() must never have listed it.
 */
static void
case_12(matrix_ctx *ctx, policy_t policy, policy_t as, case_result *cr)
{
	case_env	e;
	worker		w1,
				w2;
	worker_spec s;
	char		v[64];
	const char *params[2];
	double		t0;
	int			listed = 0;
	int			polls = 0;
	bool		reached = false;

	if (!env_setup(ctx, policy, as, cr, &e))
		return;
	s = spec_for(&e, "ORD-1001");
	s.mode = W_HEARTBEAT;
	if (!start(&e, &w1, &s, "w1", -1) || !worker_wait(ctx, &w1, "claim"))
	{
		if (w1.problem[0])
			worker_failed(&e, &w1);
		worker_dispose(&w1);
		return;
	}
	params[0] = e.job_type;
	params[1] = "ORD-1001";
	t0 = now_seconds();
	progress(ctx, "%s case 12: a long job heartbeats past its lease", policy_names[policy]);
	for (;;)
	{
		PGresult   *res;
		bool		done = false;
		int			stale;

		if (!worker_drain(&w1) || w1.problem[0])
		{
			worker_failed(&e, &w1);
			break;
		}
		res = db_exec(ctx,
					  "SELECT pg_catalog.clock_timestamp() OPERATOR(pg_catalog.>=) "
					  "       (o.claimed_at OPERATOR(pg_catalog.+) (jt.lease OPERATOR(pg_catalog.*) 1.5)) "
					  "FROM idempotency.operations o "
					  "JOIN idempotency.job_types jt ON jt.job_type OPERATOR(pg_catalog.=) o.job_type "
					  "WHERE o.job_type OPERATOR(pg_catalog.=) $1 "
					  "  AND o.operation_key OPERATOR(pg_catalog.=) $2",
					  2, params);
		if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
		{
			fail(&e, "cannot watch the claim: %s", case_sql_error(res, ctx));
			PQclear(res);
			break;
		}
		polls++;
		done = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
		PQclear(res);
		/* a statement of its own, as in record_text() */
		stale = listed_stale(&e, params[1]);
		if (stale < 0)
			break;				/* noted as a failure */
		listed += stale;
		if (done)
		{
			reached = true;
			break;
		}
		if (matrix_interrupted || now_seconds() - t0 > ctx->lease_s * 1.5 + ctx->timeout_s)
		{
			fail(&e, "the job never reached 1.5 leases");
			break;
		}
		sleep_ms(POLL_MS);
	}
	list_append(cr->obs_verdicts, CELL, w1.extended > 0 ? "run (heartbeats)" : "run (no heartbeat)");
	s.mode = W_NORMAL;
	deliver(&e, &w2, &s, "w2");
	list_append(cr->obs_verdicts, CELL, worker_verdict_text(&w2, v, sizeof(v)));
	if (listed_stale(&e, "ORD-1001") == 1)
		listed++;
	worker_go(&w1);
	if (!worker_wait(ctx, &w1, NULL))
		worker_failed(&e, &w1);
	worker_dispose(&w1);
	if (reached)
		note(&e, "%s ran 1.5 leases with %d extend_lease calls (one every lease/4); the redelivery came after its first lease had run out.",
			 w1.name, w1.extended);
	if (listed)
		fail(&e, "stale_claims() listed the heartbeating claim %d times", listed);
	else if (reached)
		note(&e, "stale_claims() never listed it (%d polls).", polls + 1);
	if (!w1.completed)
		fail(&e, "%s could not complete: %s", w1.name, w1.complete_error);
	observe(&e, "ORD-1001");
}

/*
 * 13: the queue lost the message: a dead worker's claim that no redelivery
 * ever touches. stale_claims() must not list it inside the lease, and must
 * list it (attempt, worker, policy) once the lease ran out.
 */
static void
case_13(matrix_ctx *ctx, policy_t policy, policy_t as, case_result *cr)
{
	case_env	e;
	worker		w1;
	worker_spec s;
	PGresult   *res;
	char		name[64];
	int			early;

	if (!env_setup(ctx, policy, as, cr, &e))
		return;
	s = spec_for(&e, "ORD-1001");
	s.pauses = PAUSE_CLAIMED;
	if (!start(&e, &w1, &s, "w1", -1))
	{
		worker_dispose(&w1);
		return;
	}
	copy_str(name, sizeof(name), w1.name);
	if (!kill_at_pause(&e, &w1, "after its claim; its message is lost, nothing redelivers it"))
		return;
	early = listed_stale(&e, "ORD-1001");
	if (early == 1)
		fail(&e, "stale_claims() listed the claim inside its lease");
	else if (early == 0)
		note(&e, "Inside the lease stale_claims() does not list it.");
	if (!wait_stale(&e, "ORD-1001"))
	{
		list_append(cr->obs_verdicts, CELL, "run (killed), not listed");
		observe(&e, "ORD-1001");
		return;
	}
	res = stale_claim_query(ctx, e.job_type, "ORD-1001");
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
	{
		bool		ok = atoi(PQgetvalue(res, 0, 0)) == 1 &&
			strcmp(PQgetvalue(res, 0, 1), name) == 0 &&
			strcmp(PQgetvalue(res, 0, 2), policy_names[policy]) == 0 &&
			strcmp(PQgetvalue(res, 0, 4), "t") == 0;

		list_append(cr->obs_verdicts, CELL, ok ? "run (killed), listed by stale_claims()"
			   : "run (killed), listed wrongly");
		if (ok)
			note(&e, "stale_claims() lists it with attempt 1, claimed_by %s, policy %s, stale for %s.",
				 name, policy_names[policy], PQgetvalue(res, 0, 3));
		else
			fail(&e, "stale_claims() row: attempt %s, claimed_by %s, policy %s, expired in the past: %s",
				 PQgetvalue(res, 0, 0), PQgetvalue(res, 0, 1), PQgetvalue(res, 0, 2),
				 PQgetvalue(res, 0, 4));
	}
	else
	{
		list_append(cr->obs_verdicts, CELL, "run (killed), not listed");
		fail(&e, "stale_claims(): %s", case_sql_error(res, ctx));
	}
	PQclear(res);
	observe(&e, "ORD-1001");
}

/* the steps of each case the reference run has; the case itself is in case_table.c */
typedef void (*reference_case_fn) (matrix_ctx *ctx, policy_t policy, policy_t as,
								   case_result *cr);

static const struct
{
	const char *id;
	reference_case_fn run;
}			reference_steps[] = {
	{"1", case_1},
	{"2", case_2},
	{"3", case_3},
	{"3s", case_3s},
	{"4", case_4},
	{"5", case_5},
	{"6", case_6},
	{"7a", case_7a},
	{"7b", case_7b},
	{"8", case_8},
	{"9", case_9},
	{"10", case_10},
	{"11", case_11},
	{"12", case_12},
	{"13", case_13},
};

static reference_case_fn
steps_of(const char *id)
{
	size_t		i;

	for (i = 0; i < sizeof(reference_steps) / sizeof(reference_steps[0]); i++)
		if (strcmp(reference_steps[i].id, id) == 0)
			return reference_steps[i].run;
	return NULL;
}

/* does the reference run (--cases, --stress) have case c? */
static bool
reference_wants(const matrix_ctx *ctx, const case_spec *c)
{
	return (c->runs_in & RUN_REFERENCE) && case_selected(ctx->cases, c->id) &&
		!(strcmp(c->id, "3s") == 0 && ctx->stress == 0);
}

int
reference_count_cases(const matrix_ctx *ctx)
{
	int			k,
				n = 0;

	for (k = 0; k < n_case_table; k++)
		if (reference_wants(ctx, &case_table[k]))
			n++;
	return n;
}

/*
 * The reference run: every wanted policy, every selected case, the report.
 * check_as >= 0: every policy checked against that one's expectations.
 * The exit status (report_all()'s), or 130 when interrupted.
 */
int
reference_run(matrix_ctx *ctx, const bool *want, int check_as, const char *html,
			  const char *json)
{
	static const case_words words = {"email", "order ORD-1002"};
	policy_result *prs;
	int			npr = 0;
	int			p,
				k;
	int			total = 0;
	int			done = 0;
	double		t0;

	printf("%sReplay matrix%s: send_confirmation for ORD-1001, idempotency %s on PostgreSQL %s\n",
		   ctx->color ? "\033[1m" : "", ctx->color ? "\033[0m" : "",
		   ctx->ext_version, ctx->server_version);
	printf("server %s; lease %s; stress %d workers; %s\n",
		   ctx->server_desc, ctx->lease_sql, ctx->stress, ctx->started_at);
	printf("job types %s_<policy>_<case>, mailboxes in %s: %s\n",
		   ctx->prefix, ctx->maildir, ctx->keep ? "kept (--keep)" : "removed at the end");
	fflush(stdout);

	for (p = 0; p < N_POLICIES; p++)
		if (want[p])
			total += reference_count_cases(ctx);
	prs = calloc(N_POLICIES, sizeof(policy_result));
	t0 = now_seconds();
	for (p = 0; p < N_POLICIES && !matrix_interrupted; p++)
	{
		policy_result *pr;
		double		tp = now_seconds();

		if (!want[p])
			continue;
		pr = &prs[npr++];
		pr->policy = (policy_t) p;
		pr->checked_as = check_as >= 0 ? (policy_t) check_as : (policy_t) p;
		for (k = 0; k < n_case_table && !matrix_interrupted; k++)
		{
			const case_spec *c = &case_table[k];
			case_result *cr;
			double		tc;

			if (!reference_wants(ctx, c))
				continue;
			cr = &pr->cases[pr->ncases++];
			case_expectations(c, pr->checked_as, &words, ctx->stress, ctx->utf8, cr);
			progress(ctx, "[%d/%d] policy %s, case %s: %s", ++done, total,
					 policy_names[p], cr->id, cr->title);
			tc = now_seconds();
			steps_of(c->id) (ctx, (policy_t) p, pr->checked_as, cr);
			cr->seconds = now_seconds() - tc;
			workers_kill_all();
			case_finish(cr);
		}
		pr->seconds = now_seconds() - tp;
		progress_clear(ctx);
		report_policy(ctx, pr);
	}
	ctx->seconds = now_seconds() - t0;
	progress_clear(ctx);
	if (matrix_interrupted)
	{
		free(prs);
		return 130;
	}
	return report_all(ctx, prs, npr, html, json);
}
