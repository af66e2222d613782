/*
 * test_protocol.c
 *	  Unit test of the protocol's decisions (src/protocol.c), without a
 *	  server: every policy x record state x call combination, each checked
 *	  against the README's tables, written here as data.
 *
 *	  make unit    builds it with the system compiler alone (no PostgreSQL
 *	               header, no backend) and runs it; exit 0 when all pass.
 *
 * The expectations are written out case by case (the verdict table, the
 * fenced calls' table, the resolutions), not computed by a second copy of
 * the decision, so a change in src/protocol.c that changes behaviour fails
 * here and names the combination.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "protocol.h"

static int	checks;
static int	failures;

static const char *const status_names[] = {"claimed", "completed", "released", "skipped"};
static const char *const policy_names[] = {"hold", "retry", "skip", "lookup"};
static const char *const step_names[] = {"answer", "hold", "insert", "take_over", "skip", "mismatch"};
static const char *const call_names[] = {"complete", "release", "extend"};
static const char *const fence_names[] = {"update", "repeat", "not_found (ID004)",
	"superseded (ID003)", "never_issued (22023)", "wrong_state (ID005)"};
static const char *const resolve_names[] = {"update", "not_found (ID004)", "not_waiting (ID005)"};

#define RUN_DIGEST		INT64_C(0x1111)
#define VERIFY_DIGEST	INT64_C(0x2222)
#define OTHER_DIGEST	INT64_C(0x3333)
#define NOW				INT64_C(1000000000)
#define ATTEMPT			2

/* where the claim is against its lease */
typedef enum Age
{
	AGE_YOUNG,					/* now < heartbeat + lease */
	AGE_EXPIRING,				/* now == heartbeat + lease: stale */
	AGE_OLD,					/* now > heartbeat + lease */
	AGE_COUNT
} Age;
static const char *const age_names[] = {"young", "at expiry", "stale"};
static const int64_t age_expiry[] = {NOW + 1, NOW, NOW - 600000000};

/* the record's delivery digest against the call's token */
typedef enum Delivery
{
	DEL_NONE_IN_CALL,			/* the call gives no token */
	DEL_NONE_IN_RECORD,			/* the record stores none */
	DEL_RUN,					/* the record stores this token's run digest */
	DEL_VERIFY,					/* ... its verify digest */
	DEL_OTHER,					/* ... another delivery's */
	DEL_COUNT
} Delivery;
static const char *const delivery_names[] = {"no token", "token, record has none",
	"token = record's (run)", "token = record's (verify)", "another token"};

/* max_attempts against the record's attempt (ATTEMPT) */
static const int32_t max_attempts_values[] = {0, ATTEMPT - 1, ATTEMPT, ATTEMPT + 1};
#define N_MAX (int) (sizeof(max_attempts_values) / sizeof(max_attempts_values[0]))

static void
fail(const char *what, const char *got, const char *want)
{
	failures++;
	if (failures <= 50)
		printf("not ok - %s: got %s, want %s\n", what, got, want);
}

static void
check_int(const char *what, const char *field, long got, long want)
{
	char		g[32];
	char		w[32];
	char		label[512];

	checks++;
	if (got == want)
		return;
	snprintf(g, sizeof(g), "%ld", got);
	snprintf(w, sizeof(w), "%ld", want);
	snprintf(label, sizeof(label), "%s: %s", what, field);
	fail(label, g, w);
}

static void
check_name(const char *what, const char *field, const char *const *names, int got, int want)
{
	char		label[512];

	checks++;
	if (got == want)
		return;
	snprintf(label, sizeof(label), "%s: %s", what, field);
	fail(label, names[got], names[want]);
}

/* One expected claim action */
typedef struct Want
{
	ClaimStep	step;
	ClaimVerdict verdict;
	int32_t		attempt;
	bool		with_result;
	bool		writes;			/* then check_busy follows wait and late */
	bool		verify;
} Want;

static const Want want_insert = {CLAIM_INSERT, VERDICT_RUN, 1, false, true, false};

static Want
want_answer(ClaimVerdict verdict, int32_t attempt)
{
	Want		w = {CLAIM_ANSWER, verdict, attempt, verdict == VERDICT_COMPLETED, false, false};

	return w;
}

/*
 * A stale claim: the README's policy table; retry and lookup are capped by
 * max_attempts (0: no cap), after which the claim is held.
 */
static Want
want_stale(StalePolicy policy, int32_t max_attempts)
{
	static const Want hold = {CLAIM_HOLD, VERDICT_HELD, ATTEMPT, false, false, false};
	static const Want retry = {CLAIM_TAKE_OVER, VERDICT_RUN, ATTEMPT + 1, false, true, false};
	static const Want skip = {CLAIM_SKIP, VERDICT_SKIPPED, ATTEMPT, false, true, false};
	static const Want lookup = {CLAIM_TAKE_OVER, VERDICT_VERIFY, ATTEMPT + 1, false, true, true};
	bool		attempts_left = max_attempts == 0 || ATTEMPT < max_attempts;

	switch (policy)
	{
		case STALE_HOLD:
			return hold;
		case STALE_RETRY:
			return attempts_left ? retry : hold;
		case STALE_SKIP:
			return skip;
		case STALE_LOOKUP:
			return attempts_left ? lookup : hold;
	}
	return hold;
}

/* A claim inside its lease: in_progress, unless it is this delivery's own */
static Want
want_young(Delivery d)
{
	switch (d)
	{
		case DEL_RUN:
			return want_answer(VERDICT_RUN, ATTEMPT);
		case DEL_VERIFY:
			return want_answer(VERDICT_VERIFY, ATTEMPT);
		default:
			return want_answer(VERDICT_IN_PROGRESS, ATTEMPT);
	}
}

static void
check_claim(const char *what, const ClaimRecord *rec, const ClaimRequest *req, const Want *w)
{
	ClaimAction a = idem_decide_claim(rec, req);

	check_name(what, "step", step_names, a.step, w->step);
	if (w->step == CLAIM_MISMATCH)
		return;
	check_name(what, "verdict", (const char *const[]) {"run", "verify", "completed",
					"in_progress", "held", "skipped"}, a.verdict, w->verdict);
	check_int(what, "attempt", a.attempt, w->attempt);
	check_int(what, "with_result", a.with_result, w->with_result);
	check_int(what, "check_busy", a.check_busy, w->writes && (!req->wait || req->late));
	check_int(what, "verify", a.verify, w->verify);
}

static void
make_request(Delivery d, bool wait, bool late, ClaimRequest *req)
{
	memset(req, 0, sizeof(*req));
	req->has_delivery = d != DEL_NONE_IN_CALL;
	req->run_digest = RUN_DIGEST;
	req->verify_digest = VERIFY_DIGEST;
	req->wait = wait;
	req->late = late;
}

/*
 * Every claim: no record, or a record in each status, at each age, with
 * and without another fingerprint, each delivery case, under each policy
 * and max_attempts, with wait true or false and met early or late.
 */
static int
test_claims(void)
{
	int			combinations = 0;
	int			wait;
	int			late;
	int			d;

	for (wait = 0; wait <= 1; wait++)
		for (late = 0; late <= 1; late++)
			for (d = 0; d < DEL_COUNT; d++)
			{
				ClaimRequest req;
				ClaimRecord rec;
				char		what[512];
				int			status;
				int			policy;
				int			age;
				int			fp;
				int			m;

				make_request(d, wait, late, &req);

				/* no record: insert, whatever the job type says */
				memset(&rec, 0, sizeof(rec));
				snprintf(what, sizeof(what), "claim, no record, %s, wait %d, late %d",
						 delivery_names[d], wait, late);
				check_claim(what, &rec, &req, &want_insert);
				combinations++;

				for (status = 0; status < OPERATION_STATUS_COUNT; status++)
					for (policy = 0; policy < STALE_POLICY_COUNT; policy++)
						for (m = 0; m < N_MAX; m++)
							for (age = 0; age < AGE_COUNT; age++)
								for (fp = 0; fp <= 1; fp++)
								{
									Want		w = {0};

									memset(&rec, 0, sizeof(rec));
									rec.found = true;
									rec.status = status;
									rec.attempt = ATTEMPT;
									rec.now = NOW;
									rec.expires_at = age_expiry[age];
									rec.fingerprint_differs = fp;
									rec.policy = policy;
									rec.max_attempts = max_attempts_values[m];
									rec.delivery_found = d != DEL_NONE_IN_RECORD;
									/*
									 * Without a token in the call, or a
									 * digest in the record, a stored run
									 * digest must not count.
									 */
									rec.delivery = d == DEL_VERIFY ? VERIFY_DIGEST :
										d == DEL_OTHER ? OTHER_DIGEST : RUN_DIGEST;

									if (fp)
									{
										w.step = CLAIM_MISMATCH;
									}
									else if (status == OPERATION_COMPLETED)
										w = want_answer(VERDICT_COMPLETED, ATTEMPT);
									else if (status == OPERATION_SKIPPED)
										w = want_answer(VERDICT_SKIPPED, ATTEMPT);
									else if (status == OPERATION_RELEASED)
									{
										Want		r = {CLAIM_TAKE_OVER, VERDICT_RUN, ATTEMPT + 1,
										false, true, false};

										w = r;
									}
									else if (age == AGE_YOUNG)
										w = want_young(d);
									else
										w = want_stale(policy, max_attempts_values[m]);

									snprintf(what, sizeof(what),
											 "claim, %s #%d, %s, %s, policy %s, max_attempts %d, %s, wait %d, late %d",
											 status_names[status], ATTEMPT, age_names[age],
											 fp ? "other fingerprint" : "same fingerprint",
											 policy_names[policy], max_attempts_values[m],
											 delivery_names[d], wait, late);
									check_claim(what, &rec, &req, &w);
									combinations++;
								}
			}
	return combinations;
}

/* A few claims spelled out in full, as the README's Quick start tells them */
static void
test_claim_examples(void)
{
	ClaimRecord rec = {0};
	ClaimRequest req = {0};
	ClaimAction a;

	/* a first delivery with wait => false: insert, checked for a busy key */
	req.wait = false;
	a = idem_decide_claim(&rec, &req);
	check_int("example: first claim", "insert", a.step == CLAIM_INSERT, 1);
	check_int("example: first claim", "check_busy", a.check_busy, 1);

	/* the same call again after a lost reply: the same verdict, no write */
	rec.found = true;
	rec.status = OPERATION_CLAIMED;
	rec.attempt = 1;
	rec.now = NOW;
	rec.expires_at = NOW + 600000000;
	rec.delivery_found = true;
	rec.delivery = RUN_DIGEST;
	req.has_delivery = true;
	req.run_digest = RUN_DIGEST;
	req.verify_digest = VERIFY_DIGEST;
	a = idem_decide_claim(&rec, &req);
	check_int("example: retried claim", "answer run #1",
			  a.step == CLAIM_ANSWER && a.verdict == VERDICT_RUN && a.attempt == 1, 1);

	/* a second worker's delivery meanwhile: in_progress */
	req.run_digest = OTHER_DIGEST;
	req.verify_digest = OTHER_DIGEST + 1;
	a = idem_decide_claim(&rec, &req);
	check_int("example: concurrent delivery", "in_progress",
			  a.step == CLAIM_ANSWER && a.verdict == VERDICT_IN_PROGRESS, 1);

	/* after the lease, lookup with max_attempts 3 at attempt 3: held */
	rec.expires_at = NOW - 1;
	rec.policy = STALE_LOOKUP;
	rec.max_attempts = 3;
	rec.attempt = 3;
	a = idem_decide_claim(&rec, &req);
	check_int("example: poison job", "held #3",
			  a.step == CLAIM_HOLD && a.verdict == VERDICT_HELD && a.attempt == 3, 1);

	check_int("verdict names", "run/verify/completed/in_progress/held/skipped",
			  strcmp(idem_verdict_name(VERDICT_RUN), "run") == 0 &&
			  strcmp(idem_verdict_name(VERDICT_VERIFY), "verify") == 0 &&
			  strcmp(idem_verdict_name(VERDICT_COMPLETED), "completed") == 0 &&
			  strcmp(idem_verdict_name(VERDICT_IN_PROGRESS), "in_progress") == 0 &&
			  strcmp(idem_verdict_name(VERDICT_HELD), "held") == 0 &&
			  strcmp(idem_verdict_name(VERDICT_SKIPPED), "skipped") == 0, 1);
}

/*
 * complete, release, extend_lease on each record: the README's ID003, ID004,
 * ID005 and 22023 rows. The outcome at the record's own attempt, by call
 * and status:
 */
static const FencedOutcome fenced_same_attempt[FENCED_CALL_COUNT][OPERATION_STATUS_COUNT] = {
	/* claimed, completed, released, skipped */
	[FENCED_COMPLETE] = {FENCE_UPDATE, FENCE_REPEAT, FENCE_WRONG_STATE, FENCE_UPDATE},
	[FENCED_RELEASE] = {FENCE_UPDATE, FENCE_WRONG_STATE, FENCE_REPEAT, FENCE_UPDATE},
	[FENCED_EXTEND] = {FENCE_UPDATE, FENCE_WRONG_STATE, FENCE_WRONG_STATE, FENCE_WRONG_STATE},
};

static int
test_fenced(void)
{
	int			combinations = 0;
	int			call;

	for (call = 0; call < FENCED_CALL_COUNT; call++)
	{
		FencedRecord rec = {0};
		char		what[256];
		int			status;
		int			delta;

		snprintf(what, sizeof(what), "%s, no record", call_names[call]);
		check_name(what, "outcome", fence_names, idem_decide_fenced(call, &rec, 1), FENCE_NOT_FOUND);
		combinations++;

		for (status = 0; status < OPERATION_STATUS_COUNT; status++)
		{
			/* accepted states agree with the outcome table */
			snprintf(what, sizeof(what), "%s accepts %s", call_names[call], status_names[status]);
			check_int(what, "accepts", idem_fenced_accepts(call, status),
					  fenced_same_attempt[call][status] == FENCE_UPDATE);

			for (delta = -1; delta <= 1; delta++)
			{
				FencedOutcome want = delta < 0 ? FENCE_SUPERSEDED :
					delta > 0 ? FENCE_NEVER_ISSUED : fenced_same_attempt[call][status];

				rec.found = true;
				rec.status = status;
				rec.attempt = ATTEMPT;
				snprintf(what, sizeof(what), "%s with attempt %d, record %s #%d",
						 call_names[call], ATTEMPT + delta, status_names[status], ATTEMPT);
				check_name(what, "outcome", fence_names,
						   idem_decide_fenced(call, &rec, ATTEMPT + delta), want);
				combinations++;
			}
		}
	}
	check_int("complete and release accept skipped", "skipped",
			  idem_fenced_accepts_skipped(FENCED_COMPLETE) &&
			  idem_fenced_accepts_skipped(FENCED_RELEASE) &&
			  !idem_fenced_accepts_skipped(FENCED_EXTEND), 1);
	return combinations;
}

/* resolve_operation(): only a stale claim or a skipped record waits */
static int
test_resolve(void)
{
	static const ResolveOutcome want[OPERATION_STATUS_COUNT][AGE_COUNT] = {
		/* young, at expiry, stale */
		[OPERATION_CLAIMED] = {RESOLVE_NOT_WAITING, RESOLVE_UPDATE, RESOLVE_UPDATE},
		[OPERATION_COMPLETED] = {RESOLVE_NOT_WAITING, RESOLVE_NOT_WAITING, RESOLVE_NOT_WAITING},
		[OPERATION_RELEASED] = {RESOLVE_NOT_WAITING, RESOLVE_NOT_WAITING, RESOLVE_NOT_WAITING},
		[OPERATION_SKIPPED] = {RESOLVE_UPDATE, RESOLVE_UPDATE, RESOLVE_UPDATE},
	};
	ClaimRecord rec = {0};
	int			combinations = 0;
	int			status;
	int			age;

	check_name("resolve, no record", "outcome", resolve_names,
			   idem_decide_resolve(&rec), RESOLVE_NOT_FOUND);
	combinations++;
	for (status = 0; status < OPERATION_STATUS_COUNT; status++)
		for (age = 0; age < AGE_COUNT; age++)
		{
			char		what[256];

			rec.found = true;
			rec.status = status;
			rec.attempt = ATTEMPT;
			rec.now = NOW;
			rec.expires_at = age_expiry[age];
			snprintf(what, sizeof(what), "resolve, %s, %s", status_names[status], age_names[age]);
			check_name(what, "outcome", resolve_names, idem_decide_resolve(&rec), want[status][age]);
			combinations++;
		}
	return combinations;
}

int
main(void)
{
	int			claims = test_claims();
	int			fenced = test_fenced();
	int			resolves = test_resolve();

	test_claim_examples();
	printf("# claim: %d combinations; complete/release/extend_lease: %d; resolve: %d\n",
		   claims, fenced, resolves);
	if (failures > 0)
	{
		printf("FAIL: %d of %d checks failed\n", failures, checks);
		return 1;
	}
	printf("ok - protocol decisions: %d combinations, %d checks passed\n",
		   claims + fenced + resolves, checks);
	return 0;
}
