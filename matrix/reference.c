/*
 * reference.c
 *		The reference run: the seed's job signed off through the sign-off
 *		engine (engine.c, case_steps.c), with a job file built in.
 *
 * The job is reference_job.c's: send_confirmation for ORD-1001 (and
 * ORD-1002 in case 4), one email per order through the fake mail provider,
 * worker processes of the runner's own binary that speak the sign-off
 * protocol, and a queue in a directory. Each case works in its own job type
 * (<prefix>_<policy>_<case>) with its own mailbox, so the cases cannot see
 * each other and the keys can be the seed's own.
 *
 * What differs from a user's sign-off is what this job's worker can do:
 * case 8 (its transactional mode: the effect is a row written in the
 * completion's transaction) and case 3s (--stress workers at once). The
 * cases themselves, their steps and their expectations are the engine's
 * and case_table.c's, as for any job.
 */
#include "postgres_fe.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/logging.h"
#include "matrix.h"

/* the reference run's job, as a job file would give it */
static signoff_job reference;

/* does the reference run (--cases, --stress) have case c? */
int
reference_count_cases(const matrix_ctx *ctx)
{
	int			k,
				n = 0;

	reference.reference = true;
	reference.stress = ctx->stress;
	for (k = 0; k < n_case_table; k++)
		if (signoff_case_wanted(ctx->cases, &reference, &case_table[k]))
			n++;
	return n;
}

/* the reference run's first lines */
static void
reference_banner(const matrix_ctx *ctx, const signoff_job *job)
{
	printf("%sReplay matrix%s: send_confirmation for ORD-1001, idempotency %s (%s edition) on PostgreSQL %s\n",
		   ctx->color ? "\033[1m" : "", ctx->color ? "\033[0m" : "",
		   ctx->ext_version, ctx->ext_edition, ctx->server_version);
	printf("server %s; lease %s; stress %d workers; %s\n",
		   ctx->server_desc, ctx->lease_sql, job->stress, ctx->started_at);
	printf("job types %s_<policy>_<case>, mailboxes in %s: %s\n",
		   ctx->prefix, ctx->maildir, ctx->keep ? "kept (--keep)" : "removed at the end");
	fflush(stdout);
}

/* "'<runner>' --reference-job=WHAT --reference-dir='<dir>' ..." */
static char *
command(const matrix_ctx *ctx, const char *self, const char *what, bool keyed)
{
	StringInfoData b;

	initStringInfo(&b);
	shell_quote(&b, self);
	appendStringInfo(&b, " --reference-job=%s --reference-dir=", what);
	shell_quote(&b, ctx->maildir);
	if (ctx->effects_table[0])
	{
		appendStringInfoString(&b, " --reference-table=");
		shell_quote(&b, ctx->effects_table);
	}
	if (keyed)
		appendStringInfoString(&b, " {key}");
	return b.data;
}

/*
 * The reference run: every wanted policy, every selected case, the report.
 * check_as >= 0: every policy checked against that one's expectations. The
 * exit status (report_all()'s), 2 when it cannot start, 130 interrupted.
 */
int
reference_run(matrix_ctx *ctx, const bool *want, int check_as, const char *html,
			  const char *json)
{
	char		self[PATH_MAX];
	ssize_t		n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	const char *subdirs[] = {"queue", "mail"};
	size_t		i;
	int			rc;

	if (n <= 0)
	{
		pg_log_error("cannot find its own program (/proc/self/exe): %s",
				strerror(errno));
		return 2;
	}
	self[n] = '\0';
	for (i = 0; i < sizeof(subdirs) / sizeof(subdirs[0]); i++)
	{
		char		d[600];

		snprintf(d, sizeof(d), "%s/%s", ctx->maildir, subdirs[i]);
		if (mkdir(d, 0700) != 0)
		{
			pg_log_error("cannot create %s: %s", d, strerror(errno));
			return 2;
		}
	}

	memset(&reference, 0, sizeof(reference));
	copy_str(reference.path, sizeof(reference.path), "(the reference job, built in)");
	reference.value[JF_QUEUE] = (char *) "a directory";
	reference.value[JF_JOB_TYPE] = (char *) "send_confirmation";
	reference.value[JF_WORKER] = command(ctx, self, "worker", false);
	reference.value[JF_ENQUEUE] = command(ctx, self, "enqueue", true);
	reference.value[JF_ENQUEUE_OTHER] = command(ctx, self, "enqueue-other", true);
	reference.value[JF_EFFECTS] = command(ctx, self, "effects", true);
	copy_str(reference.dir, sizeof(reference.dir), ctx->maildir);
	reference.lease_s = ctx->lease_s;
	reference.timeout_s = ctx->timeout_s;
	reference.effects_source = "command";
	reference.reference = true;
	reference.stress = ctx->stress;
	reference_banner(ctx, &reference);
	rc = signoff_run(ctx, &reference, want, check_as, html, json);
	pg_free(reference.value[JF_WORKER]);
	pg_free(reference.value[JF_ENQUEUE]);
	pg_free(reference.value[JF_ENQUEUE_OTHER]);
	pg_free(reference.value[JF_EFFECTS]);
	return rc;
}
