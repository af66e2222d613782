/*
 * jobfile.c
 *		A sign-off run's job file (docs/signoff.md): name = value lines,
 *		read and checked before anything starts.
 */
#include "postgres_fe.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/logging.h"
#include "matrix.h"

const char *const job_field_names[N_JOB_FIELDS] = {
	"queue", "job_type", "worker", "enqueue", "enqueue_other", "effects",
	"effects_sql", "policies", "lease", "timeout", "dir", "transactional", "key", "key_command", "code", "effect_name", "cleanup", "drain", "effect", "batch"
};

static const bool job_field_required[N_JOB_FIELDS] = {
	true, true, true, true, false, false, false, false, false, false, false, false, false, false, false, false, false, false, false, false
};

static const char *const job_field_what[N_JOB_FIELDS] = {
	"the queue system, for the report",
	"the job type your code passes to the helper",
	"the command that starts one worker process of your app",
	"the command that enqueues one message for {key}",
	"the command that enqueues a message for {key} with other arguments",
	"the command that prints the number of effects of {key}",
	"an SQL query with $1 for the key that answers the number of effects",
	"the policies to run",
	"the run's lease in seconds",
	"the longest wait for one step, in seconds",
	"the directory the commands run in",
	"yes: the effect is a row written in the completion's transaction",
	"the operation key your code claims, as a template with {key}",
	"the command that prints the operation key your code claims for {key}",
	"the job's code, as paths or globs: the report records their sha256",
	"the job's effect in a word or two (refund, confirmation email), for the report's sentences",
	"the command that removes what the run left in your queue, run at the end",
	"after a policy's cases, how long no delivery may arrive before the run judges the cases again, in seconds",
	"http or smtp: the run's own endpoint is the provider, counts the effects and fails on cue",
	"yes: the worker takes several messages in one receive (a batch handler)",
};

/* ---------------------------------------------------------------------
 * The job file
 * --------------------------------------------------------------------- */

static void job_error(const signoff_job *job, int line, const char *fmt,...) MX_PRINTF(3, 4);

/* the one sentence of a job file that cannot run */
static void
job_error(const signoff_job *job, int line, const char *fmt,...)
{
	va_list		ap;
	char		sentence[4096];

	va_start(ap, fmt);
	vsnprintf(sentence, sizeof(sentence), fmt, ap);
	va_end(ap);
	if (line > 0)
		pg_log_error("%s line %d: %s", job->path, line, sentence);
	else
		pg_log_error("%s: %s", job->path, sentence);
}

/*
 * Read and check the job file; 0, or 2 after one sentence on stderr naming
 * what is wrong (nothing has started yet).
 */
int
signoff_load_job(const char *path, signoff_job *job)
{
	FILE	   *f;
	char	   *line = NULL;
	size_t		cap = 0;
	int			lineno = 0;
	int			i;
	char		base[1024];
	char	   *slash;
	static const job_field keyed[] = {JF_ENQUEUE, JF_ENQUEUE_OTHER, JF_EFFECTS, JF_KEY, JF_KEY_COMMAND};

	memset(job, 0, sizeof(*job));
	copy_str(job->path, sizeof(job->path), path);
	f = fopen(path, "r");
	if (f == NULL)
	{
		pg_log_error("cannot read the job file %s: %s", path, strerror(errno));
		return 2;
	}
	while (getline(&line, &cap, f) >= 0)
	{
		char	   *p;
		char	   *eq;
		char	   *name;
		char	   *value;

		lineno++;
		p = trim(line);
		if (*p == '\0' || *p == '#')
			continue;
		eq = strchr(p, '=');
		if (eq == NULL)
		{
			job_error(job, lineno, "\"%s\" has no \"=\" (each line is name = value)", p);
			goto bad;
		}
		*eq = '\0';
		name = trim(p);
		value = trim(eq + 1);
		for (i = 0; i < N_JOB_FIELDS; i++)
			if (strcmp(name, job_field_names[i]) == 0)
				break;
		if (i == N_JOB_FIELDS)
		{
			char		names[300] = "";
			int			k;

			for (k = 0; k < N_JOB_FIELDS; k++)
			{
				if (k > 0)
					strncat(names, k == N_JOB_FIELDS - 1 ? " and " : ", ", sizeof(names) - strlen(names) - 1);
				strncat(names, job_field_names[k], sizeof(names) - strlen(names) - 1);
			}
			job_error(job, lineno, "unknown name \"%s\" (the names are %s)", name, names);
			goto bad;
		}
		if (job->line[i])
		{
			job_error(job, lineno, "\"%s\" is given twice (also on line %d)", name, job->line[i]);
			goto bad;
		}
		if (*value == '\0')
		{
			job_error(job, lineno, "\"%s\" has no value (%s)", name, job_field_what[i]);
			goto bad;
		}
		job->value[i] = pg_strdup(value);
		job->line[i] = lineno;
	}
	free(line);
	line = NULL;
	fclose(f);
	f = NULL;

	for (i = 0; i < N_JOB_FIELDS; i++)
		if (job_field_required[i] && job->value[i] == NULL)
		{
			job_error(job, 0, "no \"%s\" line (%s)", job_field_names[i], job_field_what[i]);
			return 2;
		}
	if (strpbrk(job->value[JF_JOB_TYPE], ",= \t") != NULL)
	{
		job_error(job, job->line[JF_JOB_TYPE], "the job type \"%s\" cannot be mapped to the run's "
				  "(IDEMPOTENCY_SIGNOFF_JOB_TYPES): it contains a comma, \"=\" or a space",
				  job->value[JF_JOB_TYPE]);
		return 2;
	}
	for (i = 0; i < (int) (sizeof(keyed) / sizeof(keyed[0])); i++)
		if (job->value[keyed[i]] && strstr(job->value[keyed[i]], "{key}") == NULL)
		{
			job_error(job, job->line[keyed[i]], "\"%s\" has no {key} (%s)",
					  job_field_names[keyed[i]], job_field_what[keyed[i]]);
			return 2;
		}
	if (job->value[JF_EFFECT_NAME])
	{
		const char *e = job->value[JF_EFFECT_NAME];

		if (strlen(e) > 40 || strspn(e, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 -_") != strlen(e))
		{
			job_error(job, job->line[JF_EFFECT_NAME],
					  "effect_name \"%s\" is not a word or two (letters, digits, blanks, - and _; at most 40)", e);
			return 2;
		}
	}
	if (job->value[JF_KEY] && job->value[JF_KEY_COMMAND])
	{
		job_error(job, job->line[JF_KEY_COMMAND], "give key or key_command, not both (key is on line %d)",
				  job->line[JF_KEY]);
		return 2;
	}
	if (job->value[JF_EFFECTS] && job->value[JF_EFFECTS_SQL])
	{
		job_error(job, job->line[JF_EFFECTS_SQL], "give effects or effects_sql, not both (effects is on line %d)",
				  job->line[JF_EFFECTS]);
		return 2;
	}
	if (job->value[JF_EFFECTS_SQL] && strstr(job->value[JF_EFFECTS_SQL], "$1") == NULL)
	{
		job_error(job, job->line[JF_EFFECTS_SQL], "effects_sql has no $1 (the operation key)");
		return 2;
	}
	if (job->value[JF_BATCH])
	{
		const char *b = job->value[JF_BATCH];

		if (strcmp(b, "yes") == 0)
			job->batch = true;
		else if (strcmp(b, "no") != 0)
		{
			job_error(job, job->line[JF_BATCH], "batch \"%s\" is not yes or no", b);
			return 2;
		}
	}
	if (job->value[JF_EFFECT])
	{
		const char *e = job->value[JF_EFFECT];

		if (strcmp(e, "http") == 0)
			job->effect = EFFECT_HTTP;
		else if (strcmp(e, "smtp") == 0)
			job->effect = EFFECT_SMTP;
		else
		{
			job_error(job, job->line[JF_EFFECT], "effect \"%s\" is not http or smtp (the run's own endpoint "
					  "your job sends its effect to)", e);
			return 2;
		}
		if (job->value[JF_EFFECTS] || job->value[JF_EFFECTS_SQL])
		{
			job_field other = job->value[JF_EFFECTS] ? JF_EFFECTS : JF_EFFECTS_SQL;

			job_error(job, job->line[other], "give effect or %s, not both: with effect = %s the run's "
					  "endpoint counts the effects (effect is on line %d)",
					  job_field_names[other], e, job->line[JF_EFFECT]);
			return 2;
		}
		if (job->value[JF_TRANSACTIONAL] && strcmp(job->value[JF_TRANSACTIONAL], "yes") == 0)
		{
			job_error(job, job->line[JF_TRANSACTIONAL], "transactional = yes and effect = %s exclude each "
					  "other: a transactional job's effect is a row, counted by effects_sql", e);
			return 2;
		}
	}
	job->effects_source = job->effect == EFFECT_HTTP ? "http endpoint" :
		job->effect == EFFECT_SMTP ? "smtp endpoint" :
		job->value[JF_EFFECTS] ? "command" :
		job->value[JF_EFFECTS_SQL] ? "sql" : "handled reports";
	if (job->value[JF_TRANSACTIONAL])
	{
		const char *t = job->value[JF_TRANSACTIONAL];

		if (strcmp(t, "yes") == 0)
			job->transactional = true;
		else if (strcmp(t, "no") != 0)
		{
			job_error(job, job->line[JF_TRANSACTIONAL], "transactional \"%s\" is not yes or no", t);
			return 2;
		}
		if (job->transactional && job->value[JF_EFFECTS_SQL] == NULL)
		{
			job_error(job, job->line[JF_TRANSACTIONAL],
					  "transactional = yes needs effects_sql (the query that counts the rows your job writes "
					  "in the completion's transaction)");
			return 2;
		}
	}
	if (job->value[JF_POLICIES])
	{
		if (!parse_policies(job->value[JF_POLICIES], job->want))
		{
			job_error(job, job->line[JF_POLICIES], "policies \"%s\" is not a list of hold, retry, skip, lookup, all",
					  job->value[JF_POLICIES]);
			return 2;
		}
	}
	else
	{
		job->want[POLICY_HOLD] = job->want[POLICY_RETRY] = job->want[POLICY_SKIP] = true;
		job->want[POLICY_LOOKUP] = false;
	}
	job->lease_s = 3.0;
	if (job->value[JF_LEASE] && !parse_lease(job->value[JF_LEASE], &job->lease_s))
	{
		job_error(job, job->line[JF_LEASE], "lease \"%s\" is not a number of seconds between 0.1 and 600",
				  job->value[JF_LEASE]);
		return 2;
	}
	job->timeout_s = 30.0;
	if (job->value[JF_TIMEOUT])
	{
		char	   *end;

		errno = 0;
		job->timeout_s = strtod(job->value[JF_TIMEOUT], &end);
		if (end == job->value[JF_TIMEOUT] || *trim(end) != '\0' || errno != 0 ||
			!(job->timeout_s >= 1.0 && job->timeout_s <= 3600.0))
		{
			job_error(job, job->line[JF_TIMEOUT], "timeout \"%s\" is not a number of seconds between 1 and 3600",
					  job->value[JF_TIMEOUT]);
			return 2;
		}
	}
	/*
	 * The drain's default fits the queue's usual delay before a failed
	 * message comes again: Sidekiq's first retry 15-25 s after the failure,
	 * SQS's visibility timeout (30 s unless the queue says otherwise);
	 * elsewhere (Celery's helper retries after half the lease) 5 s.
	 */
	job->drain_s = strcmp(job->value[JF_QUEUE], "sidekiq") == 0 || strcmp(job->value[JF_QUEUE], "sqs") == 0 ? 30.0 : 5.0;
	if (job->value[JF_DRAIN])
	{
		char	   *end;

		errno = 0;
		job->drain_s = strtod(job->value[JF_DRAIN], &end);
		if (end == job->value[JF_DRAIN] || *trim(end) != '\0' || errno != 0 ||
			!(job->drain_s >= 0.0 && job->drain_s <= 3600.0))
		{
			job_error(job, job->line[JF_DRAIN], "drain \"%s\" is not a number of seconds between 0 and 3600",
					  job->value[JF_DRAIN]);
			return 2;
		}
	}

	/* the directory the commands run in: dir, or the job file's */
	copy_str(base, sizeof(base), path);
	slash = strrchr(base, '/');
	if (slash == NULL)
		copy_str(base, sizeof(base), ".");
	else if (slash == base)
		base[1] = '\0';
	else
		*slash = '\0';
	{
		char		want_dir[2100];
		char		real[PATH_MAX];
		struct stat st;

		if (job->value[JF_DIR] && job->value[JF_DIR][0] == '/')
			copy_str(want_dir, sizeof(want_dir), job->value[JF_DIR]);
		else if (job->value[JF_DIR])
			snprintf(want_dir, sizeof(want_dir), "%s/%s", base, job->value[JF_DIR]);
		else
			copy_str(want_dir, sizeof(want_dir), base);
		if (realpath(want_dir, real) == NULL || stat(real, &st) != 0 || !S_ISDIR(st.st_mode))
		{
			job_error(job, job->line[JF_DIR], "the directory %s (%s) is not there: %s",
					  want_dir, job->value[JF_DIR] ? "dir" : "the job file's",
					  errno ? strerror(errno) : "not a directory");
			return 2;
		}
		copy_str(job->dir, sizeof(job->dir), real);
	}
	{
		char		err[1400];

		if (!provenance_collect(job->path, job->dir, job->value[JF_CODE], &job->prov, err, sizeof(err)))
		{
			job_error(job, job->line[JF_CODE], "%s", err);
			return 2;
		}
	}
	return 0;

bad:
	free(line);
	if (f)
		fclose(f);
	return 2;
}
