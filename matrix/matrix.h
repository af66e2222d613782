/*
 * matrix.h
 *		The replay matrix runner: shared types.
 *
 * idempotency-matrix is a libpq client, not part of the extension. It runs
 * the seed's reference job (send_confirmation for ORD-1001, ORD-1002, ...)
 * through real worker processes, kills them at exact points, and checks the
 * emails, the record and the verdicts against each stale-claim policy.
 *
 * Files, each depending only on those listed after it (test/matrix/run.sh
 * checks that no two call each other, with nm and tsort):
 *	main.c		options, connection, cleanup; starts one of the two runs
 *	reference.c	the reference run: the seed's job signed off through the
 *				engine, with a job file built in
 *	case_steps.c	the steps of each case, and the run over the policies
 *				and cases (signoff_run): a user's job (--job) or the
 *				reference job
 *	diagnosis.c	what a failing case says the job did wrong, one sentence
 *				from what the engine observed (diagnosis.h)
 *	engine.c	the engine: a job's worker processes, the protocol's socket,
 *				its commands, the waits, the kills at the protocol's
 *				points, what a case observed (engine.h, its own)
 *	reference_job.c	the reference job: its worker (speaking the sign-off
 *				protocol), its queue (a directory), its effects
 *	reference_provider.c	its fake mail provider: an append-only, fsync'd file
 *	guardian.c	a process that cleans up after a runner killed with SIGKILL
 *	jobfile.c	the sign-off run's job file
 *	provenance.c	the job file's and the code's digests; --verify
 *	json.c		JSON read with libpgcommon's parser (json.h): the protocol's
 *				lines, --verify's report
 *	db.c		what both runs read in the database: records, stale_claims()
 *	report.c	progress lines, terminal tables, --html and --json
 *	case_table.c	the cases: each one's title, steps and expectations,
 *				written once (case_table.h)
 *	util.c		strings, escaping, clocks, interruption, SHA-256 (util.h)
 */
#ifndef IDEMPOTENCY_MATRIX_H
#define IDEMPOTENCY_MATRIX_H

#include <sys/types.h>

#include "libpq-fe.h"

#include "case_table.h"
#include "effect.h"
#include "util.h"

#ifndef MATRIX_VERSION			/* matrix/Makefile passes idempotency.control's */
#define MATRIX_VERSION "unknown"
#endif

/*
 * A sign-off run's job file (docs/signoff.md): name = value lines. The
 * values are kept as given; NULL where a field is absent.
 */
typedef enum job_field
{
	JF_QUEUE,
	JF_JOB_TYPE,
	JF_WORKER,
	JF_ENQUEUE,
	JF_ENQUEUE_OTHER,
	JF_EFFECTS,
	JF_EFFECTS_SQL,
	JF_POLICIES,
	JF_LEASE,
	JF_TIMEOUT,
	JF_DIR,
	JF_TRANSACTIONAL,
	JF_KEY,
	JF_KEY_COMMAND,
	JF_CODE,
	JF_EFFECT_NAME,
	JF_CLEANUP,
	JF_DRAIN,
	JF_EFFECT,
	JF_BATCH,
	N_JOB_FIELDS
} job_field;

extern const char *const job_field_names[N_JOB_FIELDS];

/* what a sign-off report says was signed (provenance.c) */
typedef struct code_file
{
	char		path[1024];		/* relative to the commands' directory */
	char		sha256[65];
} code_file;

typedef struct provenance
{
	char		job_file[4096]; /* absolute */
	char		job_sha256[65];
	char		dir[1024];
	code_file  *files;			/* the job file's code, sorted by path */
	int			nfiles;
	int			cap;
	char		code_sha256[65];	/* "": no code named */
	char		git_commit[64]; /* "": not in a git work tree */
	int			git_dirty;		/* -1 unknown, 0 clean, 1 dirty */
} provenance;

typedef struct signoff_job
{
	char		path[1024];		/* the job file, as given */
	char	   *value[N_JOB_FIELDS];
	int			line[N_JOB_FIELDS]; /* where each was given; 0: absent */
	char		dir[1024];		/* where the commands run, absolute */
	bool		want[N_POLICIES];	/* the job file's policies */
	double		lease_s;
	double		timeout_s;
	double		drain_s;		/* after a policy's cases: quiet this long */
	const char *effects_source; /* "command", "sql" or "handled reports" */

	/*
	 * The built-in reference job (reference.c), not a file: the seed's keys
	 * (ORD-1001, ORD-1002) in a job type per case, the seed's words, and
	 * its worker's capabilities: case 8 (its transactional mode) and 3s
	 * (stress workers at once; 0: not run).
	 */
	bool		reference;
	int			stress;

	/*
	 * transactional = yes: the job's effect is a row written in the
	 * completion's transaction (counted by effects_sql), so it has case 8
	 * and none of the cases whose death leaves a committed claim
	 */
	bool		transactional;

	/*
	 * effect = http / smtp: the run's own endpoint is the provider (effect.c);
	 * it counts the effects, and the cases of faults at the effect run
	 */
	effect_kind effect;

	/* batch = yes: the worker takes several messages in one receive (case 20) */
	bool		batch;

	provenance	prov;			/* the job file's and the code's digests */
} signoff_job;

typedef struct matrix_ctx
{
	PGconn	   *conn;			/* the runner's own (control) connection */
	const char *dsn;			/* NULL: libpq environment variables */
	double		lease_s;
	char		lease_sql[32];	/* "2 seconds" */
	int			stress;			/* workers in case 3s; 0 skips it */
	const char *cases;			/* --cases as given; NULL: all */
	const char *junit;			/* --junit FILE; NULL: none */
	char		cleanup_said[600];	/* the job file's cleanup: how it ended; "" none */
	char		run_id[32];
	char		prefix[64];		/* job type prefix, unique to this run */
	char		maildir[256];
	char		effects_table[300]; /* quoted, qualified; "" until created */
	char		effects_error[1024];
	bool		color;
	bool		utf8;
	bool		progress;
	bool		progress_tty;
	bool		keep;
	double		timeout_s;		/* longest wait for one worker event */

	/* what the report shows */
	char		started_at[40];
	char		ext_edition[32];	/* idempotency.edition(): "c" or "portable" */
	char		ext_version[64];
	char		server_version[64];
	char		server_version_full[256];
	char		server_desc[256];	/* host, port, database, user */
	char		isolation[64];
	char		check_as_note[128];
	char		interrupted[300];	/* "": ran to its end; else "by SIGINT after ..." */
	double		seconds;
	int			worker_processes;	/* the worker processes the run started */

	/* a sign-off run (--job); NULL: the reference run */
	const signoff_job *job;
	char		signoff_dir[256];	/* its socket and worker logs */
} matrix_ctx;

/* db.c */
PGresult   *db_exec(matrix_ctx *ctx, const char *sql, int nparams,
					 const char *const *params);
const char *case_sql_error(PGresult *res, matrix_ctx *ctx);
bool		job_type_register(matrix_ctx *ctx, const char *job_type, policy_t policy,
							  char *err, size_t esz);
PGresult   *record_query(matrix_ctx *ctx, const char *job_type, const char *key);
PGresult   *stale_claim_query(matrix_ctx *ctx, const char *job_type, const char *key);
void		record_text_of(matrix_ctx *ctx, case_result *cr, const char *job_type,
						   const char *key, char *buf, size_t sz,
						   char *result, size_t rsz);
int			stale_listed(matrix_ctx *ctx, case_result *cr, const char *job_type,
						 const char *key);
bool		stale_wait(matrix_ctx *ctx, case_result *cr, const char *job_type,
					   const char *key, const char *policy_name,
					   void (*idle) (void *arg, int ms), void *idle_arg);

/* reference_job.c */
int			reference_job_main(const char *what, const char *dir, const char *table,
							   const char *key);

/* reference.c */
int			reference_count_cases(const matrix_ctx *ctx);
int			reference_run(matrix_ctx *ctx, const bool *want, int check_as,
						  const char *html, const char *json);

/* reference_provider.c */
int			provider_send(const char *mailbox, bool with_ref, const char *key,
						  const char *worker, int attempt,
						  char *message_id, size_t idsz);
int			provider_lookup(const char *mailbox, const char *key);
int			provider_count(const char *mailbox, const char *key);

/* guardian.c */
bool		guardian_start(void);
void		guardian_group(pid_t pgid);
void		guardian_gone(pid_t pgid);
void		guardian_dir(const char *path);
void		guardian_done(void);

/* provenance.c */
bool		provenance_collect(const char *job_file, const char *dir, const char *code,
							   provenance *pv, char *err, size_t esz);
void		provenance_free(provenance *pv);
int			provenance_verify(const char *report);

/* jobfile.c */
int			signoff_load_job(const char *path, signoff_job *job);

/* case_steps.c */
int			signoff_count_cases(const char *cases, const signoff_job *job);
int			signoff_run(matrix_ctx *ctx, const signoff_job *job, const bool *want,
						int check_as, const char *html, const char *json);
bool		signoff_case_wanted(const char *cases, const signoff_job *job,
								const case_spec *c);

/* engine.c */
void		signoff_kill_all(matrix_ctx *ctx);
void		signoff_remove_dir(matrix_ctx *ctx, bool keep_logs);

/* report.c */
void		progress(matrix_ctx *ctx, const char *fmt,...) MX_PRINTF(2, 3);
void		progress_clear(matrix_ctx *ctx);
int			report_all(matrix_ctx *ctx, policy_result *prs, int npr,
					   const char *html, const char *json);
void		report_policy(matrix_ctx *ctx, const policy_result *pr);
void		report_summary(matrix_ctx *ctx, const policy_result *prs, int npr,
						   int *passed, int *failed);
const char *effect_word(const matrix_ctx *ctx);
int			report_html(matrix_ctx *ctx, const char *path,
						const policy_result *prs, int npr);
int			report_json(matrix_ctx *ctx, const char *path,
						const policy_result *prs, int npr);
int			report_junit(matrix_ctx *ctx, const char *path,
						 const policy_result *prs, int npr);

#endif							/* IDEMPOTENCY_MATRIX_H */
