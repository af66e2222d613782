/*
 * case_table.c
 *		The replay cases: each one written once.
 *
 * A case's number means the same thing everywhere: in the reference run
 * (reference.c), in the sign-off run (the engine: engine.c, case_steps.c), in the reports, and in
 * docs/replay-matrix.md and docs/signoff.md, whose case tables are printed
 * from this one (idempotency-matrix --list-cases=...; test/matrix/run.sh
 * checks that the docs hold what it prints). An engine finds here the
 * case's title, what it proves, the steps a sign-off run takes, and what
 * each stale-claim policy must give (the seed's table for cases 1-7); it
 * keeps only the code of the steps.
 *
 * A title is written in the seed's words, about the reference job, with
 * two slots a run fills: {effect} ("email" in the reference run, "effect"
 * in a sign-off run) and {item} ("order ORD-1002" / "key").
 */
#include "postgres_fe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/logging.h"
#include "case_table.h"
#include "util.h"

const char *const policy_names[N_POLICIES] = {"hold", "retry", "skip", "lookup"};

const char *const policy_blurbs[N_POLICIES] = {
	"hold the order for a person",
	"accept a rare duplicate: send again after the lease",
	"accept a rare miss: skip for good",
	"look the operation key up at the provider first",
};

/* the same, in words that fit any job (a sign-off) */
const char *const policy_blurbs_job[N_POLICIES] = {
	"hold for a person",
	"accept a rare duplicate: run again after the lease",
	"accept a rare miss: skip for good",
	"look the operation up first (verify)",
};

/* what a policy must give: effects, record afterwards, verdicts, the words */
#define ALL(n, rec, verd, text) \
	{{n, rec, verd, text}, {n, rec, verd, text}, {n, rec, verd, text}, {n, rec, verd, text}}

const case_spec case_table[] = {
	{
		"1", "first delivery", RUN_BOTH | RUN_TX, 1,
		"a first delivery runs, sends once, and completes",
		"one worker; enqueue; `continue` at `claimed` and `handled`",
		ALL(1, "completed #1", "run", "sent once"),
		NULL
	},
	{
		"2", "same message again after success", RUN_BOTH | RUN_TX, 1,
		"a redelivery after success gets `completed` and the stored result; nothing is sent again",
		"enqueue the same key again; wait for its `judged` (completed)",
		ALL(1, "completed #1", "run, completed", "skipped"),
		NULL
	},
	{
		"3", "same message to two workers at once", RUN_BOTH, 1,
		"2 workers claiming one message at the same instant: exactly one `run`, the other `in_progress`",
		"two workers; enqueue; while the first delivery stands at `claimed`, enqueue the key again: the other "
		"worker's delivery must be `judged` in_progress; then `continue` (enqueued only then, so the points "
		"arrive in the order of the claims)",
		ALL(1, "completed #1", "run, in_progress", "one claims, one skips"),
		NULL
	},
	{
		/* the title, verdicts and words name --stress's number: case_expectations() */
		"3s", "same message to many workers at once (stress)", RUN_REFERENCE, 1,
		"16 workers (`--stress`) claiming one message at the same instant: exactly one `run`, the rest `in_progress`",
		NULL,
		ALL(1, "completed #1", "run, N in_progress", "one claims, N skip"),
		NULL
	},
	{
		"4", "different {item}, similar data", RUN_BOTH | RUN_TX, 2,
		"a different order with almost the same payload is its own operation: both are sent",
		"two workers; two keys at once; both complete",
		ALL(2, "completed #1, completed #1", "run, run", "both processed"),
		NULL
	},
	{
		"5", "worker dies after the claim, before the {effect}", RUN_BOTH, 1,
		"the worker dies after its claim, before the email: after the lease the policy decides "
		"(hold 0 emails, retry 1, skip 0, lookup 1)",
		"kill at `claimed`; after the lease (`stale_claims()` lists it), a new worker and the same message again",
		{
			{0, "claimed #1 (stale)", "run (killed), held", "held for a person after the lease"},
			{1, "completed #2", "run (killed), run", "sent after the lease by a takeover"},
			{0, "skipped #1", "run (killed), skipped", "skipped for good: no {effect} at all"},
			{1, "completed #2", "run (killed), verify (not found)", "looked up: not found, so sent"},
		},
		NULL
	},
	{
		"6", "worker dies after the {effect}, before completed", RUN_BOTH, 1,
		"the worker dies after the email, before completion — the uncertain case (hold 1, retry 2, skip 1, lookup 1)",
		"kill at `handled`; after the lease, a new worker and the same message again",
		{
			{1, "claimed #1 (stale)", "run (killed), held", "held for a person after the lease"},
			{2, "completed #2", "run (killed), run", "sent again after the lease: a duplicate"},
			{1, "skipped #1", "run (killed), skipped", "skipped for good"},
			{1, "completed #2", "run (killed), verify (found)", "looked up: found, not sent again"},
		},
		NULL
	},
	{
		"7a", "redelivery of case 5 inside the lease", RUN_BOTH, 1,
		"a redelivery inside the lease never takes over (`in_progress`, the attempt stays 1): after case 5's death",
		"as 5, but the message again *inside* the lease; two workers are started at once, so no worker start "
		"stands between the death and the redelivery, and from the death until the case has read the record "
		"the runner keeps the dead claim young (`extend_lease()` with its attempt, as its heartbeat would have), "
		"so that the redelivery is inside the lease however slow the machine",
		ALL(0, "claimed #1 (young)", "run (killed), in_progress", "skipped; no second worker takes over"),
		"5"
	},
	{
		"7b", "redelivery of case 6 inside the lease", RUN_BOTH, 1,
		"the same after case 6's death: one email, the claim stays young and its own",
		"as 6, but the message again *inside* the lease, as 7a",
		ALL(1, "claimed #1 (young)", "run (killed), in_progress", "skipped; no second worker takes over"),
		"6"
	},
	{
		"8", "worker dies inside a transaction (claim + row)", RUN_REFERENCE | RUN_TX, 1,
		"claim + effect row in one transaction: a death inside it leaves nothing; the redelivery runs once, as attempt 1",
		"only with `transactional = yes`: kill at `handled`, inside the transaction, after the effect row; once its "
		"server process left the transaction (`backend_pid`, if the helper sends it) there must be no record and "
		"no row; then a new worker and the same message again, which runs once, as attempt 1",
		ALL(1, "none, then completed #1", "run (killed in transaction), run",
			"nothing recorded; the redelivery runs once"),
		NULL
	},
	{
		"9", "slow worker completes after a redelivery", RUN_BOTH, 1,
		"a slow (not dead) worker completes late. Under retry and lookup a redelivery took the claim over, so the "
		"late completion is refused with `ID003` and the record keeps the new owner's result. Under hold and skip "
		"nothing takes over (see below), so it is accepted: 1 email, `completed #1`",
		"hold at `handled` past the lease; the message again; a new worker takes over per the policy; then "
		"`continue` the slow one, whose completion is refused (`ID003`) where a takeover ran",
		{
			{1, "completed #1", "run (slow), held, late completion ok", "no takeover: the late completion counts"},
			{2, "completed #2", "run (slow), run, late completion ID003", "taken over: the late completion is refused"},
			{1, "completed #1", "run (slow), skipped, late completion ok", "no takeover: the late completion counts"},
			{1, "completed #2", "run (slow), verify (found), late completion ID003",
			"taken over: the late completion is refused"},
		},
		NULL
	},
	{
		"10", "worker releases after a known failure", RUN_BOTH, 1,
		"`release_operation` after a known failure: the next delivery runs as attempt 2",
		"answer `fail` at `claimed` (the helper releases the claim: the record says released); the next delivery runs",
		ALL(1, "completed #2", "run, released, run", "the next delivery runs"),
		NULL
	},
	{
		"11", "same key arrives with a different payload", RUN_BOTH | RUN_TX, 1,
		"the same key with a different payload fingerprint is refused with `ID002`; the original payload still gets `completed`",
		"`enqueue_other` after the key completed: the claim refuses it (`ID002`); the original message again is completed",
		ALL(1, "completed #1", "run, ID002, completed", "refused: fingerprint mismatch"),
		NULL
	},
	{
		"12", "long job heartbeats with extend_lease", RUN_BOTH, 1,
		"a long job that heartbeats with `extend_lease` is never listed as stale and never taken over",
		"two workers; hold at `claimed` for two leases (the claim's age read from the database), `stale_claims()` "
		"never listing it; the message again is in_progress. A helper that reports `heartbeat: false` fails the "
		"case with the reason: a job longer than its lease would be taken for a dead one (leave 12 out with "
		"`--cases` if every run is far shorter than the lease)",
		ALL(1, "completed #1", "run (heartbeats), in_progress", "never taken over"),
		NULL
	},
	{
		"13", "stale claim that no redelivery touches", RUN_BOTH, 1,
		"a claim that nothing redelivers (the queue lost the message) is listed by `stale_claims()` once its lease "
		"runs out, and not before",
		"kill at `claimed`; inside the lease `stale_claims()` does not list the record (a look that came only after "
		"the lease, by the database's clock, is noted instead), after it it does (attempt 1, the policy)",
		ALL(0, "claimed #1 (stale)", "run (killed), listed by stale_claims()", "found by stale_claims()"),
		"5"						/* a queue that did not lose the message after all */
	},

	/*
	 * Faults at the effect: only a job whose provider is the run's own
	 * endpoint (effect = http / smtp, effect.c) has them, since only there
	 * can the run make the provider fail on cue.
	 */
	{
		"14", "provider refuses the {effect} for now", RUN_EFFECT, 1,
		"a provider that refuses for now (HTTP 503, SMTP 451): the job fails the delivery as a known failure "
		"(the claim released), and the next delivery sends once",
		"the endpoint answers the key's first request 503 (SMTP 451); the record must say released, not "
		"completed (a job that swallows the error) nor a claim left to its lease; then the message again",
		ALL(1, "completed #2", "run (refused), released, run", "released; the next delivery sends once"),
		NULL
	},
	{
		"15", "provider accepts the {effect}, the answer never comes", RUN_EFFECT, 1,
		"the provider made the effect, but its answer never came: the job's client gives up (its timeout) and the "
		"job cannot know, so it leaves the claim to its lease and the policy decides, as in case 6",
		"the endpoint counts the key's first request and never answers; the job's client must give up within "
		"`timeout` and leave the claim to its lease (not release it); after the lease, the message again",
		{
			{1, "claimed #1 (stale)", "run (no answer), held", "held for a person after the lease"},
			{2, "completed #2", "run (no answer), run", "sent again after the lease: a duplicate"},
			{1, "skipped #1", "run (no answer), skipped", "skipped for good"},
			{1, "completed #2", "run (no answer), verify (found)", "looked up: found, not sent again"},
		},
		NULL
	},
	{
		"16", "provider refuses the {effect} for good", RUN_EFFECT, 1,
		"a provider that refuses for good (HTTP 422, SMTP 550): no effect, the job ends the operation (completes "
		"it with the refusal as its result, or releases it and drops the message) and does not retry it",
		"the endpoint answers every request of the key 422 (SMTP 550); the record must be completed (or released), "
		"and no more than 2 requests may come, in the case and in the drain",
		ALL(0, "completed #1", "run (refused for good)", "ended: not retried, no {effect}"),
		NULL
	},
	{
		"17", "provider answers after two leases", RUN_EFFECT, 1,
		"a slow but successful provider (its answer after two leases): the heartbeat keeps the claim, the message "
		"again is in_progress, one effect",
		"two workers; the endpoint holds the key's first request; once it has waited longer than the lease, "
		"the message again (must be in_progress); the answer once that was judged and two leases passed, "
		"then the completion",
		ALL(1, "completed #1", "run (slow), in_progress", "the heartbeat keeps the claim; sent once"),
		NULL
	},
	{
		"18", "provider unreachable (connection refused)", RUN_EFFECT, 1,
		"a provider that cannot be reached (connection refused): as a refusal for now, the claim released, "
		"and the next delivery sends once",
		"nothing listens on the endpoint's port until the record says released; then the message again",
		ALL(1, "completed #2", "run (no connection), released, run", "released; the next delivery sends once"),
		NULL
	},
	{
		/* effects and records per key: case_steps.c's sc_19 (5's and 6's for the killed keys) */
		"19", "a storm: many keys and deliveries at once, deaths", RUN_SIGNOFF, 6,
		"what production does at once: 6 keys, each delivered 3 times to 3 workers together, the workers of two "
		"keys picked at random killed (one at `claimed`, one at `handled`); every key has the effects its policy allows, counted per key (lost, duplicated beyond "
		"the policy); catches a job that reads its state before the claim or shares it between keys",
		"three workers; 6 keys, each enqueued 3 times; two keys picked at random have their worker killed, one "
		"at `claimed`, one at `handled`, then after the lease the message again; each key is counted: a killed "
		"key as case 5 or 6 gives under the policy, every other once, completed #1",
		ALL(-1, "6 keys as the policy gives", "none lost, none duplicated", "no key lost or duplicated beyond the policy"),
		NULL
	},
	{
		"20", "several keys in one receive (a batch handler)", RUN_BATCH, 3,
		"a batch handler judges each key of one receive on its own: a fresh key runs, a duplicate of a completed "
		"key gets `completed`, the same key with other arguments `ID002` (a batch claim refuses the whole call: "
		"the handler claims those keys one by one), a key whose work fails is released and runs again",
		"only with `batch = yes` (and `enqueue_other`): key B is completed first; then, with no worker running, "
		"key A, B with other arguments, B again and key C are enqueued, and one worker started, so that they "
		"arrive in one receive; `fail` at C's `claimed`; then C's message again",
		ALL(3, "completed #1, completed #1, completed #2", "run, run, ID002, completed, run, released, run",
			"each key judged on its own"),
		NULL
	},
};

const int	n_case_table = (int) (sizeof(case_table) / sizeof(case_table[0]));

const case_spec *
case_by_id(const char *id)
{
	int			k;

	for (k = 0; k < n_case_table; k++)
		if (strcmp(case_table[k].id, id) == 0)
			return &case_table[k];
	return NULL;
}

/* s with {effect} and {item} filled in */
static void
fill(char *out, size_t sz, const char *s, const case_words *w)
{
	size_t		n = 0;

	while (*s && n + 1 < sz)
	{
		const char *v = NULL;
		size_t		skip = 0;

		if (strncmp(s, "{effect}", 8) == 0)
			v = w->effect, skip = 8;
		else if (strncmp(s, "{item}", 6) == 0)
			v = w->item, skip = 6;
		if (v)
		{
			while (*v && n + 1 < sz)
				out[n++] = *v++;
			s += skip;
		}
		else
			out[n++] = *s++;
	}
	out[n] = '\0';
}

/*
 * A case's result, before it runs: its id, title and what policy `as` must
 * give. stress: the workers of case 3s.
 */
void
case_expectations(const case_spec *c, policy_t as, const case_words *words,
				  int stress, bool utf8, case_result *cr)
{
	const case_expect *e = &c->expect[as];

	memset(cr, 0, sizeof(*cr));
	initStringInfo(&cr->notes);
	cr->id = c->id;
	cr->obs_emails = -1;
	cr->at_end = cr->after_drain = -1;
	cr->checks_ok = true;
	fill(cr->title, sizeof(cr->title), c->title, words);
	cr->exp_emails = e->effects;
	copy_str(cr->exp_record, sizeof(cr->exp_record), e->record);
	copy_str(cr->exp_verdicts, sizeof(cr->exp_verdicts), e->verdicts);
	fill(cr->expected_text, sizeof(cr->expected_text), e->text, words);
	if (strcmp(c->id, "3s") == 0)
	{
		const char *x = utf8 ? "\xC3\x97" : "x";	/* × */

		snprintf(cr->title, sizeof(cr->title),
				 "same message to %d workers at once (stress)", stress);
		snprintf(cr->exp_verdicts, sizeof(cr->exp_verdicts), "run, %d%s in_progress", stress - 1, x);
		snprintf(cr->expected_text, sizeof(cr->expected_text), "one claims, %d skip", stress - 1);
	}
}

/* the three cells and the notes' checks make the mark */
void
case_finish(case_result *cr)
{
	cr->emails_ok = cr->obs_emails == cr->exp_emails;
	cr->record_ok = strcmp(cr->obs_record, cr->exp_record) == 0;
	cr->verdicts_ok = strcmp(cr->obs_verdicts, cr->exp_verdicts) == 0;
	cr->pass = cr->ran && cr->emails_ok && cr->record_ok && cr->verdicts_ok &&
		cr->checks_ok;
}

/* fmt's text at the end of the case's notes (appendStringInfoVA's loop) */
static void notes_vappend(case_result *cr, const char *fmt, va_list ap) MX_PRINTF(2, 0);

static void
notes_vappend(case_result *cr, const char *fmt, va_list ap)
{
	for (;;)
	{
		va_list		copy;
		int			needed;

		va_copy(copy, ap);
		needed = appendStringInfoVA(&cr->notes, fmt, copy);
		va_end(copy);
		if (needed == 0)
			return;
		enlargeStringInfo(&cr->notes, needed);
	}
}

/* a sentence for the report, about what was checked */
void
case_vnote(case_result *cr, const char *fmt, va_list ap)
{
	if (cr->notes.len)
		appendStringInfoString(&cr->notes, "\n");
	notes_vappend(cr, fmt, ap);
}

void
case_note(case_result *cr, const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	case_vnote(cr, fmt, ap);
	va_end(ap);
}

/* a check that did not hold: the case fails, the note says why */
void
case_vfail(case_result *cr, const char *fmt, va_list ap)
{
	if (cr->notes.len)
		appendStringInfoString(&cr->notes, "\n");
	appendStringInfoString(&cr->notes, "FAILED: ");
	notes_vappend(cr, fmt, ap);
	cr->checks_ok = false;
}

void
case_fail(case_result *cr, const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	case_vfail(cr, fmt, ap);
	va_end(ap);
}

int
policy_by_name(const char *s)
{
	int			i;

	for (i = 0; i < N_POLICIES; i++)
		if (strcmp(s, policy_names[i]) == 0)
			return i;
	return -1;
}

/*
 * The next item of a list in a job file (policies, code): items are
 * separated by commas, blanks or both ("hold, retry", "hold retry",
 * "tasks.py, lib/refund.py"); inside braces (a glob's {a,b}) nothing
 * separates. The item is cut out of *cursor in place, which then
 * points after it; NULL when no item is left.
 */
char *
job_list_next(char **cursor)
{
	char	   *p = *cursor;
	char	   *item;
	int			depth = 0;

	while (*p == ',' || *p == ' ' || *p == '\t')
		p++;
	if (*p == '\0')
	{
		*cursor = p;
		return NULL;
	}
	item = p;
	for (; *p; p++)
	{
		if (*p == '{')
			depth++;
		else if (*p == '}' && depth > 0)
			depth--;
		else if (depth == 0 && (*p == ' ' || *p == '\t' || *p == ','))
			break;
	}
	if (*p)
		*p++ = '\0';
	*cursor = p;
	return item;
}

/* "hold, retry" or "all" into want[]; false: a word that is no policy, or none */
bool
parse_policies(const char *list, bool *want)
{
	char	   *copy = pg_strdup(list);
	char	   *cursor = copy;
	char	   *tok;
	bool		ok = true;
	int			i;

	for (i = 0; i < N_POLICIES; i++)
		want[i] = false;
	/* commas and blanks alike, as every list of a job file */
	while ((tok = job_list_next(&cursor)) != NULL)
	{
		int			p = policy_by_name(tok);

		if (strcmp(tok, "all") == 0)
			for (i = 0; i < N_POLICIES; i++)
				want[i] = true;
		else if (p >= 0)
			want[p] = true;
		else
			ok = false;
	}
	pg_free(copy);
	for (i = 0; i < N_POLICIES; i++)
		if (want[i])
			return ok;
	return false;
}

/*
 * Is case `id` in the --cases list ("1-7,12,3s")? A number also selects its
 * variants (3: 3 and 3s; 7: 7a and 7b).
 */
bool
case_selected(const char *list, const char *id)
{
	const char *p = list;
	int			n = atoi(id);

	if (list == NULL || *list == '\0')
		return true;
	while (*p)
	{
		char		tok[32];
		size_t		len = strcspn(p, ",");
		char	   *dash;

		if (len >= sizeof(tok))
			len = sizeof(tok) - 1;
		memcpy(tok, p, len);
		tok[len] = '\0';
		p += len;
		if (*p == ',')
			p++;
		dash = strchr(tok, '-');
		if (dash)
		{
			int			lo = atoi(tok);
			int			hi = atoi(dash + 1);

			if (n >= lo && n <= hi)
				return true;
		}
		else if (strcmp(tok, id) == 0 ||
				 (strspn(tok, "0123456789") == strlen(tok) && atoi(tok) == n))
			return true;
	}
	return false;
}

/* do all policies expect the same of case c? */
static bool
expect_same(const case_spec *c)
{
	int			p;

	for (p = 1; p < N_POLICIES; p++)
		if (c->expect[p].effects != c->expect[0].effects ||
			strcmp(c->expect[p].record, c->expect[0].record) != 0 ||
			strcmp(c->expect[p].verdicts, c->expect[0].verdicts) != 0 ||
			strcmp(c->expect[p].text, c->expect[0].text) != 0)
			return false;
	return true;
}

/* a markdown cell: | escaped */
static void
md_cell(const char *s)
{
	for (; *s; s++)
	{
		if (*s == '|')
			fputs("\\|", stdout);
		else
			fputc(*s, stdout);
	}
}

/*
 * --list-cases=WHAT: the case table as markdown, for the docs.
 *	proves	  docs/replay-matrix.md: | case | what it proves |
 *	steps	  docs/signoff.md: | case | what the run does |
 *	policies  docs/replay-matrix.md: what each policy must give
 * 0, or 2 for an unknown WHAT (one sentence on stderr).
 */
int
case_table_list(const char *what)
{
	int			k,
				p;

	if (strcmp(what, "proves") == 0)
	{
		printf("| case | what it proves |\n|---|---|\n");
		for (k = 0; k < n_case_table; k++)
		{
			printf("| %s | ", case_table[k].id);
			md_cell(case_table[k].proves);
			printf(" |\n");
		}
	}
	else if (strcmp(what, "steps") == 0)
	{
		printf("| case | what the run does |\n|---|---|\n");
		for (k = 0; k < n_case_table; k++)
		{
			if (!(case_table[k].runs_in & (RUN_SIGNOFF | RUN_TX | RUN_EFFECT | RUN_BATCH)))
				continue;
			printf("| %s | ", case_table[k].id);
			md_cell(case_table[k].steps);
			printf(" |\n");
		}
	}
	else if (strcmp(what, "policies") == 0)
	{
		static const case_words seed = {"email", "order ORD-1002"};

		printf("| case | title (the reference run's words) | runs in | policy | effects | record afterwards | verdicts | expected |\n"
			   "|---|---|---|---|---|---|---|---|\n");
		for (k = 0; k < n_case_table; k++)
			for (p = 0; p < N_POLICIES; p++)
			{
				const case_expect *e = &case_table[k].expect[p];
				bool		all = expect_same(&case_table[k]);
				char		title[128];
				char		text[128];
				unsigned	in = case_table[k].runs_in;
				char		runs[64] = "";

				if (all && p > 0)
					break;
				fill(title, sizeof(title), case_table[k].title, &seed);
				printf("| %s | ", p == 0 ? case_table[k].id : "");
				md_cell(p == 0 ? title : "");
				if (p == 0)
				{
					if (in & RUN_REFERENCE)
						list_append(runs, sizeof(runs), "reference");
					if (in & RUN_SIGNOFF)
						list_append(runs, sizeof(runs), "sign-off");
					if (in & RUN_TX)
						list_append(runs, sizeof(runs), "transactional");
					if (in & RUN_EFFECT)
						list_append(runs, sizeof(runs), "effect = http, smtp");
					if (in & RUN_BATCH)
						list_append(runs, sizeof(runs), "batch = yes");
				}
				if (e->effects < 0)
					printf(" | %s | %s | per key | ", runs, all ? "all" : policy_names[p]);
				else
					printf(" | %s | %s | %d | ", runs, all ? "all" : policy_names[p], e->effects);
				md_cell(e->record);
				printf(" | ");
				md_cell(e->verdicts);
				printf(" | ");
				fill(text, sizeof(text), e->text, &seed);
				md_cell(text);
				printf(" |\n");
			}
	}
	else
	{
		pg_log_error("--list-cases: \"%s\" is not proves, steps or policies", what);
		return 2;
	}
	return 0;
}
