/*
 * case_steps.c
 *		The steps of each case, as the engine (engine.c) runs them, and the
 *		run: each wanted policy, each case the job has, the report.
 *
 * What a case is, and what each policy must give, is case_table.c's; here
 * is only how the engine makes it happen: which points to hold, when to
 * enqueue, whom to kill. A step arms the point it wants to hold for a key
 * (one-shot); every other exchange is answered "continue" at once.
 */
#include "postgres_fe.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "common/logging.h"
#include "diagnosis.h"
#include "engine.h"

/* ---------------------------------------------------------------------
 * The cases of a sign-off run
 * --------------------------------------------------------------------- */

/* a case whose premise a slow machine missed (s->missed) runs this often in all */
#define CASE_TRIES 3

typedef void (*signoff_case_fn) (signoff_state *s);

static void sc_1(signoff_state *s);
static void sc_2(signoff_state *s);
static void sc_3(signoff_state *s);
static void sc_3s(signoff_state *s);
static void sc_4(signoff_state *s);
static void sc_5(signoff_state *s);
static void sc_6(signoff_state *s);
static void sc_7a(signoff_state *s);
static void sc_7b(signoff_state *s);
static void sc_8(signoff_state *s);
static void sc_9(signoff_state *s);
static void sc_10(signoff_state *s);
static void sc_11(signoff_state *s);
static void sc_12(signoff_state *s);
static void sc_13(signoff_state *s);
static void sc_14(signoff_state *s);
static void sc_15(signoff_state *s);
static void sc_16(signoff_state *s);
static void sc_17(signoff_state *s);
static void sc_18(signoff_state *s);
static void sc_19(signoff_state *s);
static void sc_20(signoff_state *s);
static const char *effect_name_of(signoff_state *s);

/* the steps of each case the sign-off run has; the case itself is in case_table.c */
static const struct
{
	const char *id;
	signoff_case_fn run;
}			signoff_steps[] = {
	{"1", sc_1},
	{"2", sc_2},
	{"3", sc_3},
	{"3s", sc_3s},
	{"4", sc_4},
	{"5", sc_5},
	{"6", sc_6},
	{"7a", sc_7a},
	{"7b", sc_7b},
	{"8", sc_8},
	{"9", sc_9},
	{"10", sc_10},
	{"11", sc_11},
	{"12", sc_12},
	{"13", sc_13},
	{"14", sc_14},
	{"15", sc_15},
	{"16", sc_16},
	{"17", sc_17},
	{"18", sc_18},
	{"19", sc_19},
	{"20", sc_20},
};

static signoff_case_fn
steps_of(const char *id)
{
	size_t		i;

	for (i = 0; i < sizeof(signoff_steps) / sizeof(signoff_steps[0]); i++)
		if (strcmp(signoff_steps[i].id, id) == 0)
			return signoff_steps[i].run;
	return NULL;
}


bool
signoff_case_wanted(const char *cases, const signoff_job *job, const case_spec *c)
{
	if (job->reference)
	{
		/* the reference job's worker can do every case of the reference run */
		if (!(c->runs_in & RUN_REFERENCE) || (strcmp(c->id, "3s") == 0 && job->stress == 0))
			return false;
		return case_selected(cases, c->id);
	}
	if (c->runs_in == RUN_EFFECT)
		return job->effect != EFFECT_NONE && case_selected(cases, c->id);
	if (c->runs_in == RUN_BATCH)
		return job->batch && !job->transactional && job->value[JF_ENQUEUE_OTHER] != NULL &&
			case_selected(cases, c->id);
	if (!(c->runs_in & (job->transactional ? RUN_TX : RUN_SIGNOFF)))
		return false;
	if (strcmp(c->id, "11") == 0 && job->value[JF_ENQUEUE_OTHER] == NULL)
		return false;
	return case_selected(cases, c->id);
}

int
signoff_count_cases(const char *cases, const signoff_job *job)
{
	int			k,
				n = 0;

	for (k = 0; k < n_case_table; k++)
		if (signoff_case_wanted(cases, job, &case_table[k]))
			n++;
	return n;
}

/* ---------------------------------------------------------------------
 * The cases
 * --------------------------------------------------------------------- */

/* 1: one worker, one message: run, completed #1, one effect */
static void
sc_1(signoff_state *s)
{
	if (start_workers(s, 1) && enqueue(s, 0, JF_ENQUEUE))
		settle(s);
	stop_workers(s);
	observe(s, NULL);
}

/*
 * 2: the same message again after it completed: judged completed. A helper
 * that sends the stored result with judged (optional) must send the one
 * the record holds.
 */
static void
sc_2(signoff_state *s)
{
	int			i;

	if (start_workers(s, 1) && enqueue(s, 0, JF_ENQUEUE) && settle(s) &&
		enqueue(s, 0, JF_ENQUEUE) && settle(s) && (i = nth_delivery(s, 0, 2)) >= 0 &&
		s->d[i].has_result)
	{
		PGresult   *res = record_query(s->ctx, s->job_type, s->opkey[0]);

		if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 &&
			strcmp(PQgetvalue(res, 0, 2), s->d[i].result) == 0)
			case_note(s->cr, "The redelivery got the stored result back: %s.", s->d[i].result);
		else
			case_fail(s->cr, "the redelivery's result %s is not what the record stores (%s)", s->d[i].result,
					  PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1
					  ? PQgetvalue(res, 0, 2) : case_sql_error(res, s->ctx));
		PQclear(res);
	}
	stop_workers(s);
	observe(s, NULL);
}

/*
 * 3: two workers; the first delivery is held at claimed, and the same
 * message is enqueued again meanwhile: the other worker's claim meets the
 * claim in flight (in_progress). Enqueued only once the first stands at
 * claimed, so that the two points arrive in the order of the claims.
 */
static void
sc_3(signoff_state *s)
{
	exch	   *x;
	int			other;

	arm_point(s, 0, "claimed");
	if (start_workers(s, 2) && enqueue(s, 0, JF_ENQUEUE) &&
		(x = wait_held(s, 0, "claimed")) != NULL)
	{
		long		pid = x->pid;

		if (enqueue(s, 0, JF_ENQUEUE) && (other = wait_nth(s, 0, 2)) >= 0)
			case_note(s->cr, "While pid %ld stood at claimed, the same message went to pid %ld, which was judged %s.",
					  pid, s->d[other].pid, s->d[other].runs ? "run" : s->d[other].verdict);
		answer(s, x, "continue");
		settle(s);
	}
	stop_workers(s);
	observe(s, NULL);
}

/* 4: another key at the same time, two workers: both run, one effect each */
static void
sc_4(signoff_state *s)
{
	if (start_workers(s, 2) && enqueue(s, 0, JF_ENQUEUE) && enqueue(s, 1, JF_ENQUEUE))
		settle(s);
	stop_workers(s);
	observe(s, NULL);
}

/*
 * 3s: the stress variant of 3, a capability of the reference job's worker
 * (quick to start): --stress workers; while the first delivery stands at
 * claimed, the message goes to the others, and every one of them must meet
 * the claim in flight (in_progress).
 */
static void
sc_3s(signoff_state *s)
{
	int			n = s->job->stress;
	exch	   *x;
	int			i;

	arm_point(s, 0, "claimed");
	if (start_workers(s, n) && enqueue(s, 0, JF_ENQUEUE) &&
		(x = wait_held(s, 0, "claimed")) != NULL)
	{
		long		pid = x->pid;
		double		t0 = now_seconds();

		for (i = 1; i < n; i++)
			if (!enqueue(s, 0, JF_ENQUEUE))
				break;
		if (i == n && wait_nth(s, 0, n) >= 0)
		{
			long		pids[MAX_CASE_WORKERS];
			int			npids = 0;
			int			j,
						k;

			for (j = case_first_delivery; j < s->nd; j++)
			{
				for (k = 0; k < npids && pids[k] != s->d[j].pid; k++)
					;
				if (k == npids && npids < MAX_CASE_WORKERS)
					pids[npids++] = s->d[j].pid;
			}
			case_note(s->cr, "%d workers; while pid %ld stood at claimed, the message went %d more times, "
					  "to %d workers, all answered within %.0f ms.",
					  n, pid, n - 1, npids - 1, (now_seconds() - t0) * 1000.0);
		}
		answer(s, x, "continue");
		settle(s);
	}
	stop_workers(s);
	observe(s, NULL);
}

/*
 * 8: the transactional mode (the effect is a row written in the
 * completion's transaction; the reference job's worker in this case): the
 * worker is killed at handled, inside its transaction, after its row and
 * before the completion. Once its server process left the transaction
 * there is no record and no row; the message again runs once, as attempt 1.
 */
static bool
pred_backend_idle(signoff_state *s, const void *arg)
{
	char		pid[24];
	const char *params[1];
	PGresult   *res;
	bool		gone;

	snprintf(pid, sizeof(pid), "%ld", *(const long *) arg);
	params[0] = pid;
	res = db_exec(s->ctx, "SELECT 1 FROM pg_catalog.pg_stat_activity "
				  "WHERE pid OPERATOR(pg_catalog.=) $1::integer AND xact_start IS NOT NULL",
				  1, params);
	gone = PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 0;
	PQclear(res);
	return gone;
}

static void
sc_8(signoff_state *s)
{
	exch	   *x;
	long		backend = 0;
	char		before[CELL] = "";
	char		after[CELL];
	int			rows;
	double		t0;

	if (s->job->reference && (s->ctx->effects_table[0] == '\0' || s->ctx->effects_error[0]))
	{
		case_fail(s->cr, "no table for the effect rows: %s", s->ctx->effects_error);
		goto out;
	}
	arm_point(s, 0, "handled");
	if (!start_workers(s, 1) || !enqueue(s, 0, JF_ENQUEUE) ||
		(x = wait_held(s, 0, "handled")) == NULL)
		goto out;
	backend = x->backend_pid;
	if (x->delivery >= 0)
		copy_str(s->d[x->delivery].mark, sizeof(s->d[x->delivery].mark), "killed in transaction");
	if (!kill_at(s, x, "inside its transaction, after the claim and the effect row, before the completion"))
		goto out;
	t0 = now_seconds();
	if (backend > 0)
	{
		/* the dead client's server process notices, rolls back, and leaves */
		if (wait_for(s, pred_backend_idle, &backend, false, s->job->timeout_s) != WAIT_OK)
		{
			case_fail(s->cr, "server process %ld of the killed worker did not leave its transaction", backend);
			goto out;
		}
	}
	record_text_of(s->ctx, s->cr, s->job_type, s->opkey[0], before, sizeof(before), NULL, 0);
	rows = effects_count(s, s->keys[0], true);
	if (backend > 0)
		case_note(s->cr, "Its server process (pid %ld) left the transaction %.0f ms later; then the record was \"%s\" "
				  "and %d effect rows existed.", backend, (now_seconds() - t0) * 1000.0, before, rows);
	else
		case_note(s->cr, "Then the record was \"%s\" and %d effect rows existed (the worker did not name its "
				  "server process, backend_pid: the redelivery's verdict shows whether the transaction rolled back).",
				  before, rows);
	if (rows != 0)
		case_fail(s->cr, "the dead transaction's effect row is visible: the row was committed before the worker died "
				  "at handled, so it is not written in the completion's transaction");
	if (strcmp(before, "none") != 0)
		case_fail(s->cr, "the record was %s after the worker died at handled: the claim (or the completion) committed "
				  "on its own, before the handled point, so the effect is not in the claim's transaction", before);
	if (start_workers(s, 1) && enqueue(s, 0, JF_ENQUEUE))
		settle(s);
out:
	stop_workers(s);
	observe(s, NULL);
	if (before[0])
	{
		record_text_of(s->ctx, s->cr, s->job_type, s->opkey[0], after, sizeof(after), NULL, 0);
		snprintf(s->cr->obs_record, CELL, "%.90s, then %.90s", before, after);
	}
	case_note(s->cr, "The effect here is a row in the claim's own transaction, not an %s: the %s column counts effect rows.",
			  s->job->reference ? "email" : "outside effect", s->job->reference ? "emails" : "effects");
}

/*
 * A verdict the database gives only once the claim's lease has run out: the
 * stale-claim policy's (held, skipped, verify) or a takeover (run with
 * attempt 2 or more). It is the database's clock that says so, not the
 * runner's: whatever the runner saw meanwhile, such a delivery came after
 * the lease.
 */
static bool
judged_stale(const delivery *d)
{
	return (d->runs && d->attempt > 1) || strcmp(d->verdict, "verify") == 0 ||
		strcmp(d->verdict, "held") == 0 || strcmp(d->verdict, "skipped") == 0;
}

/* text with {effect} filled in with the job's effect name, into out */
static void
fill_effect(signoff_state *s, char *out, size_t sz, const char *prefix, const char *text)
{
	const char *eff = effect_name_of(s);
	size_t		n = (size_t) snprintf(out, sz, "%s", prefix);
	const char *p;

	for (p = text; *p && n + 1 < sz; p++)
	{
		if (strncmp(p, "{effect}", 8) == 0)
		{
			n += (size_t) snprintf(out + n, sz - n, "%s", eff);
			p += 7;
		}
		else
			out[n++] = *p;
	}
	out[n < sz ? n : sz - 1] = '\0';
}

/* the first delivery of the case's key 0 after delivery *arg judged after the lease, or -1 */
static int
stale_after(signoff_state *s, int after)
{
	int			j;

	for (j = after + 1; j < s->nd; j++)
		if (!s->d[j].stray && s->d[j].ki == 0 && judged_stale(&s->d[j]))
			return j;
	return -1;
}

static bool
pred_stale_after(signoff_state *s, const void *arg)
{
	return stale_after(s, *(const int *) arg) >= 0;
}

/*
 * 7a, 7b, after the redelivery (delivery i) was judged in_progress: a
 * later delivery that the database judged after the lease (the helper's
 * own in_progress retry, once the claim was no longer kept young) is the
 * policy's to answer, as in case 5 (6). When the record moved on (a
 * takeover's attempt, skipped) the case waits for that delivery's point;
 * when one came, the case's expectations become what case 5 (6) gives under
 * the policy after the in_progress, and a note says so. None: the case's
 * own expectations stand.
 */
static void
settle_after_lease(signoff_state *s, int i)
{
	case_result *cr = s->cr;
	const case_spec *c = case_by_id(cr->id);
	const case_spec *after = c && c->settles_as ? case_by_id(c->settles_as) : NULL;
	const case_expect *e;
	const char *second;
	char		status[32];
	int			attempt = 0;
	int			j;

	if (after == NULL || s->pr == NULL)
		return;
	pump(s, 0);					/* points already on their way */
	if (record_row(s, s->opkey[0], status, sizeof(status), &attempt) &&
		(strcmp(status, "claimed") != 0 || attempt != 1) && stale_after(s, i) < 0)
		wait_for(s, pred_stale_after, &i, true, s->job->timeout_s);
	if ((j = stale_after(s, i)) < 0)
		return;
	settle(s);					/* a takeover's run: its handled point and completion */
	e = &after->expect[s->pr->checked_as];
	second = strstr(e->verdicts, ", ");
	cr->exp_emails = e->effects;
	copy_str(cr->exp_record, CELL, e->record);
	if (second)
	{
		char		v[CELL];

		snprintf(v, sizeof(v), "%s, %s", cr->exp_verdicts, second + 2);
		copy_str(cr->exp_verdicts, CELL, v);
	}
	fill_effect(s, cr->expected_text, sizeof(cr->expected_text), "after the lease, as case 5: ", e->text);
	if (strcmp(after->id, "5") != 0)
		fill_effect(s, cr->expected_text, sizeof(cr->expected_text), "after the lease, as case 6: ", e->text);
	case_note(cr, "After the lease had run out the message came once more: pid %ld was judged %s (attempt %d) by "
			  "the database, which answers a claim whose lease ran out with the policy. The case settles as case "
			  "%s gives under %s; expected then: %d %s%s, %s, %s.",
			  s->d[j].pid, s->d[j].verdict, s->d[j].attempt, after->id, policy_names[s->pr->checked_as],
			  cr->exp_emails, effect_name_of(s), cr->exp_emails == 1 ? "" : "s", cr->exp_record,
			  cr->exp_verdicts);
}

/*
 * 7a, 7b, once observed: the runner's part in the lease, said; and a
 * record read after the lease (the runner descheduled longer than it, so
 * that it could not keep the claim young) is the record the redelivery
 * found, which its in_progress verdict gives: the claim young and attempt
 * 1's, by the database's clock.
 */
static void
young_said(signoff_state *s, int i, double killed_at)
{
	case_result *cr = s->cr;

	if (s->young_extended > 0)
		case_note(cr, "From the death until the case had read the record the runner kept the dead claim's lease "
				  "running (extend_lease() with attempt 1, %d time%s, as the worker's heartbeat would have), so "
				  "that the message's return was inside the lease however slow the machine%s%s.",
				  s->young_extended, s->young_extended == 1 ? "" : "s", s->young_ended[0] ? "; it stopped early: " : "",
				  s->young_ended);
	if (i >= 0 && !s->d[i].runs && strcmp(s->d[i].verdict, "in_progress") == 0 &&
		strcmp(cr->obs_record, "claimed #1 (stale)") == 0 && strcmp(cr->exp_record, "claimed #1 (young)") == 0)
	{
		copy_str(cr->obs_record, CELL, "claimed #1 (young)");
		case_note(cr, "The runner read the record only after the %s lease had run out (%.1f s after the death the "
				  "redelivery's report arrived); the claim was still attempt 1's, and young when the message came "
				  "again, as the in_progress verdict gives.", s->ctx->lease_sql, s->d[i].at - killed_at);
	}
}

/*
 * 5, 6: the worker is killed at claimed (before the handler) or at handled
 * (after it, before the completion); after the lease a new worker gets the
 * same message again. 7a, 7b: the same deaths, the message again inside the
 * lease: a second worker is started with the first, and from the death
 * until the case has read the record the runner keeps the dead claim young
 * (keep_young()), so that no enqueue, queue or worker start, however slow,
 * takes the redelivery past the lease. What the case judges is what the
 * database answered: the redelivery's verdict (in_progress: young when it
 * came, by the database's clock), a later delivery's (the policy's, after
 * the lease: settle_after_lease()), the record, the effects. Only a
 * redelivery the database judged after the lease (judged_stale(); the
 * runner descheduled longer than the lease, so it could not keep the claim
 * young) did not test the case, which then runs again (s->missed).
 */
static void
death(signoff_state *s, const char *point, bool after_lease)
{
	exch	   *x;
	bool		at_claimed = strcmp(point, "claimed") == 0;
	int			i = -1;
	double		killed_at = 0;

	arm_point(s, 0, point);
	if (!(after_lease ? start_workers(s, 1) : start_workers_alike(s, 2)) || !enqueue(s, 0, JF_ENQUEUE) ||
		(x = wait_held(s, 0, point)) == NULL)
		goto out;
	{
		int			attempt = x->attempt;

		if (!kill_at(s, x, at_claimed ? "after its claim committed, before the handler"
					 : "after the handler returned, before the completion"))
			goto out;
		if (!after_lease)
		{
			killed_at = now_seconds();
			keep_young(s, 0, attempt);
		}
	}
	if (after_lease && (!wait_stale_checked(s, 0) || !start_workers(s, 1)))
		goto out;
	if (!enqueue(s, 0, JF_ENQUEUE))
		goto out;
	if (!after_lease)
	{
		if ((i = wait_nth(s, 0, 2)) < 0)
			goto out;
		if (!s->d[i].runs && strcmp(s->d[i].verdict, "in_progress") == 0)
			case_note(s->cr, "The message came again %.1f s after the death: pid %ld was judged in_progress, "
					  "and the attempt is still 1.", s->d[i].at - killed_at, s->d[i].pid);
		else if (judged_stale(&s->d[i]))
			snprintf(s->missed, sizeof(s->missed),
					 "the message came again %.1f s after the death and was judged %s (attempt %d), as after the "
					 "lease: %s", s->d[i].at - killed_at, s->d[i].verdict, s->d[i].attempt,
					 s->young_ended[0] ? s->young_ended :
					 "the runner, which keeps the claim young, was descheduled longer than the lease");
	}
	settle(s);
	if (i >= 0 && !s->missed[0])
		settle_after_lease(s, i);
out:
	stop_workers(s);
	observe(s, NULL);
	if (!after_lease)
	{
		keep_young_stop(s);
		young_said(s, i, killed_at);
	}
}

static void
sc_5(signoff_state *s)
{
	death(s, "claimed", true);
}

static void
sc_6(signoff_state *s)
{
	death(s, "handled", true);
}

static void
sc_7a(signoff_state *s)
{
	death(s, "claimed", false);
}

static void
sc_7b(signoff_state *s)
{
	death(s, "handled", false);
}

/*
 * 9: a slow (not dead) worker: held at handled past the lease; the same
 * message again to a new worker, which takes over or not per the policy;
 * then the slow one goes on and sends its completion. The protocol has no
 * point after handled, so its outcome is read from the record once the
 * workers stopped: completed with its attempt (accepted), or with a later
 * attempt (a takeover's; the slow one's completion was refused, ID003,
 * because the attempt is the fencing token).
 */
static void
sc_9(signoff_state *s)
{
	exch	   *x = NULL;
	int			a1 = 0;
	char		suffix[64] = "";

	arm_point(s, 0, "handled");
	if (!start_workers(s, 1) || !enqueue(s, 0, JF_ENQUEUE) ||
		(x = wait_held(s, 0, "handled")) == NULL)
		goto out;
	a1 = x->attempt;
	if (x->delivery >= 0)
		copy_str(s->d[x->delivery].mark, sizeof(s->d[x->delivery].mark), "slow");
	case_note(s->cr, "pid %ld: the handler of attempt %d returned; the worker stands at handled (alive, its heartbeat stopped) past the lease.",
			  x->pid, a1);
	if (!wait_stale_checked(s, 0) || !start_workers(s, 1) || !enqueue(s, 0, JF_ENQUEUE) ||
		!settle(s))
		goto out;
	answer(s, x, "continue");
	x = NULL;
	settle(s);
out:
	/* the slow worker's completion has no point: it has come once the worker ended */
	stop_workers_now(s);
	if (a1 > 0)
	{
		char		status[32] = "";
		int			attempt = 0;

		if (!record_row(s, s->opkey[0], status, sizeof(status), &attempt))
			copy_str(suffix, sizeof(suffix), "late completion no answer");
		else if (strcmp(status, "completed") == 0 && attempt == a1)
			copy_str(suffix, sizeof(suffix), "late completion ok");
		else if (strcmp(status, "completed") == 0 && attempt > a1)
		{
			copy_str(suffix, sizeof(suffix), "late completion ID003");
			case_note(s->cr, "The record is completed #%d by the takeover, so the slow worker's completion with attempt %d "
					  "was refused (ID003: the attempt is the fencing token); the runner reads this from the record, "
					  "as the protocol has no point after handled.", attempt, a1);
		}
		else
		{
			copy_str(suffix, sizeof(suffix), "late completion no answer");
			case_note(s->cr, "After the slow worker went on and the workers stopped, the record is %s #%d.",
					  status, attempt);
		}
	}
	observe(s, suffix);
}

/* the record of key *arg (an index into the case's keys) says released */
static bool
pred_released(signoff_state *s, const void *arg)
{
	char		status[32];
	int			attempt = 0;

	return record_row(s, s->opkey[*(const int *) arg], status, sizeof(status), &attempt) &&
		strcmp(status, "released") == 0;
}

/* 10: "fail" at claimed: the helper releases; the next delivery runs */
static void
sc_10(signoff_state *s)
{
	exch	   *x;
	int			di;
	int			first_key = 0;

	arm_point(s, 0, "claimed");
	if (!start_workers(s, 1) || !enqueue(s, 0, JF_ENQUEUE) ||
		(x = wait_held(s, 0, "claimed")) == NULL)
		goto out;
	di = x->delivery;
	if (di >= 0)
		s->d[di].failed = true;
	answer(s, x, "fail");
	if (wait_for(s, pred_released, &first_key, true, s->job->timeout_s) == WAIT_OK)
	{
		if (di >= 0)
			copy_str(s->d[di].after, sizeof(s->d[di].after), "released");
		case_note(s->cr, "Answered fail at claimed: the helper released the claim (the record says released).");
	}
	else
	{
		if (di >= 0)
			copy_str(s->d[di].after, sizeof(s->d[di].after), "not released");
		case_fail(s->cr, "answered fail at claimed, but the record of %s was not released within %g s",
				  s->keys[0], s->job->timeout_s);
	}
	if (enqueue(s, 0, JF_ENQUEUE))
		settle(s);
out:
	stop_workers(s);
	observe(s, NULL);
}

/* 11: after completion, the key with other arguments: refused, ID002 */
static void
sc_11(signoff_state *s)
{
	int			i;

	if (!start_workers(s, 1) || !enqueue(s, 0, JF_ENQUEUE) || !settle(s) ||
		!enqueue(s, 0, JF_ENQUEUE_OTHER) || (i = wait_nth(s, 0, 2)) < 0)
		goto out;
	if (!s->d[i].runs)
		case_note(s->cr, "The message with other arguments was judged %s%s%s.", s->d[i].verdict,
				  s->d[i].sqlstate[0] ? " " : "", s->d[i].sqlstate);
	if (settle(s) && enqueue(s, 0, JF_ENQUEUE))
		settle(s);
out:
	stop_workers(s);
	observe(s, NULL);
}

/*
 * 12: after a listing that the heartbeat ended, its next beat (within a
 * lease), so that the gap after the stall tells the heartbeat's rhythm.
 */
static void
heartbeat_next(signoff_state *s, exch *x, const char *const *params, double *hb_last, double *min_gap)
{
	double		t0 = now_seconds();

	while (!matrix_interrupted && x->state != X_GONE && now_seconds() - t0 < s->job->lease_s)
	{
		PGresult   *res = db_exec(s->ctx,
								  "SELECT pg_catalog.date_part('epoch', heartbeat_at) FROM idempotency.operations "
								  "WHERE job_type OPERATOR(pg_catalog.=) $1 AND operation_key OPERATOR(pg_catalog.=) $2",
								  2, params);
		double		hb = NAN;

		if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
			hb = strtod(PQgetvalue(res, 0, 0), NULL);
		PQclear(res);
		if (isnan(hb))
			return;
		if (hb > *hb_last)
		{
			*min_gap = Min(*min_gap, hb - *hb_last);
			*hb_last = hb;
			return;
		}
		pump(s, POLL_MS);
	}
}

/*
 * 12: a long job: held at claimed (inside the heartbeat) for two leases,
 * watched on the database; stale_claims() must never list it, and the same
 * message again is in_progress. A helper without a heartbeat fails it: a
 * job longer than its lease would be taken for a dead one.
 *
 * Each poll also reads the record's heartbeat_at (the database's time of
 * the last extend_lease()), so the case knows the heartbeat's own rhythm.
 * A listing that ended because the heartbeat came again, from a heartbeat
 * that beats every half lease or sooner (its shortest gap between two
 * extensions), is a worker the machine stalled for longer than the lease,
 * not the job's fault: that try did not test the case, which runs again
 * (s->missed). A heartbeat slower than half the lease, or one that never
 * came again, fails the case.
 */
static void
sc_12(signoff_state *s)
{
	exch	   *x;
	int			di;
	int			listed = 0;
	int			polls = 0;
	bool		reached = false;
	bool		resumed = false;	/* a heartbeat came after a listing */
	double		t0;
	double		hb_last = NAN;
	double		min_gap = INFINITY;	/* between two extensions */
	double		max_gap = 0;
	char		slow[300] = "";	/* a heartbeat slower than half the lease, said */
	const char *params[2];

	arm_point(s, 0, "claimed");
	if (!start_workers(s, 2) || !enqueue(s, 0, JF_ENQUEUE) ||
		(x = wait_held(s, 0, "claimed")) == NULL)
		goto out;
	di = x->delivery;
	if (!x->heartbeat)
	{
		if (di >= 0)
			copy_str(s->d[di].mark, sizeof(s->d[di].mark), "no heartbeat");
		case_fail(s->cr, "the helper reported heartbeat false at claimed: it does not extend the lease while the handler runs, "
				  "so a job longer than the lease would be treated as dead; give the handler a heartbeat, "
				  "or leave case 12 out (--cases) if every run of the job is much shorter than its lease");
		answer(s, x, "continue");
		settle(s);
		goto out;
	}
	if (di >= 0)
		copy_str(s->d[di].mark, sizeof(s->d[di].mark), "heartbeats");
	params[0] = s->job_type;
	params[1] = s->opkey[0];
	t0 = now_seconds();
	progress(s->ctx, "%s case 12: a long job heartbeats past its lease", policy_names[s->policy]);
	for (;;)
	{
		PGresult   *res;
		bool		done;
		int			stale;
		double		hb;

		res = db_exec(s->ctx,
					  "SELECT pg_catalog.clock_timestamp() OPERATOR(pg_catalog.>=) "
					  "       (o.claimed_at OPERATOR(pg_catalog.+) (jt.lease OPERATOR(pg_catalog.*) 2)), "
					  "       pg_catalog.date_part('epoch', o.heartbeat_at) "
					  "FROM idempotency.operations o "
					  "JOIN idempotency.job_types jt ON jt.job_type OPERATOR(pg_catalog.=) o.job_type "
					  "WHERE o.job_type OPERATOR(pg_catalog.=) $1 "
					  "  AND o.operation_key OPERATOR(pg_catalog.=) $2",
					  2, params);
		if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
		{
			case_fail(s->cr, "cannot watch the claim: %s", case_sql_error(res, s->ctx));
			PQclear(res);
			break;
		}
		polls++;
		done = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
		hb = strtod(PQgetvalue(res, 0, 1), NULL);
		PQclear(res);
		if (isnan(hb_last))
			hb_last = hb;
		else if (hb > hb_last)
		{
			min_gap = Min(min_gap, hb - hb_last);
			max_gap = Max(max_gap, hb - hb_last);
			hb_last = hb;
			if (listed > 0)
				resumed = true;
		}
		stale = stale_listed(s->ctx, s->cr, s->job_type, s->opkey[0]);
		if (stale < 0)
			break;
		listed += stale;
		if (done)
		{
			reached = true;
			break;
		}
		if (x->state == X_GONE)
		{
			case_fail(s->cr, "the worker at claimed (pid %ld) ended while it was held", x->pid);
			break;
		}
		if (matrix_interrupted || now_seconds() - t0 > s->job->lease_s * 2 + s->job->timeout_s)
		{
			case_fail(s->cr, "the job never reached two leases");
			break;
		}
		pump(s, POLL_MS);
	}
	if (listed && resumed && min_gap > s->job->lease_s / 2)
		heartbeat_next(s, x, params, &hb_last, &min_gap);	/* its beat after the one that ended the listing */
	if (listed && resumed && min_gap <= s->job->lease_s / 2)
	{
		snprintf(s->missed, sizeof(s->missed),
				 "the worker's heartbeat extends the lease every %.1f s or sooner, yet once it did not run for "
				 "%.1f s, longer than the lease, and stale_claims() listed the claim meanwhile: the machine "
				 "stalled the worker", min_gap, max_gap);
		s->missed_heartbeat = true;
		answer(s, x, "continue");
		settle(s);
		goto out;
	}
	if (listed && resumed)
		snprintf(slow, sizeof(slow), ": the heartbeat extended the lease at best every %.1f s, more than half the "
				 "lease (%s), so one late beat (%.1f s at the longest) let the claim run out; extend the lease every "
				 "quarter of it", min_gap, s->ctx->lease_sql, max_gap);
	if (reached && enqueue(s, 0, JF_ENQUEUE) && wait_nth(s, 0, 2) >= 0)
	{
		if (stale_listed(s->ctx, s->cr, s->job_type, s->opkey[0]) == 1)
			listed++;
		case_note(s->cr, "pid %ld stood at claimed, its heartbeat running, for two leases (%.1f s); then the same message came again.",
				  x->pid, now_seconds() - t0);
	}
	if (listed)
		case_fail(s->cr, "stale_claims() listed the heartbeating claim %d times%s", listed, slow);
	else if (reached)
		case_note(s->cr, "stale_claims() never listed it (%d polls).", polls + 1);
	answer(s, x, "continue");
	settle(s);
out:
	stop_workers(s);
	observe(s, NULL);
}

/*
 * 13: the queue lost the message: killed at claimed, and nothing delivers
 * it again. stale_claims() must not list it inside the lease, and must list
 * it (attempt 1, the policy, expired) once the lease ran out.
 */
static void
sc_13(signoff_state *s)
{
	exch	   *x;
	int			early;
	char		suffix[64] = "";
	PGresult   *res;

	arm_point(s, 0, "claimed");
	if (!start_workers(s, 1) || !enqueue(s, 0, JF_ENQUEUE) ||
		(x = wait_held(s, 0, "claimed")) == NULL ||
		!kill_at(s, x, "after its claim; its message is lost, nothing delivers it again"))
		goto out;
	/*
	 * Listed, and its lease still running afterwards by the database's
	 * clock: listed inside the lease. Listed and run out by then: the
	 * runner looked late, and says so (the database's clock decides, not
	 * the runner's).
	 */
	early = stale_listed(s->ctx, s->cr, s->job_type, s->opkey[0]);
	if (early == 1)
	{
		double		left = lease_left(s, 0);

		if (!isnan(left) && left <= 0)
			case_note(s->cr, "The runner looked only when the lease had run out (%.1f s before, by the database's "
					  "clock): that stale_claims() does not list a claim inside its lease was not seen this time.",
					  -left);
		else
			case_fail(s->cr, "stale_claims() listed the claim inside its lease");
	}
	else if (early == 0)
		case_note(s->cr, "Inside the lease stale_claims() does not list it.");
	if (!wait_stale_checked(s, 0))
	{
		copy_str(suffix, sizeof(suffix), "not listed");
		goto out;
	}
	res = stale_claim_query(s->ctx, s->job_type, s->opkey[0]);
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
	{
		bool		ok = atoi(PQgetvalue(res, 0, 0)) == 1 &&
			strcmp(PQgetvalue(res, 0, 2), policy_names[s->policy]) == 0 &&
			strcmp(PQgetvalue(res, 0, 4), "t") == 0;

		copy_str(suffix, sizeof(suffix), ok ? "listed by stale_claims()" : "listed wrongly");
		if (ok)
			case_note(s->cr, "stale_claims() lists it with attempt 1, claimed_by %s, policy %s, stale for %s.",
					  PQgetvalue(res, 0, 1), policy_names[s->policy], PQgetvalue(res, 0, 3));
		else
			case_fail(s->cr, "stale_claims() row: attempt %s, claimed_by %s, policy %s, expired in the past: %s",
					  PQgetvalue(res, 0, 0), PQgetvalue(res, 0, 1), PQgetvalue(res, 0, 2),
					  PQgetvalue(res, 0, 4));
	}
	else
	{
		copy_str(suffix, sizeof(suffix), "not listed");
		case_fail(s->cr, "stale_claims(): %s", case_sql_error(res, s->ctx));
	}
	PQclear(res);
out:
	stop_workers(s);
	observe(s, suffix);
}

/* ---------------------------------------------------------------------
 * Faults at the effect (effect = http / smtp: the run's endpoint, effect.c)
 * --------------------------------------------------------------------- */

static const char *
effect_name_of(signoff_state *s)
{
	return s->job->value[JF_EFFECT_NAME] ? s->job->value[JF_EFFECT_NAME] : "effect";
}

/* the endpoint is a process of the run's: when it does not answer, the case cannot be judged */
static void
endpoint_gone(signoff_state *s)
{
	case_fail(s->cr, "the run's %s endpoint did not answer", effect_kind_names[s->job->effect]);
}

/* how a delivery ended after its call to the provider failed */
typedef enum
{
	FO_PENDING,
	FO_HANDLED,					/* the handler returned: the job took it for a success */
	FO_COMPLETED,				/* completed with no handled point: the handler raised, and
								 * the job completed all the same (an ensure block) */
	FO_RELEASED,				/* released: a known failure */
	FO_LEFT,					/* still claimed, and stale: left to its lease */
	FO_ENDED					/* completed without the handler returning: the job
								 * ended the operation on the failed call
								 * (PermanentFailure: the point ended) */
} fault_outcome;

static fault_outcome
fault_outcome_of(signoff_state *s, int di)
{
	const delivery *d = &s->d[di];
	char		status[32];
	int			attempt = 0;

	if (d->handled)
		return FO_HANDLED;
	if (!record_row(s, s->opkey[0], status, sizeof(status), &attempt))
		return FO_PENDING;
	if (strcmp(status, "released") == 0 || attempt != d->attempt)
		return FO_RELEASED;
	/*
	 * A helper sends the completion only once the runner answered its
	 * handled point: completed without one is the job ending the operation
	 * on its failed call (PermanentFailure, which says so at the point
	 * ended), or, without that point, a completion outside the handler's
	 * return after the handler raised (an ensure block)
	 */
	if (strcmp(status, "completed") == 0)
		return d->ended[0] ? FO_ENDED : FO_COMPLETED;
	if (strcmp(status, "claimed") == 0 && stale_listed(s->ctx, s->cr, s->job_type, s->opkey[0]) == 1)
		return FO_LEFT;
	return FO_PENDING;
}

static bool
pred_fault_over(signoff_state *s, const void *arg)
{
	return fault_outcome_of(s, *(const int *) arg) != FO_PENDING;
}

/*
 * Wait until delivery di of the case's key has ended after its call: the
 * handler returned, the claim was released, or it was left to its lease
 * (stale). FO_PENDING: it did not within the lease and the timeout (the
 * case fails, saying so).
 */
static fault_outcome
wait_fault_over(signoff_state *s, int di)
{
	wres		r = wait_for(s, pred_fault_over, &di, true, s->job->lease_s + s->job->timeout_s);

	if (r == WAIT_OK)
	{
		fault_outcome o = fault_outcome_of(s, di);

		/* a run that ended without handled: settle() does not wait for it */
		if (o == FO_RELEASED || o == FO_LEFT || o == FO_COMPLETED || o == FO_ENDED)
			s->d[di].failed = true;
		if (o == FO_COMPLETED)
			copy_str(s->d[di].after, sizeof(s->d[di].after), "completed, not handled");
		return o;
	}
	if (r == WAIT_INTERRUPTED)
		case_fail(s->cr, "interrupted");
	else if (r != WAIT_UNMAPPED)
		case_fail(s->cr, "after its call to the provider, the delivery of %s (pid %ld) neither returned, nor "
				  "released its claim, nor left it to its lease, nor completed it within %g s%s", s->keys[0],
				  s->d[di].pid, s->job->lease_s + s->job->timeout_s, r == WAIT_NO_WORKER ? " (its workers ended)" : "");
	return FO_PENDING;
}

/*
 * The case key's first delivery from the nth on that runs, marked (mark
 * NULL: not); -1: none came (noted). A claim that hit its bound ("busy",
 * under load) is skipped: the helper sends the message again, and it runs
 * then.
 */
static int
delivery_that_runs(signoff_state *s, int from, const char *mark)
{
	int			n;

	for (n = from;; n++)
	{
		int			di = wait_nth(s, 0, n);

		if (di < 0)
			return -1;
		if (s->d[di].runs)
		{
			if (mark)
				copy_str(s->d[di].mark, sizeof(s->d[di].mark), mark);
			return di;
		}
		if (strcmp(s->d[di].verdict, "busy") != 0 || n >= from + 4)
		{
			case_fail(s->cr, "the %s delivery of %s was judged %s, not run", from == 1 ? "first" : "next",
					  s->keys[0], s->d[di].verdict);
			return -1;
		}
	}
}

static int
first_delivery(signoff_state *s, const char *mark)
{
	return delivery_that_runs(s, 1, mark);
}

/*
 * After delivery di left its claim to its lease (15, 17): the message
 * again, then a wait for the delivery the database judged after the lease
 * (the policy's answer: held, skipped, verify, a takeover), then settled.
 * Not settled on the count of deliveries alone: a helper's own retry of an
 * in_progress copy may arrive first, still inside the lease, and would end
 * the case before the policy answered (seen in 17 on a loaded machine).
 */
static void
again_after_lease(signoff_state *s, int di)
{
	if (!enqueue(s, 0, JF_ENQUEUE))
		return;
	wait_for(s, pred_stale_after, &di, true, s->job->lease_s + s->job->timeout_s);
	settle(s);
}

/*
 * Did the delivery of the case's key send more than one request, the later
 * ones without the key the first carried? The endpoint counts, per key, the
 * requests whose Idempotency-Key header named it and the later ones that
 * named it only elsewhere (the path); a request that named no key at all,
 * sent while the case ran, is one too (check_unmatched() counts it). Then
 * that is the job's defect (case_defect()): true.
 */
static bool
two_requests(signoff_state *s, const char *after)
{
	effect_stats st;
	char		first[200];
	int			none = effect_unmatched(first, sizeof(first)) - s->unmatched;
	const char *eff = effect_name_of(s);

	if (!effect_stats_of(s->keys[0], &st) || (st.bare == 0 && (none <= 0 || st.requests == 0)))
		return false;
	if (st.bare > 0)
		case_defect(s, "one delivery of %s sent %d requests to the provider %s: the first with the key in its "
					"Idempotency-Key header, %d later one%s without it (the job retries the call inside its "
					"handler without the key the first request carried), so the provider cannot tell them for one "
					"operation and makes the %s again; send the same key with every request of the operation",
					s->keys[0], st.requests, after, st.bare, st.bare == 1 ? "" : "s", eff);
	else
		case_defect(s, "one delivery of %s sent %d request%s to the provider %s, and %d more that named no key at "
					"all (the first: \"%s\"): the job retries the call inside its handler without the key the "
					"first request carried, so the provider cannot tell them for one operation and makes the %s "
					"again; send the same key with every request of the operation",
					s->keys[0], st.requests, st.requests == 1 ? "" : "s", after, none, first, eff);
	return true;
}

/* the job completed after its call failed, the handler raising (no handled point) */
static void
completed_after_failure(signoff_state *s, const char *what)
{
	const char *eff = effect_name_of(s);

	case_defect(s, "the %s call failed, the provider %s, and the handler raised, yet the operation of %s was "
				"completed without a handled point: the job completes the operation even when its call failed (a "
				"completion in an ensure or finally block), so the %s counts as made though %s, and no "
				"redelivery makes it; complete only after the call succeeded", eff, what, s->keys[0], eff,
				strstr(what, "no answer") ? "the job cannot know it was" : "it was not");
}

/*
 * 14 and 18: the provider refuses for now (503 / 451), or cannot be
 * reached (nothing listens): the effect certainly did not happen, so the
 * job must fail the delivery as a known failure (the helper releases the
 * claim, the queue retries); then the next delivery sends once.
 */
static void
refused_for_now(signoff_state *s, bool unreachable)
{
	const char *what = unreachable ? "could not be reached (connection refused)" :
		s->job->effect == EFFECT_HTTP ? "refused it for now (HTTP 503)" : "refused it for now (SMTP 451)";
	int			di;
	bool		in_process_retry = false;

	if (unreachable ? !effect_listen(false) : !effect_set_fault(s->keys[0], FAULT_TRANSIENT, 1, 0))
	{
		endpoint_gone(s);
		goto out;
	}
	if (!start_workers(s, 1) || !enqueue(s, 0, JF_ENQUEUE) ||
		(di = first_delivery(s, unreachable ? "no connection" : "refused")) < 0)
		goto out;
	switch (wait_fault_over(s, di))
	{
		case FO_RELEASED:
			copy_str(s->d[di].after, sizeof(s->d[di].after), "released");
			case_note(s->cr, "The provider %s; the job failed the delivery as a known failure: its claim was released.", what);
			if (unreachable)
				effect_listen(true);
			{
				int			before = count_deliveries(s, 0);

				if (enqueue(s, 0, JF_ENQUEUE) && delivery_that_runs(s, before + 1, NULL) >= 0)
					settle(s);
			}
			break;
		case FO_HANDLED:
			{
				effect_stats st;

				settle(s);
				if (two_requests(s, unreachable ? "(the first could not connect)" : "(the first refused for now)"))
					break;
				if (effect_stats_of(s->keys[0], &st) && st.effects >= 1)
				{
					/*
					 * The job tried again inside its own delivery, under its
					 * claim, and the call went through: as good as the queue's
					 * retry (observe() still counts the effects).
					 */
					in_process_retry = true;
					case_note(s->cr, "The provider %s; the job tried again itself, under its claim, and the %s went "
							  "through (%d request%s): completed in the same delivery.", what, effect_name_of(s),
							  st.requests, st.requests == 1 ? "" : "s");
				}
				else
					case_defect(s, "the provider %s, yet the job completed the operation: it completed after the provider %s, "
								"so the %s was never made and never will be (the job swallowed the error); let the failure "
								"fail the delivery as a known failure (the helper's KnownFailure: the claim is released and "
								"the message retried)", what, unreachable ? "could not be reached" : "refused",
								effect_name_of(s));
			}
			break;
		case FO_COMPLETED:
			completed_after_failure(s, what);
			break;
		case FO_ENDED:
			case_defect(s, "the provider %s, so the %s certainly was not made, yet the job ended the operation "
						"(completed without its handler returning, with PermanentFailure): a refusal for now is not "
						"one for good, and the %s will never be made; raise the helper's KnownFailure, so that the "
						"claim is released and the message retried", what, effect_name_of(s), effect_name_of(s));
			break;
		case FO_LEFT:
			copy_str(s->d[di].after, sizeof(s->d[di].after), "left to its lease");
			case_defect(s, "the provider %s, so the %s certainly was not made, yet the job left its claim to its lease "
						"instead of releasing it: it raised an error the helper cannot tell from an unknown outcome, so "
						"the policy (%s) decides now (hold: a person, skip: never made); raise the helper's KnownFailure "
						"for a refusal", what, effect_name_of(s), policy_names[s->policy]);
			break;
		case FO_PENDING:
			break;
	}
out:
	if (unreachable)
		effect_listen(true);
	stop_workers(s);
	observe(s, NULL);
	if (in_process_retry && s->cr->obs_emails == 1)
	{
		/* one delivery did it all: the record and verdicts of that path */
		copy_str(s->cr->exp_record, CELL, "completed #1");
		copy_str(s->cr->exp_verdicts, CELL, unreachable ? "run (no connection)" : "run (refused)");
		copy_str(s->cr->expected_text, sizeof(s->cr->expected_text),
				 "tried again in its delivery, under its claim; sent once");
		case_note(s->cr, "Expected then: completed #1, the one delivery's verdict.");
	}
}

static void
sc_14(signoff_state *s)
{
	refused_for_now(s, false);
}

static void
sc_18(signoff_state *s)
{
	refused_for_now(s, true);
}

/*
 * 15: the provider made the effect and never answers. The job's client
 * must give up (its timeout) and, not knowing, leave the claim to its
 * lease; after the lease the message again: the policy decides, as in 6.
 */
static void
sc_15(signoff_state *s)
{
	effect_stats st;
	double		t0;
	int			di;
	bool		gave_up = false;

	if (!effect_set_fault(s->keys[0], FAULT_HANG, 1, 0))
	{
		endpoint_gone(s);
		goto out;
	}
	if (!start_workers(s, 1) || !enqueue(s, 0, JF_ENQUEUE) || (di = first_delivery(s, "no answer")) < 0)
		goto out;
	t0 = now_seconds();
	for (;;)
	{
		if (!effect_stats_of(s->keys[0], &st))
		{
			endpoint_gone(s);
			goto out;
		}
		if (st.closed_after >= 0)
		{
			gave_up = true;
			break;
		}
		if (st.requests == 0 && s->d[di].handled)
		{
			case_fail(s->cr, "the handler returned without a request to the run's %s endpoint: the job does not send "
					  "its %s to IDEMPOTENCY_SIGNOFF_%s", effect_kind_names[s->job->effect], effect_name_of(s),
					  s->job->effect == EFFECT_HTTP ? "HTTP" : "SMTP");
			goto out;
		}
		if (matrix_interrupted || now_seconds() - t0 > s->job->timeout_s)
			break;
		pump(s, POLL_MS);
	}
	if (matrix_interrupted)
		goto out;
	if (!gave_up)
	{
		case_defect(s, "the %s call hung %.0f s with no answer and the job never gave up: no client timeout. A provider "
					"that accepts and never answers holds the worker%s for ever; give the call a timeout: in "
					"production the provider's slowest answer, with the heartbeat keeping the claim while the call "
					"waits (here shorter than the job file's timeout, %g s)", effect_name_of(s),
					now_seconds() - t0, s->d[di].heartbeat ? " and, through its heartbeat, the claim" : "",
					s->job->timeout_s);
		effect_release();
	}
	else
		case_note(s->cr, "The endpoint made the %s and never answered; the job's client gave up after %.1f s.",
				  effect_name_of(s), st.closed_after);
	switch (wait_fault_over(s, di))
	{
		case FO_LEFT:
			case_note(s->cr, "The job left its claim to its lease (it cannot know whether the %s was made); stale_claims() "
					  "lists it; then the message again.", effect_name_of(s));
			again_after_lease(s, di);
			break;
		case FO_RELEASED:
			copy_str(s->d[di].after, sizeof(s->d[di].after), "released");
			case_defect(s, "the job released the claim after a call that may have reached the provider (no answer "
						"within its timeout): the %s was made, and every next delivery makes it again, under any "
						"policy; raise an error that is not a known failure, so that the claim waits for its lease "
						"and the policy decides", effect_name_of(s));
			if (enqueue(s, 0, JF_ENQUEUE))
				settle(s);
			break;
		case FO_ENDED:
			case_defect(s, "the %s call got no answer, yet the job ended the operation (completed without its handler "
						"returning, with PermanentFailure): it cannot know whether the provider made the %s; let the "
						"error raise (not as a known or a permanent failure), so that the claim waits for its lease "
						"and the policy decides", effect_name_of(s), effect_name_of(s));
			break;
		case FO_HANDLED:
			settle(s);
			if (!two_requests(s, "(the first got no answer)"))
				case_defect(s, "the %s call got no answer, yet the job completed the operation as if it had succeeded: "
							"it cannot know whether the provider made the %s; let the error raise (not as a known "
							"failure), so that the claim waits for its lease and the policy decides",
							effect_name_of(s), effect_name_of(s));
			break;
		case FO_COMPLETED:
			completed_after_failure(s, "gave no answer within the job's timeout");
			break;
		case FO_PENDING:
			break;
	}
out:
	effect_release();
	stop_workers(s);
	observe(s, NULL);
}

/* case 16's rule: at most this many requests of a key refused for good */
#define PERMANENT_MAX_REQUESTS 2

static void
too_many_requests(signoff_state *s, case_result *cr, const effect_stats *st, double seconds)
{
	case_result *was = s->cr;

	s->cr = cr;					/* the drain's check names its case's defect too */
	case_defect(s, "the job retried a permanent refusal: %d requests in %.0f s, each refused for good (%s); a refusal "
				"that will not change must end the operation (the helper's PermanentFailure: completed with the "
				"refusal as its result, the delivery failed as the queue fails a job), not be retried",
				st->requests, seconds, s->job->effect == EFFECT_HTTP ? "HTTP 422" : "SMTP 550");
	s->cr = was;
}

/*
 * 16: the provider refuses for good: no effect, the job ends the
 * operation, and a bounded number of requests (no retry storm), also in
 * the drain (drain_checks()).
 */
static void
sc_16(signoff_state *s)
{
	effect_stats st;
	double		t0;
	int			di;
	fault_outcome o;

	if (!effect_set_fault(s->keys[0], FAULT_PERMANENT, -1, 0))
	{
		endpoint_gone(s);
		goto out;
	}
	t0 = now_seconds();
	if (!start_workers(s, 1) || !enqueue(s, 0, JF_ENQUEUE) || (di = first_delivery(s, "refused for good")) < 0)
		goto out;
	o = wait_fault_over(s, di);
	if (o == FO_HANDLED)
		settle(s);
	if (o == FO_COMPLETED)
		o = FO_ENDED;			/* completed, the handler raising, no point ended: ended all the same */
	/* a retrying job shows itself within a few of its retry delays */
	{
		double		t1 = now_seconds();

		while (!matrix_interrupted && now_seconds() - t1 < 2 * s->job->lease_s)
			pump(s, POLL_MS);
	}
	if (!effect_stats_of(s->keys[0], &st))
	{
		endpoint_gone(s);
		goto out;
	}
	if (st.requests > PERMANENT_MAX_REQUESTS)
		too_many_requests(s, s->cr, &st, now_seconds() - t0);
	else if (o == FO_RELEASED)
	{
		copy_str(s->cr->exp_record, CELL, "released #1");
		copy_str(s->cr->ending, sizeof(s->cr->ending), "released #1, the message dropped");
		case_note(s->cr, "The job released the claim after the refusal for good and did not retry it (%d request%s): "
				  "a known failure, dropped; the record expected is released #1.", st.requests,
				  st.requests == 1 ? "" : "s");
	}
	else if (o == FO_LEFT)
		case_defect(s, "the provider refused the %s for good, yet the job left its claim to its lease: the policy "
					"(%s) decides now, and under retry every takeover asks again; end the operation (the helper's "
					"PermanentFailure: completed with the refusal as its result, the delivery failed as the queue "
					"fails a job)", effect_name_of(s), policy_names[s->policy]);
	else if (o == FO_ENDED && s->d[di].ended[0])
	{
		snprintf(s->cr->ending, sizeof(s->cr->ending), "ended with %s", s->d[di].ended);
		case_note(s->cr, "The provider refused for good; the job ended the operation after %d request%s: %s.",
				  st.requests, st.requests == 1 ? "" : "s", s->cr->ending);
	}
	else if (o == FO_ENDED)
	{
		snprintf(s->cr->ending, sizeof(s->cr->ending), "completed #%d without its handler returning (the helper "
				 "did not say how the delivery ended: no point ended)", s->d[di].attempt);
		case_note(s->cr, "The provider refused for good; the job ended the operation after %d request%s: %s.",
				  st.requests, st.requests == 1 ? "" : "s", s->cr->ending);
	}
	else if (o == FO_HANDLED)
	{
		snprintf(s->cr->ending, sizeof(s->cr->ending), "completed #%d with the refusal as its result: the handler "
				 "returned, so the delivery succeeded", s->d[di].attempt);
		case_note(s->cr, "The provider refused for good; the job completed the operation (the refusal as its result) "
				  "after %d request%s: the handler returned, so the delivery succeeded.", st.requests,
				  st.requests == 1 ? "" : "s");
	}
out:
	stop_workers(s);
	observe(s, NULL);
}

/* after the drain: a case-16 key asked again and again (a queue's slower retries) */
static void
drain_checks(signoff_state *s, policy_result *pr, double seconds)
{
	int			c;

	if (s->job->effect == EFFECT_NONE)
		return;
	for (c = 0; c < pr->ncases; c++)
	{
		case_result *cr = &pr->cases[c];
		effect_stats st;

		if (strcmp(cr->id, "16") != 0 || !cr->ran || s->case_nkeys[c] == 0 ||
			!effect_stats_of(s->case_keys[c][0], &st))
			continue;
		if (st.requests > PERMANENT_MAX_REQUESTS && cr->checks_ok)
		{
			too_many_requests(s, cr, &st, seconds);
			case_finish(cr);
		}
	}
}

/*
 * 17, when the job's client gave up before the slow provider answered: an
 * unknown outcome (the provider made the effect), which the job must treat
 * as case 15's (leave the claim to its lease) and the policy then decides,
 * as case 15 gives: lookup asks the provider and finds the effect (passes);
 * retry makes it again, the duplicate it accepts (passes, said); hold pages
 * a person and skip records the operation skipped whether or not the
 * effect was made (both fail: a client timeout shorter than the provider's
 * slowest answer is the job's defect under them).
 */
static void
gave_up_slow(signoff_state *s, int di, double waited)
{
	static const char *const text[N_POLICIES] = {
		"held for a person after the lease: every slow answer pages one",
		"sent again after the lease: a duplicate",
		"skipped for good, though the {effect} was made",
		"looked up: found, not sent again",
	};
	case_result *cr = s->cr;
	const case_expect *e15 = &case_by_id("15")->expect[s->pr ? s->pr->checked_as : s->policy];
	policy_t	as = s->pr ? s->pr->checked_as : s->policy;
	const char *eff = effect_name_of(s);
	const char *second = strstr(e15->verdicts, ", ");
	double		slow = 2 * s->job->lease_s;
	copy_str(s->d[di].mark, sizeof(s->d[di].mark), "gave up");
	case_note(cr, "The endpoint made the %s and held its answer for two leases (%g s); the job's client gave up after "
			  "%.1f s: an unknown outcome, which the policy decides, as in case 15.", eff, slow, waited);
	/* case 15's expectations under the policy, and its words */
	cr->exp_emails = e15->effects;
	copy_str(cr->exp_record, CELL, e15->record);
	snprintf(cr->exp_verdicts, CELL, "run (gave up), %s", second ? second + 2 : "");
	fill_effect(s, cr->expected_text, sizeof(cr->expected_text), "", text[as]);
	switch (wait_fault_over(s, di))
	{
		case FO_LEFT:
			case_note(cr, "The job left its claim to its lease; then the message again.");
			again_after_lease(s, di);
			break;
		case FO_RELEASED:
			copy_str(s->d[di].after, sizeof(s->d[di].after), "released");
			case_defect(s, "the job released the claim after its client gave up on a %s call that may have "
						"reached the provider (here it had): every next delivery makes the %s again, under any "
						"policy; raise an error that is not a known failure, so that the claim waits for its "
						"lease and the policy decides", eff, eff);
			if (enqueue(s, 0, JF_ENQUEUE))
				settle(s);
			return;
		case FO_HANDLED:
			case_defect(s, "the job's client gave up on the %s call, yet the job completed the operation as if it "
						"had succeeded: it cannot know whether the provider made the %s; let the error raise (not "
						"as a known failure), so that the claim waits for its lease and the policy decides", eff, eff);
			settle(s);
			return;
		case FO_COMPLETED:
			completed_after_failure(s, "gave no answer before the job's client gave up");
			return;
		case FO_ENDED:
			case_defect(s, "the job's client gave up on the %s call, yet the job ended the operation (completed "
						"without its handler returning, with PermanentFailure): it cannot know whether the provider "
						"made the %s; let the error raise (not as a known or a permanent failure), so that the claim "
						"waits for its lease and the policy decides", eff, eff);
			return;
		case FO_PENDING:
			return;
	}
	if (as == POLICY_HOLD || as == POLICY_SKIP)
		case_defect(s, "the job's client gave up on the %s call after %.1f s, before the provider answered (in %g s "
					"here): an unknown outcome, which under %s %s; size the client's timeout to the provider's "
					"slowest answer in production (not to the lease), and let the heartbeat keep the claim while "
					"the call waits, or choose lookup, which asks the provider after a timeout",
					eff, waited, slow, policy_names[as],
					as == POLICY_HOLD ? "pages a person for every answer slower than the timeout, though the "
					"provider made it" : "skips the operation for good whether or not the provider made it (a "
					"call that never reached it is lost)");
	else
		case_note(cr, "%s The client's timeout should still be sized to the provider's slowest answer in "
				  "production, with the heartbeat keeping the claim while the call waits.",
				  as == POLICY_RETRY ? "Under retry the takeover made it again: the duplicate the policy accepts." :
				  "Under lookup the takeover asked the provider, found it, and did not make it again: what the "
				  "policy is for.");
}

/*
 * 17: a slow provider, answering after two leases: the heartbeat keeps
 * the claim, so the message again meanwhile is in_progress; one effect. A
 * client that gives up first is judged by the policy (gave_up_slow()).
 */
static void
sc_17(signoff_state *s)
{
	effect_stats st;
	double		t0;
	int			di;
	bool		waited = false;

	/*
	 * Slow: answered after two leases, but not before the message sent
	 * again meanwhile was judged (an enqueue under load can take seconds):
	 * the endpoint holds it (for at most the timeout) until told.
	 */
	if (!effect_set_fault(s->keys[0], FAULT_SLOW, 1, (int) ((2 * s->job->lease_s + s->job->timeout_s) * 1000)))
	{
		endpoint_gone(s);
		goto out;
	}
	if (!start_workers(s, 2) || !enqueue(s, 0, JF_ENQUEUE) || (di = first_delivery(s, "slow")) < 0)
		goto out;
	t0 = now_seconds();
	for (;;)
	{
		if (!effect_stats_of(s->keys[0], &st))
		{
			endpoint_gone(s);
			goto out;
		}
		if (st.closed_after >= 0)
			break;
		if (st.open > 0 && st.open_for > s->job->lease_s + 0.3)
		{
			waited = true;
			break;
		}
		if (matrix_interrupted || now_seconds() - t0 > s->job->timeout_s)
		{
			case_fail(s->cr, "no request of %s reached the run's %s endpoint within %g s", s->keys[0],
					  effect_kind_names[s->job->effect], s->job->timeout_s);
			break;
		}
		pump(s, POLL_MS);
	}
	if (waited)
	{
		if (!s->d[di].heartbeat)
			case_defect(s, "the helper reported heartbeat false: while the %s call waits past the lease the claim "
						"looks dead and may be taken over; give the handler a heartbeat", effect_name_of(s));
		case_note(s->cr, "The endpoint held the %s call for %.1f s (longer than the lease); then the message again.",
				  effect_name_of(s), st.open_for);
		if (enqueue(s, 0, JF_ENQUEUE))
			wait_nth(s, 0, 2);
		/* two leases at least, then the answer */
		while (!matrix_interrupted && effect_stats_of(s->keys[0], &st) && st.open > 0 &&
			   st.open_for < 2 * s->job->lease_s)
			pump(s, POLL_MS);
	}
	if (effect_stats_of(s->keys[0], &st) && st.closed_after >= 0)
	{
		gave_up_slow(s, di, st.closed_after);
		goto out;
	}
	effect_answer(s->keys[0]);
	settle(s);
out:
	stop_workers(s);
	observe(s, NULL);
}

/* ---------------------------------------------------------------------
 * 19: the storm
 * --------------------------------------------------------------------- */

/* the killed claim's lease ran out (stale), or the policy already acted on it */
static bool
pred_lease_over(signoff_state *s, const void *arg)
{
	int			ki = *(const int *) arg;
	char		status[32];
	int			attempt = 0;

	if (!record_row(s, s->opkey[ki], status, sizeof(status), &attempt))
		return false;
	if (strcmp(status, "claimed") != 0 || attempt > 1)
		return true;
	return stale_listed(s->ctx, s->cr, s->job_type, s->opkey[ki]) == 1;
}

/* a key's record as the policy gives it */
typedef struct record_want
{
	int			ki;
	const char *record;
} record_want;

static bool
pred_record_as(signoff_state *s, const void *arg)
{
	const record_want *w = arg;
	char		rec[CELL];

	record_text_of(s->ctx, s->cr, s->job_type, s->opkey[w->ki], rec, sizeof(rec), NULL, 0);
	/* "?": the record could not be read (noted once): no use waiting */
	return strcmp(rec, w->record) == 0 || strcmp(rec, "?") == 0;
}

#define STORM_KEYS 6
#define STORM_DELIVERIES 3
#define STORM_WORKERS 3
#define STORM_KILLS 2

/*
 * 19: what production does at once. STORM_KEYS keys, each enqueued
 * STORM_DELIVERIES times, to STORM_WORKERS workers together; two of the
 * keys, picked at random (from the run's id and the policy), have their
 * worker killed, one at claimed and one at handled (so that both outcomes
 * of a death are in every storm), and after the lease the message again. Then every key is counted, as Jepsen's queue checker counts: a
 * key killed at claimed must give what case 5 gives under the policy, one
 * killed at handled what case 6 gives, every other exactly one effect and
 * completed #1; fewer is lost, more is duplicated beyond the policy. It is
 * what catches a job that reads its own state before the claim, or shares
 * it between keys.
 */
/* what the policy gives a storm key killed at point (NULL: not killed) */
static const case_expect *
storm_expect(signoff_state *s, const char *point)
{
	if (point == NULL)
		return NULL;
	return &case_by_id(strcmp(point, "claimed") == 0 ? "5" : "6")->expect[s->policy];
}

static void
sc_19(signoff_state *s)
{
	case_result *cr = s->cr;
	const char *point[STORM_KEYS];
	unsigned	seed = 2166136261u;
	const char *p;
	int			kills[STORM_KILLS];
	int			k,
				d,
				i,
				total = 0,
				expected = 0,
				lost = 0,
				dup = 0,
				wrong = 0;
	char		items[CELL] = "";

	/* the seed: the run and the policy, so that a run can be told again */
	for (p = s->ctx->run_id; *p; p++)
		seed = (seed ^ (unsigned char) *p) * 16777619u;
	seed ^= (unsigned) s->policy * 2654435761u;
	for (k = 0; k < STORM_KEYS; k++)
		point[k] = NULL;
	for (i = 0; i < STORM_KILLS; i++)
	{
		seed = seed * 1103515245u + 12345u;
		k = (int) ((seed >> 8) % STORM_KEYS);
		while (point[k])
			k = (k + 1) % STORM_KEYS;
		/* one death before the effect, one after it: both outcomes each time */
		point[k] = i == 0 ? "claimed" : "handled";
		kills[i] = k;
		arm_point(s, k, point[k]);
	}
	case_note(cr, "%d keys, each enqueued %d times, %d workers at once; killed: %s at %s, %s at %s.",
			  STORM_KEYS, STORM_DELIVERIES, STORM_WORKERS, s->keys[kills[0]], point[kills[0]],
			  s->keys[kills[1]], point[kills[1]]);
	progress(s->ctx, "%s case 19: the storm, %d keys x %d deliveries", policy_names[s->policy],
			 STORM_KEYS, STORM_DELIVERIES);
	if (!start_workers(s, STORM_WORKERS))
		goto out;
	for (d = 0; d < STORM_DELIVERIES; d++)
		for (k = 0; k < STORM_KEYS; k++)
			if (!enqueue(s, k, JF_ENQUEUE))
				goto out;
	for (i = 0; i < STORM_KILLS; i++)
	{
		exch	   *x = wait_held(s, kills[i], point[kills[i]]);

		if (x == NULL || !kill_at(s, x, "in the storm") || !start_workers(s, 1))
			goto out;
	}
	/*
	 * The killed keys: once the lease ran out, the message again (as cases
	 * 5 and 6). Their other copies may be there first (a helper that
	 * retries in_progress after the lease): then the policy already
	 * decided, and this copy is answered as a duplicate.
	 */
	for (i = 0; i < STORM_KILLS; i++)
	{
		if (wait_for(s, pred_lease_over, &kills[i], false, s->job->lease_s + s->job->timeout_s) != WAIT_OK)
		{
			case_fail(s->cr, "the claim of %s, whose worker was killed, was neither listed by stale_claims() nor "
					  "taken further within the lease and %g s", s->keys[kills[i]], s->job->timeout_s);
			goto out;
		}
		if (!enqueue(s, kills[i], JF_ENQUEUE))
			goto out;
	}
	if (!settle(s))
		goto out;

	/*
	 * Every copy counted above may have come (a helper's own in_progress
	 * retry is a delivery too) before a killed key's takeover did: wait,
	 * within the timeout, for the record the policy gives each killed key,
	 * then for the runs still in flight, so that the case is judged on what
	 * the database came to hold, not on when the runner looked. A job that
	 * never gets there is judged below, as it stands after the timeout.
	 */
	for (i = 0; i < STORM_KILLS; i++)
	{
		record_want w;

		w.ki = kills[i];
		w.record = storm_expect(s, point[kills[i]])->record;
		if (wait_for(s, pred_record_as, &w, true, s->job->timeout_s) != WAIT_OK)
			break;
	}
	settle(s);
out:
	stop_workers(s);
	for (k = 0; k < s->nkeys; k++)
	{
		const case_expect *e = storm_expect(s, point[k]);
		int			want = e ? e->effects : 1;
		const char *want_rec = e ? e->record : "completed #1";
		int			n = effects_count(s, s->keys[k], true);
		char		rec[CELL];

		record_text_of(s->ctx, cr, s->job_type, s->opkey[k], rec, sizeof(rec), NULL, 0);
		expected += want;
		if (n < 0)
		{
			total = -1;
			continue;
		}
		if (total >= 0)
			total += n;
		if (n < want)
		{
			lost++;
			case_fail(cr, "%s lost %d %s%s: %d, where the policy gives %d%s%s%s", s->keys[k], want - n,
					  effect_name_of(s), want - n == 1 ? "" : "s", n, want, point[k] ? " (killed at " : "",
					  point[k] ? point[k] : "", point[k] ? ")" : "");
		}
		else if (n > want)
		{
			dup++;
			case_fail(cr, "%s has %d %s%s beyond the policy: %d, where it gives %d%s%s%s", s->keys[k], n - want,
					  effect_name_of(s), n - want == 1 ? "" : "s", n, want,
					  point[k] ? " (killed at " : "", point[k] ? point[k] : "", point[k] ? ")" : "");
		}
		if (strcmp(rec, want_rec) != 0)
		{
			wrong++;
			case_fail(cr, "the record of %s is %s, where the policy gives %s", s->keys[k], rec, want_rec);
		}
	}
	check_unmatched(s);		/* unexpected requests: named no key of the run */
	cr->exp_emails = expected;
	cr->obs_emails = total;
	snprintf(cr->exp_record, CELL, "%d keys as the policy gives", STORM_KEYS);
	if (wrong)
		snprintf(cr->obs_record, CELL, "%d of %d keys otherwise", wrong, STORM_KEYS);
	else
		copy_str(cr->obs_record, CELL, cr->exp_record);
	copy_str(cr->exp_verdicts, CELL, "none lost, none duplicated");
	if (lost)
	{
		snprintf(items, sizeof(items), "%d lost", lost);
	}
	if (dup)
	{
		char		t[40];

		snprintf(t, sizeof(t), "%d duplicated", dup);
		list_append(items, sizeof(items), t);
	}
	copy_str(cr->obs_verdicts, CELL, items[0] ? items : cr->exp_verdicts);
}

/* ---------------------------------------------------------------------
 * 20: several keys in one receive (a batch handler)
 * --------------------------------------------------------------------- */

/* the same items, in any order (a receive need not keep the queue's order) */
static bool
same_items(const char *a, const char *b)
{
	char		x[CELL],
				y[CELL];
	char	   *p,
			   *save = NULL;
	int			nx = 0,
				ny = 0;

	copy_str(x, sizeof(x), a);
	copy_str(y, sizeof(y), b);
	for (p = strtok_r(x, ",", &save); p; p = strtok_r(NULL, ",", &save))
	{
		char	   *q = strstr(y, trim(p));

		nx++;
		if (q == NULL)
			return false;
		memset(q, '#', strlen(trim(p)));	/* used */
	}
	save = NULL;
	for (p = strtok_r(y, ",", &save); p; p = strtok_r(NULL, ",", &save))
		ny++;
	return nx == ny;
}

/*
 * 20: key B completes first; then, with no worker running, A (fresh), B
 * with other arguments, B again and C are enqueued, and one worker started,
 * so that a batch handler receives them together. `fail` at C's claimed
 * (its work fails: released), then C's message again. Each key is judged
 * on its own; whether they came in one receive (one worker, every point
 * before the first handled) is said.
 */
static void
sc_20(signoff_state *s)
{
	case_result *cr = s->cr;
	exch	   *x;
	int			i,
				first,
				end,
				c = 2,
				n = 0;
	long		pid = 0;
	bool		one_worker = true;
	double		last_at = 0,
				first_handled = 0;

	if (!start_workers(s, 1) || !enqueue(s, 1, JF_ENQUEUE) || !settle(s))
		goto out;
	stop_workers_now(s);		/* no worker runs while the receive fills */
	first = s->nd;
	arm_point(s, c, "claimed");
	if (!enqueue(s, 0, JF_ENQUEUE) || !enqueue(s, 1, JF_ENQUEUE_OTHER) || !enqueue(s, 1, JF_ENQUEUE) ||
		!enqueue(s, c, JF_ENQUEUE) || !start_workers(s, 1) || (x = wait_held(s, c, "claimed")) == NULL)
		goto out;
	i = x->delivery;
	if (i >= 0)
		s->d[i].failed = true;
	answer(s, x, "fail");
	if (wait_for(s, pred_released, &c, true, s->job->timeout_s) == WAIT_OK)
	{
		if (i >= 0)
			copy_str(s->d[i].after, sizeof(s->d[i].after), "released");
	}
	else
		case_fail(cr, "answered fail at %s's claimed, but its record was not released within %g s",
				  s->keys[c], s->job->timeout_s);
	if (!settle(s))
		goto out;
	end = s->nd;
	for (i = first; i < end; i++)
	{
		const delivery *d = &s->d[i];

		if (d->stray)
			continue;
		n++;
		if (pid == 0)
			pid = d->pid;
		else if (d->pid != pid)
			one_worker = false;
		if (d->at > last_at)
			last_at = d->at;
		if (d->handled_at > 0 && (first_handled == 0 || d->handled_at < first_handled))
			first_handled = d->handled_at;
	}
	/*
	 * A claimed point comes when a key's handler is about to run, so a
	 * batch handler's later keys reach it after earlier keys' handled:
	 * the points cannot prove one receive. The run makes one possible (the
	 * messages wait for the one worker) and says what it saw.
	 */
	if (n < 4)
		case_fail(cr, "of the 4 messages enqueued together only %d reached a point", n);
	else
		case_note(cr, "The 4 messages were enqueued while no worker ran; one worker (pid %ld) took them%s, %s.",
				  pid, one_worker ? "" : " (and another)",
				  first_handled == 0 || last_at <= first_handled ?
				  "every point before the first handled" :
				  "their claimed points between the handlers, as a batch handler's come");
	if (enqueue(s, c, JF_ENQUEUE))
		settle(s);
out:
	stop_workers(s);
	observe(s, NULL);
	if (strcmp(cr->obs_verdicts, cr->exp_verdicts) != 0 && same_items(cr->obs_verdicts, cr->exp_verdicts))
	{
		case_note(cr, "The verdicts came in another order (%s): a receive need not keep the queue's order.",
				  cr->obs_verdicts);
		copy_str(cr->obs_verdicts, CELL, cr->exp_verdicts);
	}
}

/*
 * The operation key of the case's key ki, where the job file gives it:
 * key (a template with {key}) or key_command (its output); else the run's
 * key itself, or one that contains it, learned at its first point. false:
 * key_command failed (the case fails, noted).
 */
static bool
operation_key(signoff_state *s, int ki)
{
	const char *tmpl = s->job->value[JF_KEY];

	if (tmpl)
	{
		const char *p = strstr(tmpl, "{key}");
		char		out[KEYSZ];

		snprintf(out, sizeof(out), "%.*s%s%s", (int) (p - tmpl), tmpl, s->keys[ki], p + 5);
		copy_str(s->opkey[ki], KEYSZ, out);
		s->opkey_known[ki] = true;
		know_key(s, out);
	}
	else if (s->job->value[JF_KEY_COMMAND])
	{
		StringInfoData out;
		char	   *k;

		initStringInfo(&out);
		if (run_command(s, JF_KEY_COMMAND, s->keys[ki], false, &out) != 0)
		{
			pfree(out.data);
			return false;
		}
		k = trim(out.data ? out.data : (char *) "");
		if (*k == '\0' || strchr(k, '\n'))
		{
			case_fail(s->cr, "key_command printed %s for %s: one line, the operation key, was expected",
					  *k ? "more than one line" : "nothing", s->keys[ki]);
			pfree(out.data);
			return false;
		}
		copy_str(s->opkey[ki], KEYSZ, k);
		s->opkey_known[ki] = true;
		know_key(s, k);
		pfree(out.data);
	}
	return true;
}

/* does total match what the case settles as, once its lease ran out (7a: 5)? */
static bool
settled(const case_result *cr, policy_t as, int total)
{
	const case_spec *c = case_by_id(cr->id);
	const case_spec *after = c && c->settles_as ? case_by_id(c->settles_as) : NULL;

	return after && after->expect[as].effects == total;
}

/*
 * After a policy's cases: a worker keeps running until no delivery of any
 * key has come for the job file's drain seconds (the queue's redeliveries,
 * the job's own retries and scheduled copies arrive meanwhile; each is
 * noted in its own case), then every case's effects are counted again and
 * the case judged on the final count: an effect a job made after its case
 * ended fails that case.
 */
static void
drain(signoff_state *s, policy_result *pr)
{
	case_result notes;
	double		t0 = now_seconds();
	int			c,
				k;

	if (s->unmappable || s->not_armed || s->stopped[0] || s->claim_failed || pr->ncases == 0)
		return;
	memset(&notes, 0, sizeof(notes));
	initStringInfo(&notes.notes);
	notes.id = "drain";
	notes.checks_ok = true;
	s->cr = &notes;
	s->case_id = "drain";
	s->nkeys = 0;
	s->nworkers = 0;
	s->took_kept = false;
	progress(s->ctx, "%s: draining (%g s without a delivery)", policy_names[s->policy], s->job->drain_s);
	if (start_workers(s, 1))
	{
		/*
		 * The quiet time counts from when the worker can take a message:
		 * its start plus the longest any worker of the run took from its
		 * start to its first point (a Node.js worker under load: seconds).
		 */
		s->last_delivery = t0 + s->startup_s;
		while (!matrix_interrupted && now_seconds() - s->last_delivery < s->job->drain_s &&
			   now_seconds() - t0 < s->startup_s + s->job->drain_s + s->job->timeout_s)
			pump(s, POLL_MS);
	}
	stop_workers_now(s);
	for (k = 0; k < s->nworkers; k++)
		forget_proc(s->workers[k]);
	s->nworkers = 0;
	pfree(notes.notes.data);
	for (c = 0; c < pr->ncases; c++)
	{
		case_result *cr = &pr->cases[c];
		int			total = 0;

		cr->late = s->late[c];
		if (!cr->ran || cr->obs_emails < 0 || s->case_nkeys[c] == 0)
			continue;
		s->cr = cr;
		for (k = 0; k < s->case_nkeys[c] && total >= 0; k++)
		{
			int			n = effects_count(s, s->case_keys[c][k], false);

			total = n < 0 ? -1 : total + n;
		}
		cr->after_drain = total;
		if (total >= 0 && total != cr->obs_emails && settled(cr, pr->checked_as, total))
		{
			case_note(cr, "After the policy's cases the run drained (%.1f s, until no delivery came for %g s): the "
					  "lease ran out, the message came again and the policy took over, so the %ss of its key are "
					  "now %d, as case %s gives.", now_seconds() - t0, s->job->drain_s,
					  s->job->value[JF_EFFECT_NAME] ? s->job->value[JF_EFFECT_NAME] : "effect", total,
					  case_by_id(cr->id)->settles_as);
		}
		else if (total >= 0 && total != cr->obs_emails)
		{
			case_note(cr, "After the policy's cases the run drained (%.1f s, until no delivery came for %g s): the %s%s "
					  "now %d, not the %d counted when the case ended: the job made an effect after its case "
					  "(its own retry or scheduled copy, or a handler that returned before its effect landed)%s.",
					  now_seconds() - t0, s->job->drain_s,
					  s->job->value[JF_EFFECT_NAME] ? s->job->value[JF_EFFECT_NAME] : "effect",
					  s->case_nkeys[c] > 1 ? "s of its keys are" : "s of its key are", total, cr->obs_emails,
					  s->late[c] ? "; its late deliveries are noted above" : "");
			cr->obs_emails = total;
			case_finish(cr);
		}
	}
	drain_checks(s, pr, now_seconds() - t0);
	s->cr = NULL;
}

/*
 * The job file's cleanup command, after the last case: it removes what the
 * run left in the user's queue. How it ended is printed and goes into the
 * report's settings; a failure does not change the run's exit status (the
 * cases were judged before).
 */
static void
run_cleanup(signoff_state *s)
{
	case_result notes;
	int			status;

	memset(&notes, 0, sizeof(notes));
	initStringInfo(&notes.notes);
	notes.id = "cleanup";
	s->cr = &notes;
	s->case_id = "cleanup";
	status = run_command(s, JF_CLEANUP, "", false, NULL);
	s->cr = NULL;
	if (status == 0)
		snprintf(s->ctx->cleanup_said, sizeof(s->ctx->cleanup_said), "`%s` exited 0",
				 s->job->value[JF_CLEANUP]);
	else
		snprintf(s->ctx->cleanup_said, sizeof(s->ctx->cleanup_said), "%.590s",
				 one_line(notes.notes.data));	/* "FAILED: the cleanup command ..." */
	printf("\ncleanup: %s\n", s->ctx->cleanup_said);
	pfree(notes.notes.data);
}

/*
 * The reference run's job type for case c's try: <prefix>_<policy>_<case>,
 * and _try<N> after the first, so that each try's seed keys (ORD-1001, ...)
 * are new keys. Registered; false with err set when it cannot be.
 */
static bool
case_job_type(signoff_state *s, const case_spec *c, int tries, char *err, size_t errsz)
{
	int			n = snprintf(s->job_type, sizeof(s->job_type), "%s_%s_%s", s->ctx->prefix,
							 policy_names[s->policy], c->id);

	if (tries > 1)
		snprintf(s->job_type + n, sizeof(s->job_type) - n, "_try%d", tries);
	snprintf(s->map, sizeof(s->map), "%s=%s", s->job->value[JF_JOB_TYPE], s->job_type);
	return job_type_register(s->ctx, s->job_type, s->policy, err, errsz);
}

/*
 * One try of case c (tries: 1, 2, ...): its keys (signoff-<run>-<policy>-
 * <case>-<n>, -<case>-try<N>-<n> after the first try; the reference run's
 * are the seed's, in a job type of the try's own), its steps, its workers
 * stopped. True when the try did not test the case (s->missed says why), so
 * that it runs again; false when it did, was interrupted, or failed.
 */
static bool
case_try(signoff_state *s, const case_spec *c, case_result *cr, int tries, char *err, size_t errsz)
{
	const char *policy = policy_names[s->policy];
	char		part[40];		/* the case's part of its keys: 7a, 7a-try2 */
	int			ki;

	if (tries == 1)
		copy_str(part, sizeof(part), c->id);
	else
	{
		snprintf(part, sizeof(part), "%s-try%d", c->id, tries);
		if (s->job->reference && !case_job_type(s, c, tries, err, errsz))
		{
			case_fail(cr, "%s", err);
			return false;
		}
	}
	/* the case's own keys, workers and deliveries */
	s->cr = cr;
	s->case_id = cr->id;
	s->nkeys = c->nkeys;
	s->nworkers = 0;
	s->took_kept = false;
	s->missed[0] = '\0';
	s->missed_heartbeat = false;
	memset(s->arms, 0, sizeof(s->arms));
	for (ki = 0; ki < s->nkeys; ki++)
	{
		if (s->job->reference)
			snprintf(s->keys[ki], KEYSZ, "ORD-%d", 1001 + ki);
		else
			snprintf(s->keys[ki], KEYSZ, "signoff-%s-%s-%s-%d", s->ctx->run_id, policy, part, ki + 1);
		s->enqueued[ki] = 0;
		copy_str(s->opkey[ki], KEYSZ, s->keys[ki]);
		s->opkey_known[ki] = false;
	}
	case_first_delivery = s->nd;
	cr->ran = true;
	for (ki = 0; ki < s->nkeys; ki++)
	{
		if (!operation_key(s, ki))
			break;
		if (s->job->effect != EFFECT_NONE)
			effect_key(s->keys[ki], s->opkey_known[ki] ? s->opkey[ki] : NULL);
	}
	if (ki == s->nkeys)
		steps_of(c->id) (s);
	/* nothing of the case outlives it */
	stop_workers(s);
	for (ki = 0; ki < s->nworkers; ki++)
		forget_proc(s->workers[ki]);
	s->nworkers = 0;
	return s->missed[0] && !matrix_interrupted;
}

/* ---------------------------------------------------------------------
 * The run
 * --------------------------------------------------------------------- */

static void
print_banner(signoff_state *s)
{
	matrix_ctx *ctx = s->ctx;
	const signoff_job *job = s->job;

	printf("%sSign-off run%s: job type %s on %s, idempotency %s (%s edition) on PostgreSQL %s\n",
		   ctx->color ? "\033[1m" : "", ctx->color ? "\033[0m" : "",
		   job->value[JF_JOB_TYPE], job->value[JF_QUEUE], ctx->ext_version, ctx->ext_edition,
		   ctx->server_version);
	printf("job file %s; commands run in %s\n", job->path, job->dir);
	printf("signed: the job file sha256 %s", job->prov.job_sha256);
	if (job->value[JF_CODE])
		printf("; the code (%s) %d files, sha256 %s", job->value[JF_CODE], job->prov.nfiles,
			   job->prov.code_sha256);
	else
		printf("; no code named (code = in the job file)");
	if (job->prov.git_commit[0])
		printf("; git %s%s", job->prov.git_commit,
			   job->prov.git_dirty == 1 ? " with uncommitted changes" : job->prov.git_dirty == 0 ? " (clean)" : "");
	printf("\n");
	printf("worker: %s\n", job->value[JF_WORKER]);
	printf("enqueue: %s\n", job->value[JF_ENQUEUE]);
	if (job->value[JF_ENQUEUE_OTHER])
		printf("enqueue_other: %s\n", job->value[JF_ENQUEUE_OTHER]);
	if (job->effect != EFFECT_NONE)
		printf("effects: counted by the run's %s endpoint at %s (IDEMPOTENCY_SIGNOFF_%s), which fails on cue in cases 14-18\n",
			   effect_kind_names[job->effect], s->effect_addr, job->effect == EFFECT_HTTP ? "HTTP" : "SMTP");
	else if (job->value[JF_EFFECTS])
		printf("effects: the command %s\n", job->value[JF_EFFECTS]);
	else if (job->value[JF_EFFECTS_SQL])
		printf("effects: the query %s\n", job->value[JF_EFFECTS_SQL]);
	else
		printf("effects: the handled reports (handler runs that returned; not proof that an effect landed)\n");
	printf("server %s; lease %s; timeout %g s; runner idempotency-matrix %s; %s\n",
		   ctx->server_desc, ctx->lease_sql, job->timeout_s, MATRIX_VERSION, ctx->started_at);
	printf("job types %s_<policy>, keys signoff-%s-<policy>-<case>-<n>, worker logs in %s\n",
		   ctx->prefix, ctx->run_id, ctx->signoff_dir);
	fflush(stdout);
}

int
signoff_run(matrix_ctx *ctx, const signoff_job *job, const bool *want, int check_as,
			const char *html, const char *json)
{
	static const case_words seed_words = {"email", "order ORD-1002"};
	case_words	job_words = {job->value[JF_EFFECT_NAME] ? job->value[JF_EFFECT_NAME] : "effect", "key"};
	const case_words *words = job->reference ? &seed_words : &job_words;
	static signoff_state st;
	signoff_state *s = &st;
	struct sockaddr_un addr;
	const char *tmp = getenv("TMPDIR");
	policy_result *prs;
	int			npr = 0;
	int			p,
				k;
	int			total = 0,
				done = 0;
	double		t0;
	const char *cut_drain = NULL;	/* interrupted: the policy whose drain did not end */

	memset(s, 0, sizeof(*s));
	s->ctx = ctx;
	s->job = job;
	s->lfd = -1;
	live_state = s;

	/* the groups' orphans become ours, so that they are reaped and counted */
	prctl(PR_SET_CHILD_SUBREAPER, 1);

	snprintf(ctx->signoff_dir, sizeof(ctx->signoff_dir), "%s/idempotency-signoff.XXXXXX",
			 tmp && *tmp ? tmp : "/tmp");
	if (mkdtemp(ctx->signoff_dir) == NULL)
	{
		pg_log_error("cannot create a directory %s: %s",
				ctx->signoff_dir, strerror(errno));
		ctx->signoff_dir[0] = '\0';
		return 2;
	}
	/* what the run starts does not outlive it, even a runner killed with SIGKILL */
	guardian_start();
	guardian_dir(ctx->signoff_dir);
	snprintf(s->sock, sizeof(s->sock), "%s/signoff.sock", ctx->signoff_dir);
	snprintf(s->cmd_out, sizeof(s->cmd_out), "%s/command.out", ctx->signoff_dir);
	snprintf(s->cmd_err, sizeof(s->cmd_err), "%s/command.err", ctx->signoff_dir);
	memset(&addr, 0, sizeof(addr));
	addr.sun_family = AF_UNIX;
	if (strlen(s->sock) >= sizeof(addr.sun_path))
	{
		pg_log_error("the socket path %s is too long for a Unix socket: set TMPDIR to a shorter directory",
				s->sock);
		return 2;
	}
	copy_str(addr.sun_path, sizeof(addr.sun_path), s->sock);
	s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *) &addr, sizeof(addr)) != 0 ||
		listen(s->lfd, 64) != 0)
	{
		pg_log_error("cannot listen on %s: %s", s->sock, strerror(errno));
		return 2;
	}

	if (job->effect != EFFECT_NONE)
	{
		char		why[300];

		if (!effect_start(job->effect, s->effect_addr, sizeof(s->effect_addr), why, sizeof(why)))
		{
			pg_log_error("cannot start the run's %s endpoint: %s",
					effect_kind_names[job->effect], why);
			return 2;
		}
	}
	if (!job->reference)
		print_banner(s);		/* the reference run printed its own */
	for (p = 0; p < N_POLICIES; p++)
		if (want[p])
			total += signoff_count_cases(ctx->cases, s->job);
	prs = pg_malloc0_array(policy_result, N_POLICIES);
	t0 = now_seconds();
	for (p = 0; p < N_POLICIES && !matrix_interrupted; p++)
	{
		policy_result *pr;
		double		tp = now_seconds();
		char		err[600] = "";
		bool		registered = false;

		if (!want[p])
			continue;
		pr = &prs[npr++];
		pr->policy = (policy_t) p;
		pr->checked_as = check_as >= 0 ? (policy_t) check_as : (policy_t) p;
		s->policy = (policy_t) p;
		s->pr = pr;
		memset(s->late, 0, sizeof(s->late));
		memset(s->case_keys, 0, sizeof(s->case_keys));
		memset(s->case_opkeys, 0, sizeof(s->case_opkeys));
		memset(s->case_nkeys, 0, sizeof(s->case_nkeys));
		/*
		 * A job file's workers outlive their cases, not the policy (their
		 * environment names its job type). Not a transactional job's: its
		 * record shows only when the worker's transaction commits, after
		 * its last point, so a case reads it once the worker ended.
		 */
		s->keep_workers = !job->reference && !job->transactional;
		s->worker_seq = 0;
		if (!job->reference)
		{
			/* a job type per policy; the keys name policy and case */
			snprintf(s->job_type, sizeof(s->job_type), "%s_%s", ctx->prefix, policy_names[p]);
			snprintf(s->map, sizeof(s->map), "%s=%s", s->job->value[JF_JOB_TYPE], s->job_type);
			registered = job_type_register(s->ctx, s->job_type, s->policy, err, sizeof(err));
		}
		for (k = 0; k < n_case_table && !matrix_interrupted; k++)
		{
			const case_spec *c = &case_table[k];
			case_result *cr;
			double		tc;
			int			ki,
						tries;
			/* why each earlier try did not test the case, kept for its notes */
			char		tried[CASE_TRIES][sizeof(s->missed) + KEYSZ + 100];

			if (!signoff_case_wanted(ctx->cases, s->job, c))
				continue;
			cr = &pr->cases[pr->ncases++];
			case_expectations(c, pr->checked_as, words, job->stress, ctx->utf8, cr);
			if (job->reference)
				registered = case_job_type(s, c, 1, err, sizeof(err));
			progress(ctx, "[%d/%d] policy %s, case %s: %s", ++done, total,
					 policy_names[p], cr->id, cr->title);
			tc = now_seconds();
			if (!registered)
			{
				cr->ran = true;
				case_fail(cr, "%s", err);
				case_finish(cr);
				continue;
			}
			if (s->stopped[0])
			{
				/* a worker on another database (hello.c): said once */
				if (!s->stop_said)
				{
					cr->ran = true;
					case_fail(cr, "%s", s->stopped);
					s->stop_said = true;
				}
				else
					case_note(cr, "Not run: the run stopped in an earlier case (see it), and every case would fail alike.");
				case_finish(cr);
				continue;
			}
			if (s->unmappable)
			{
				case_note(cr, "Not run: the worker claims under keys the run cannot map (see the first failing case), and every case would fail alike.");
				case_finish(cr);
				continue;
			}
			if (s->not_armed)
			{
				case_note(cr, "Not run: in an earlier case no point at all reached the runner (see it), and every case would wait as long.");
				case_finish(cr);
				continue;
			}
			for (tries = 1; case_try(s, c, cr, tries, err, sizeof(err)); tries++)
			{
				if (tries == CASE_TRIES)
				{
					if (s->missed_heartbeat)
						case_fail(cr, "%s, in each of %d tries: this machine stalls a worker for longer than the "
								  "lease (%s); give a longer lease in the job file", s->missed, tries, ctx->lease_sql);
					else
						case_fail(cr, "%s, in each of %d tries: the machine stopped the runner for longer than the "
								  "lease (%s), so it could not keep the dead claim young until the message came again; "
								  "give a longer lease in the job file", s->missed, tries, ctx->lease_sql);
					break;
				}
				/*
				 * The try tested nothing: the case again, from its
				 * expectations, under new keys. Its keys' late deliveries
				 * are the queue's leftovers (run_key()), noted where they
				 * come.
				 */
				snprintf(tried[tries - 1], sizeof(tried[0]),
						 "Try %d under %s did not test the case: %s. The case ran again under new keys.",
						 tries, s->keys[0], s->missed);
				for (ki = 0; ki < s->nkeys; ki++)
					know_key(s, s->opkey[ki]);
				pfree(cr->notes.data);
				case_expectations(c, pr->checked_as, words, job->stress, ctx->utf8, cr);
				for (ki = 0; ki < tries; ki++)
					case_note(cr, "%s", tried[ki]);
				progress(ctx, "[%d/%d] policy %s, case %s: %s (try %d: %s)", done, total, policy_names[p],
						 cr->id, cr->title, tries + 1, s->missed_heartbeat ?
						 "the worker's heartbeat stalled past the lease" : "the lease ran out before the redelivery");
			}
			if (matrix_interrupted)
			{
				/* stopped in the middle: the reports hold only finished cases */
				pfree(cr->notes.data);
				pr->ncases--;
				done--;
				s->cr = NULL;
				s->nkeys = 0;
				break;
			}
			cr->seconds = now_seconds() - tc;
			case_finish(cr);
			cr->at_end = cr->obs_emails;
			for (ki = 0; ki < s->nkeys; ki++)
			{
				copy_str(s->case_keys[pr->ncases - 1][ki], KEYSZ, s->keys[ki]);
				copy_str(s->case_opkeys[pr->ncases - 1][ki], KEYSZ, s->opkey[ki]);
			}
			s->case_nkeys[pr->ncases - 1] = s->nkeys;
			s->cr = NULL;
			s->nkeys = 0;
		}
		if (!job->reference && job->drain_s > 0 && !matrix_interrupted)
		{
			drain(s, pr);
			if (matrix_interrupted)
				cut_drain = policy_names[p];
		}
		else if (!job->reference && job->drain_s > 0)
			cut_drain = policy_names[p];
		stop_kept_workers(s);
		diagnose_policy(s, pr);
		s->pr = NULL;
		pr->seconds = now_seconds() - tp;
		progress_clear(ctx);
		report_policy(ctx, pr);
	}
	ctx->seconds = now_seconds() - t0;
	progress_clear(ctx);
	if (matrix_interrupted)
	{
		int			sig = (int) matrix_interrupted;

		/*
		 * The reports all the same, marked, with the cases that finished
		 * (a policy stopped before its first one is left out); exit 130.
		 */
		if (npr > 0 && prs[npr - 1].ncases == 0)
			npr--;
		snprintf(ctx->interrupted, sizeof(ctx->interrupted),
				 "by %s after %d of %d cases: the report holds the %d that finished%s%s%s",
				 sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "a signal",
				 done, total, done, cut_drain ? "; the drain of policy " : "", cut_drain ? cut_drain : "",
				 cut_drain ? " did not run to its end (an effect made late is not counted)" : "");
		effect_stop();
		report_all(ctx, prs, npr, html, json);
		return 130;
	}
	if (job->value[JF_CLEANUP])
		run_cleanup(s);
	effect_stop();
	return report_all(ctx, prs, npr, html, json);
}
