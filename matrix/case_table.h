/*
 * case_table.h
 *		The replay cases, written once (case_table.c), and a case's result.
 *
 * Depends only on util.h. The reference run (reference.c) and the sign-off
 * run (case_steps.c) take each case's title and expectations from here, and
 * the docs' case tables are printed from it (--list-cases).
 */
#ifndef IDEMPOTENCY_MATRIX_CASE_TABLE_H
#define IDEMPOTENCY_MATRIX_CASE_TABLE_H

#include "util.h"

typedef enum policy_t
{
	POLICY_HOLD,
	POLICY_RETRY,
	POLICY_SKIP,
	POLICY_LOOKUP,
	N_POLICIES
} policy_t;

extern const char *const policy_names[N_POLICIES];
extern const char *const policy_blurbs[N_POLICIES];
extern const char *const policy_blurbs_job[N_POLICIES];
int			policy_by_name(const char *s);
bool		parse_policies(const char *list, bool *want);
/* the next item of a job file's list (commas and blanks alike), or NULL */
char	   *job_list_next(char **cursor);

/* what one policy must give in one case */
typedef struct case_expect
{
	int			effects;		/* emails (reference), effects (sign-off) */
	const char *record;			/* "completed #2" */
	const char *verdicts;		/* "run (killed), run" */
	const char *text;			/* the seed's "expected" words */
} case_expect;

/* which runs have the case */
#define RUN_REFERENCE	0x1
#define RUN_SIGNOFF		0x2
#define RUN_BOTH		(RUN_REFERENCE | RUN_SIGNOFF)
#define RUN_TX			0x4		/* a transactional job's (transactional = yes) */
#define RUN_EFFECT		0x8		/* a job whose provider is the run's endpoint (effect = http, smtp) */
#define RUN_BATCH		0x10	/* a batch handler's (batch = yes) */

typedef struct case_spec
{
	const char *id;				/* "1", "3s", "7a", ... */
	const char *title;			/* with {effect} and {item} */
	unsigned	runs_in;		/* RUN_* */
	int			nkeys;			/* operation keys the case uses */
	const char *proves;			/* docs/replay-matrix.md */
	const char *steps;			/* what a sign-off run does: docs/signoff.md */
	case_expect expect[N_POLICIES];

	/*
	 * The case whose expectation holds once the lease has run out and the
	 * queue delivered the message again (7a, 7b: 5, 6; 13, where a broker
	 * requeues a killed worker's message: 5), for a sign-off's drain; NULL:
	 * the case's own holds for good
	 */
	const char *settles_as;
} case_spec;

extern const case_spec case_table[];
extern const int n_case_table;

/* the words a run fills a title with */
typedef struct case_words
{
	const char *effect;			/* "email", "effect" */
	const char *item;			/* "order ORD-1002", "key" */
} case_words;

/* one row of the matrix: a case under one policy */
#define CELL 192

typedef struct case_result
{
	const char *id;				/* "1", "3s", "7a", ... */
	char		title[96];		/* "first delivery" */
	char		expected_text[96];	/* the seed's "expected" words */
	int			exp_emails;
	int			obs_emails;		/* -1: not observed */
	char		exp_record[CELL];
	char		obs_record[CELL];
	char		exp_verdicts[CELL];
	char		obs_verdicts[CELL];
	bool		emails_ok;
	bool		record_ok;
	bool		verdicts_ok;
	bool		checks_ok;		/* the checks behind the notes */
	bool		ran;
	bool		pass;
	StringInfoData notes;			/* what else was checked; why a cell failed */
	char		defect[700];	/* a sign-off's: the job's defect as the case's steps named it
								 * (case_defect()); diagnosis.c makes it the case's Diagnosis */
	double		seconds;
	/* a sign-off's judged points: the effects when the case ended, after the drain (-1: none) */
	int			at_end;
	int			after_drain;
	int			late;			/* deliveries of its keys that came after it */
	char		ending[600];	/* how the job ended the operation, where the case names it (16) */
} case_result;

#define MAX_CASES 24

typedef struct policy_result
{
	policy_t	policy;			/* configured in the job types */
	policy_t	checked_as;		/* whose expectations were checked */
	int			ncases;
	case_result cases[MAX_CASES];
	double		seconds;
} policy_result;

const case_spec *case_by_id(const char *id);
void		case_expectations(const case_spec *c, policy_t as, const case_words *words,
							  int stress, bool utf8, case_result *cr);
bool		case_selected(const char *list, const char *id);
void		case_finish(case_result *cr);
void		case_note(case_result *cr, const char *fmt,...) MX_PRINTF(2, 3);
void		case_vnote(case_result *cr, const char *fmt, va_list ap) MX_PRINTF(2, 0);
void		case_vfail(case_result *cr, const char *fmt, va_list ap) MX_PRINTF(2, 0);
void		case_fail(case_result *cr, const char *fmt,...) MX_PRINTF(2, 3);
int			case_table_list(const char *what);

#endif							/* IDEMPOTENCY_MATRIX_CASE_TABLE_H */
