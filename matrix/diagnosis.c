/*
 * diagnosis.c
 *		What a failing case of a sign-off run says the job did wrong: one
 *		sentence, in the job's own words (the job file's effect_name),
 *		derived from what the run observed.
 *
 * The cells and the notes say what was observed (effects 2, expected 1; a
 * verdict ID002 where completed was expected); the sentence says what the
 * job must have done to give that, so that its author knows where to
 * look. It is the first note of the case, "Diagnosis: ...", and is written
 * only where the observations point at one mistake; a case they do not
 * explain gets none (its cells and notes still say what failed).
 *
 * What it reads, all in the run's state after the policy's cases and the
 * drain (the final counts): each delivery of a case's keys, in the order
 * its claimed or judged point arrived (its verdict, whether it reached
 * handled or was killed, and the effects counted at its points: the engine
 * counts them for a user's job with an effects command or query); claims
 * under another key that holds the case's key (a copy under a key of its
 * own); the case's record and notes. The rules, in the order they are
 * tried:
 *
 *	key		the claim's key cannot be mapped: a message id (another key
 *			per delivery) or a mapping the job file does not declare
 *	before	the first delivery of a fresh key had made an effect when it
 *			reached its claim: the effect comes before the claim
 *	fingerprint	the same message again was refused with ID002 (case 11
 *			expects one, for its other arguments): the arguments change
 *			between deliveries
 *	complete-first	the record was completed while the case expected the
 *			claim (or stale_claims() could never list it), and the
 *			handler had made no effect by its handled point
 *	after-handled	a delivery that returned at its handled point without
 *			an effect, the count higher when the case ended, no delivery
 *			after it that ran: the effect came after the point
 *	key-change	a claim that ran under another key holding the case's key,
 *			after a delivery the queue delivers again (in_progress, busy, a
 *			failure): the key changes between deliveries of one message
 *			(engine.c's key_changed() fails a case at once when it comes
 *			while the case runs)
 *	new-key	a claim that ran under another key holding the case's key:
 *			a copy the job scheduled under a key of its own
 *	verdict	more effects than deliveries that ran through the claim, and
 *			the count grew after a delivery judged completed,
 *			in_progress, held or skipped: the job ignores the verdict.
 *			The extra effect may come after the case ended (the run
 *			cannot see a judged delivery's handler return, and counts at
 *			the point); then, or when the run's other cases show that
 *			the job makes copies, the other cases decide (copies()): a
 *			case whose every delivery ran through the claim and has as
 *			many effects as deliveries rules copies out, one with more
 *			rules them in (below); neither: both are named
 *	unclaimed	more effects than deliveries that ran through the claim,
 *			none judged to blame (or the extra came only in the drain):
 *			something made the effect without a claim (a copy of itself
 *			the job scheduled)
 *
 * The reference run is not diagnosed: its job is the runner's own.
 */
#include "postgres_fe.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "diagnosis.h"

/* what changed from key a to key b, in words: "\":1\" added at the end" */
void
key_diff(const char *a, const char *b, char *out, size_t sz)
{
	size_t		la = strlen(a),
				lb = strlen(b),
				p = 0,
				q = 0;
	char		x[KEYSZ],
				y[KEYSZ];
	bool		digits;

	while (p < la && p < lb && a[p] == b[p])
		p++;
	while (q < la - p && q < lb - p && a[la - 1 - q] == b[lb - 1 - q])
		q++;
	snprintf(x, sizeof(x), "%.*s", (int) (la - p - q), a + p);
	snprintf(y, sizeof(y), "%.*s", (int) (lb - p - q), b + p);
	digits = (x[0] || y[0]) && strspn(x, "0123456789") == strlen(x) && strspn(y, "0123456789") == strlen(y);
	if (x[0] == '\0')
		snprintf(out, sz, "\"%s\" added %s", y, q == 0 ? "at the end" : p == 0 ? "at the start" : "inside");
	else if (y[0] == '\0')
		snprintf(out, sz, "\"%s\" gone %s", x, q == 0 ? "from the end" : p == 0 ? "from the start" : "from inside");
	else
		snprintf(out, sz, "\"%s\" became \"%s\"", x, y);
	if (digits || (x[0] == '\0' && strspn(y + strspn(y, ":-_/.#"), "0123456789") == strlen(y + strspn(y, ":-_/.#"))))
		copy_str(out + strlen(out), sz - strlen(out), ": a number that counts, such as the queue's retry count");
}

/* the job's effect, its plural */
static const char *
effect_of(const signoff_state *s)
{
	const char *e = s->job->value[JF_EFFECT_NAME];

	return e && *e ? e : "effect";
}

static bool
no_run(const char *v)
{
	return strcmp(v, "completed") == 0 || strcmp(v, "in_progress") == 0 ||
		strcmp(v, "held") == 0 || strcmp(v, "skipped") == 0;
}

/* does key hold the run's key k at a boundary, and is not k itself? */
static bool
holds_key(const char *key, const char *k)
{
	size_t		m = strlen(k);
	const char *p;

	if (m == 0 || strcmp(key, k) == 0)
		return false;
	for (p = strstr(key, k); p; p = strstr(p + 1, k))
	{
		bool		left = p == key || !isalnum((unsigned char) p[-1]);
		bool		right = !isalnum((unsigned char) p[m]);

		if (left && right)
			return true;
	}
	return false;
}

/* the case's key (0, 1) that delivery d was claimed under, or -1 */
static int
key_of(const signoff_state *s, int c, const delivery *d)
{
	int			k;

	for (k = 0; k < s->case_nkeys[c]; k++)
		if (strcmp(d->key, s->case_opkeys[c][k]) == 0)
			return k;
	return -1;
}

/*
 * the cases of one delivery at a time; the faults at the effect, the storm
 * and the batch (14 and later) and case 8 say what went wrong themselves
 */
static bool
diagnosed_here(const char *id)
{
	static const char *const ids[] = {"1", "2", "3", "4", "5", "6", "7a", "7b", "9", "10", "11", "12", "13"};
	int			i;

	for (i = 0; i < (int) (sizeof(ids) / sizeof(ids[0])); i++)
		if (strcmp(id, ids[i]) == 0)
			return true;
	return false;
}

/* did delivery d make an effect of its own? (a verify that found: none) */
static bool
made_one(const delivery *d)
{
	return d->runs && d->handled &&
		!(strcmp(d->verdict, "verify") == 0 && d->eff_after >= 0 && d->eff_after == d->eff_before);
}

/*
 * Does the job make its effect in copies of itself that skip the claim?
 * The policy's other cases tell, on their final counts (after the drain):
 * a case whose every delivery ran through the claim and returned (none
 * judged, killed or failed) and that has more effects than those
 * deliveries made says yes (1); such cases with exactly as many say no
 * (-1); no such case: 0.
 */
static int
copies(const signoff_state *s, const policy_result *pr, int c)
{
	int			said = 0;
	int			o,
				i;

	for (o = 0; o < pr->ncases; o++)
	{
		const case_result *cr = &pr->cases[o];
		int			made = 0;
		bool		clean = true;

		if (o == c || !cr->ran || !diagnosed_here(cr->id) || s->case_nkeys[o] == 0 || cr->obs_emails < 0)
			continue;
		for (i = 0; i < s->nd && clean; i++)
		{
			const delivery *d = &s->d[i];

			if (key_of(s, o, d) < 0)
				continue;
			clean = d->runs && d->handled && !d->killed && !d->failed;
			made += clean && made_one(d);
		}
		if (!clean || made == 0)
			continue;
		if (cr->obs_emails > made)
			return 1;
		if (cr->obs_emails == made)
			said = -1;
	}
	return said;
}

/*
 * The sentence for case c of the policy (an index into pr's cases, the
 * same as s->case_keys'), or false when the observations point at no one
 * mistake.
 */
bool
diagnose_case(const signoff_state *s, const policy_result *pr, int c, char *out, size_t sz)
{
	const case_result *cr = &pr->cases[c];
	const char *eff = effect_of(s);
	const char *notes = cr->notes.data;
	int			nk = s->case_nkeys[c];
	int			i,
				k;
	int			made = 0;		/* deliveries that ran through the claim */
	int			id002 = 0;
	int			first[2] = {-1, -1};
	int			blamed = -1;	/* a judged delivery the count grew after */
	int			newkey = -1;
	int			at_end;
	int			made_in_case = 0;	/* of those, before the case ended */
	int			bare = -1;		/* returned at handled without an effect */
	int			again = -1;		/* a delivery the queue delivers again: in_progress, busy, failed */

	if (nk == 0 || !cr->ran)
		return false;

	/* the count when the case ended (the drain may have changed obs_emails) */
	at_end = cr->at_end >= 0 ? cr->at_end : cr->obs_emails;

	/* key: the claims cannot be mapped to the run's keys */
	if (strstr(notes, "it is a message id"))
	{
		snprintf(out, sz, "the %s job claims under the message's own id, another key for every delivery "
				 "of one message, so no redelivery ever finds the claim and every delivery may make "
				 "its own %s: claim under the operation's key (the run's key, or one made from it)",
				 eff, eff);
		return true;
	}
	if (strstr(notes, "which the run cannot map"))
	{
		snprintf(out, sz, "the %s job claims under a key made from the run's key in a way the job file "
				 "does not declare, so the run cannot find its claims: declare it (key = a template "
				 "with {key}, or key_command)", eff);
		return true;
	}

	for (i = 0; i < s->nd; i++)
	{
		const delivery *d = &s->d[i];

		k = key_of(s, c, d);
		if (k < 0)
		{
			for (k = 0; k < nk; k++)
				if (d->runs && newkey < 0 && holds_key(d->key, s->case_keys[c][k]) &&
					strcmp(d->key, s->case_opkeys[c][k]) != 0)
					newkey = i;
			continue;
		}
		if (first[k] < 0)
			first[k] = i;
		if (again < 0 && ((!d->runs && (strcmp(d->verdict, "in_progress") == 0 || strcmp(d->verdict, "busy") == 0)) ||
						  (d->runs && d->failed)))
			again = i;
		if (!d->runs && strcmp(d->verdict, "error") == 0 && strcmp(d->sqlstate, "ID002") == 0)
			id002++;
		if (made_one(d))
		{
			made++;
			if (!d->stray)
				made_in_case++;
		}
		if (d->runs && d->handled && d->eff_after >= 0 && d->eff_after == d->eff_before)
			bare = i;			/* the last that returned without an effect */
		if (!d->runs && no_run(d->verdict) && blamed < 0 && d->eff_before >= 0 &&
			cr->obs_emails > d->eff_before)
			blamed = i;
	}

	/*
	 * the faults at the effect, the storm and the batch say what went
	 * wrong themselves: of these rules only the keys' (below) are theirs
	 */
	if (!diagnosed_here(cr->id) && newkey < 0)
		return false;
	if (!diagnosed_here(cr->id))
		goto keys;

	/* before: a fresh key had an effect when its first delivery reached the claim */
	for (k = 0; k < nk; k++)
		if (first[k] >= 0 && s->d[first[k]].eff_before > 0)
		{
			snprintf(out, sz, "the first delivery of %s had already made a %s when it reached its claim "
					 "(%d counted at its %s point): the job makes the %s before it claims the key, so "
					 "the claim cannot stop a second one",
					 s->case_keys[c][k], eff, s->d[first[k]].eff_before,
					 s->d[first[k]].runs ? "claimed" : "judged", eff);
			return true;
		}

	/* fingerprint: ID002 for the same message (case 11 sends other arguments once) */
	if (id002 > (strcmp(cr->id, "11") == 0 ? 1 : 0))
	{
		snprintf(out, sz, "the same message of %s sent again was refused with ID002 (another "
				 "fingerprint): the %s job's arguments differ between deliveries of one message (a "
				 "time, a message id, a counter among them), so a redelivery is refused instead of "
				 "answered from the record", s->case_keys[c][0], eff);
		return true;
	}

	/* complete-first: completed while the claim was expected, no effect at handled */
	if ((strstr(cr->obs_record, "completed") && strstr(cr->exp_record, "claimed")) ||
		strstr(notes, "already, so stale_claims() will never list it"))
	{
		for (i = 0; i < s->nd; i++)
		{
			const delivery *d = &s->d[i];

			if (key_of(s, c, d) >= 0 && d->runs && d->handled && strcmp(d->verdict, "run") == 0 &&
				d->eff_after >= 0 && d->eff_after == d->eff_before)
			{
				snprintf(out, sz, "the operation of %s was completed before its %s was made (none at the "
						 "handled point, the record already completed): the job completes before the %s, "
						 "so a worker that dies in between loses the %s for good",
						 d->key, eff, eff, eff);
				return true;
			}
		}
	}

	/*
	 * after-handled: a delivery that returned at its handled point without
	 * an effect, the count higher when the case ended and no delivery after
	 * it that ran: its effect came after the point (after the completion,
	 * or in a call the handler did not wait for)
	 */
	if (bare >= 0 && at_end > s->d[bare].eff_after)
	{
		for (i = bare + 1; i < s->nd; i++)
			if (key_of(s, c, &s->d[i]) >= 0 && s->d[i].runs)
				break;
		if (i == s->nd)
		{
			snprintf(out, sz, "the handler of %s reached its handled point before its %s was made (%d "
					 "counted there, %d when the case ended): the job completes (or returns) before the %s has landed, so "
					 "a worker that dies in between loses it",
					 s->d[bare].key, eff, s->d[bare].eff_after, at_end, eff);
			return true;
		}
	}

keys:

	/*
	 * key-change: the claim under the new key came after a delivery that
	 * the queue delivers again (in_progress, busy, a failure): it is that
	 * message's redelivery, under a key that changed
	 */
	if (newkey >= 0 && again >= 0 && again < newkey)
	{
		char		diff[300];
		const char *was = s->d[again].key;

		key_diff(was, s->d[newkey].key, diff, sizeof(diff));
		snprintf(out, sz, "the operation key changes between deliveries of one message of %s: \"%s\", then \"%s\" "
				 "(%s), so the redelivery after the delivery judged %s could not find the first claim and made "
				 "its own %s: make the key from the operation alone, the same for every delivery of the message",
				 s->case_keys[c][0], was, s->d[newkey].key, diff,
				 s->d[again].runs ? "run that failed" : s->d[again].verdict, eff);
		return true;
	}

	/* new-key: a copy that claimed under a key of its own */
	if (newkey >= 0 && !diagnosed_here(cr->id))
		return false;
	if (newkey >= 0)
	{
		snprintf(out, sz, "a copy of the message claimed under the new key %s and made another %s: the "
				 "job reschedules itself with a fresh message under a key the claim of %s does not "
				 "know, so the copy runs unprotected",
				 s->d[newkey].key, eff, s->case_keys[c][0]);
		return true;
	}

	/*
	 * verdict: the count grew after a delivery the claim told to run
	 * nothing. Before the case ended, that delivery made it, unless the
	 * other cases show copies; only after (in the drain), it did if the
	 * other cases rule copies out, and a copy did if they show them (below)
	 */
	if (blamed >= 0 && (at_end > made_in_case || cr->obs_emails > made))
	{
		const char *k = s->case_keys[c][key_of(s, c, &s->d[blamed])];
		int			copy = copies(s, pr, c);
		bool		in_case = at_end > made_in_case;

		if ((in_case && copy <= 0) || (!in_case && copy < 0))
		{
			snprintf(out, sz, "a delivery of %s judged %s still made a %s (%d made, %d deliver%s ran through "
					 "the claim): the job ignores the claim's verdict%s",
					 k, s->d[blamed].verdict, eff, in_case ? at_end : cr->obs_emails, made_in_case,
					 made_in_case == 1 ? "y" : "ies",
					 in_case ? "" : " (the last came after the case had ended, from a handler still running "
					 "when the case was counted; the run's other cases show no copies that skip the claim)");
			return true;
		}
		if (!in_case && copy == 0)
		{
			snprintf(out, sz, "%d %ss of %s were made where %d deliver%s ran through the claim, the last "
					 "after the case had ended and after a delivery judged %s: either the job ignores the "
					 "claim's verdict, or it makes the %s in a copy of itself that skips the claim; run "
					 "case 1 with it to tell which (a copy fails case 1 too)",
					 cr->obs_emails, eff, k, made_in_case, made_in_case == 1 ? "y" : "ies",
					 s->d[blamed].verdict, eff);
			return true;
		}
	}

	/* unclaimed: more effects than claims that ran, no verdict to blame */
	if (cr->obs_emails < 0 || cr->obs_emails <= made)
		return false;
	snprintf(out, sz, "%d %ss of %s were made where %d deliver%s ran through the claim%s, and no "
			 "other delivery claimed it: the job makes the %s somewhere without the claim (a copy of "
			 "itself it schedules that skips the claim)",
			 cr->obs_emails, eff, nk > 1 ? "the case's keys" : s->case_keys[c][0],
			 made, made == 1 ? "y" : "ies", at_end < cr->obs_emails ? ", the last after the case had ended" : "",
			 eff);
	return true;
}

/*
 * What the cells of a failing case show, when nothing else names its
 * defect: each cell that differs from what the policy gives
 */
static void
cells_said(const signoff_state *s, const case_result *cr, char *out, size_t sz)
{
	char		part[CELL * 2 + 80];

	out[0] = '\0';
	if (!cr->emails_ok && cr->obs_emails >= 0)
	{
		snprintf(part, sizeof(part), "%d %s%s where the policy gives %d", cr->obs_emails, effect_of(s),
				 cr->obs_emails == 1 ? "" : "s", cr->exp_emails);
		list_append(out, sz, part);
	}
	if (!cr->record_ok)
	{
		snprintf(part, sizeof(part), "the record %s where it gives %s", cr->obs_record, cr->exp_record);
		list_append(out, sz, part);
	}
	if (!cr->verdicts_ok)
	{
		snprintf(part, sizeof(part), "the verdicts %s where it gives %s", cr->obs_verdicts, cr->exp_verdicts);
		list_append(out, sz, part);
	}
	if (out[0] == '\0')
		copy_str(out, sz, "the case did not reach its end (see the notes below)");
}

/*
 * Each failing case of the policy opens with one sentence, "Diagnosis:
 * ...", the same in every case: the defect its steps named
 * (case_defect()); else the sentence the rules above derive; else the
 * first check that failed (its FAILED note, kept below); else what the
 * cells show. Called once per policy, after its cases and the drain,
 * before the policy is reported.
 */
void
diagnose_policy(const signoff_state *s, policy_result *pr)
{
	int			c;

	if (s->job->reference)
		return;
	for (c = 0; c < pr->ncases; c++)
	{
		case_result *cr = &pr->cases[c];
		char		sentence[900];
		StringInfoData notes;
		const char *failed;

		if (cr->pass || !cr->ran)
			continue;
		if (cr->defect[0])
			copy_str(sentence, sizeof(sentence), cr->defect);
		else if (diagnose_case(s, pr, c, sentence, sizeof(sentence)))
			;
		else if ((failed = strstr(cr->notes.data ? cr->notes.data : "", "FAILED: ")) != NULL)
		{
			size_t		n = strcspn(failed + 8, "\n");

			snprintf(sentence, sizeof(sentence), "%.*s", (int) n, failed + 8);
		}
		else
			cells_said(s, cr, sentence, sizeof(sentence));
		initStringInfo(&notes);
		appendStringInfo(&notes, "Diagnosis: %s%s", sentence,
				  sentence[0] && sentence[strlen(sentence) - 1] == '.' ? "" : ".");
		if (cr->notes.len)
		{
			appendStringInfoString(&notes, "\n");
			appendStringInfoString(&notes, cr->notes.data);
		}
		pfree(cr->notes.data);
		cr->notes = notes;
	}
}
