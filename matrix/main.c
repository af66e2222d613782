/*
 * main.c
 *		idempotency-matrix: the seed's replay matrix, run for real.
 *
 * For each stale-claim policy the runner registers one job type per case
 * (all under a prefix unique to this run), runs the case with real worker
 * processes against the idempotency extension, prints the policy's matrix,
 * and at the end removes every record and job type it made. It connects
 * with --dsn, or else with libpq's environment (PGHOST, PGPORT, ...); it
 * never starts a server itself.
 *
 * Exit status: 0 every cell holds; 1 some do not; 2 it could not run
 * (bad option, no connection, no extension); 130 interrupted.
 */
#include "postgres_fe.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <langinfo.h>
#include <locale.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/logging.h"
#include "matrix.h"

static matrix_ctx ctx_storage;

static void
usage(FILE *f)
{
	fprintf(f,
			"idempotency-matrix runs the seed's replay matrix against the idempotency extension:\n"
			"real worker processes, real deaths (SIGKILL at exact points), real concurrency.\n"
			"\n"
			"Usage: idempotency-matrix [OPTION]...\n"
			"       idempotency-matrix --job FILE [--dsn=...] [--policy=...] [--cases=...] [--html=F] [--json=F]\n"
			"\n"
			"  -d, --dsn=CONNINFO     libpq connection string or URI (default: PGHOST, PGPORT,\n"
			"                         PGUSER, PGDATABASE, ... from the environment)\n"
			"  -p, --policy=LIST      hold, retry, skip, lookup or all (default), comma-separated\n"
			"  -l, --lease=SECONDS    lease of the runner's job types (default 2; e.g. 1, 1.5, 500ms)\n"
			"  -c, --cases=LIST       run only these cases, e.g. 1-7 or 5,6,13 (default: all)\n"
			"      --stress=N         workers in the stress variant of case 3 (default 16, 0: skip it)\n"
			"      --html=FILE        write a self-contained HTML report\n"
			"      --json=FILE        write the results as JSON\n"
			"      --junit=FILE       write the cases as JUnit XML (a testcase per case and policy)\n"
			"      --color=WHEN       auto (default: only on a terminal), always, never\n"
			"  -q, --quiet            no progress lines on stderr\n"
			"      --create-extension run CREATE EXTENSION IF NOT EXISTS idempotency first\n"
			"      --keep             keep the job types, records and mailboxes for inspection\n"
			"      --check-as=POLICY  check every policy against POLICY's expectations\n"
			"                         (tests the runner itself: the mismatching cells must fail)\n"
			"      --job=FILE         sign off your own job: run the cases that fit it (1-7, 9-13;\n"
			"                         transactional = yes: 1 2 4 8 11) through your queue and your\n"
			"                         worker command, as FILE says (docs/signoff.md)\n"
			"      --verify=REPORT    exit 0 if the job file and the code a sign-off's JSON report\n"
			"                         names are unchanged, 1 if not (each change named)\n"
			"      --list-cases=WHAT  print the case table as markdown: proves (what each case\n"
			"                         proves), steps (what a sign-off run does), policies (what\n"
			"                         each policy must give); the docs hold these tables\n"
			"      --reference-job=WHAT --reference-dir=DIR [KEY]\n"
			"                         the reference job's worker, enqueue, enqueue-other and\n"
			"                         effects commands: the reference run starts them itself\n"
			"  -h, --help             this help\n"
			"  -V, --version          the runner's version\n"
			"\n"
			"The runner works in its own job types (idempotency_matrix_<run id>_<policy>_<case>) and\n"
			"deletes them, their records, case 8's table and its mailboxes at the end (also when\n"
			"interrupted). The role it connects as needs: USAGE on schema idempotency; EXECUTE on\n"
			"claim_operation, complete_operation, release_operation, extend_lease, stale_claims and\n"
			"edition (0.5: which edition and version answer);\n"
			"SELECT, INSERT, DELETE on idempotency.job_types; SELECT, DELETE on\n"
			"idempotency.operations; CREATE on its current schema (case 8's effects table).\n"
			"\n"
			"Exit status: 0 every case holds, 1 some case fails, 2 cannot run, 130 interrupted.\n");
}

/* a single value from a query, or NULL (message in err) */
static bool
query_value(matrix_ctx *ctx, const char *sql, char *out, size_t sz, char *err, size_t esz)
{
	PGresult   *res = PQexec(ctx->conn, sql);
	bool		ok = PQresultStatus(res) == PGRES_TUPLES_OK;

	if (!ok)
		copy_str(err, esz, one_line(PQresultErrorMessage(res)));
	else if (PQntuples(res) == 0 || PQgetisnull(res, 0, 0))
	{
		ok = false;
		copy_str(err, esz, "no row");
	}
	else
		copy_str(out, sz, PQgetvalue(res, 0, 0));
	PQclear(res);
	return ok;
}

/*
 * Which edition of idempotency answers, and its version, into
 * ctx->ext_edition and ctx->ext_version. Both editions have
 * idempotency.edition() from 0.5 on, and it is the only way to ask: a
 * plain-script install of the portable edition has no pg_extension row.
 * Before 0.5 there is no such function (42883; 3F000 where there is no
 * schema idempotency at all), and the C extension, the only edition there
 * was, has its version in pg_extension: read it there. A role without
 * EXECUTE on edition() (42501) is read there too, as before 0.5. false:
 * err says why ("no row": not installed).
 */
static bool
read_edition(matrix_ctx *ctx, char *err, size_t esz)
{
	PGresult   *res = PQexec(ctx->conn, "SELECT edition, version FROM idempotency.edition()");
	const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	bool		denied;

	if (PQresultStatus(res) == PGRES_TUPLES_OK)
	{
		bool		ok = PQntuples(res) == 1 && PQnfields(res) == 2 &&
			!PQgetisnull(res, 0, 0) && !PQgetisnull(res, 0, 1);

		if (ok)
		{
			copy_str(ctx->ext_edition, sizeof(ctx->ext_edition), PQgetvalue(res, 0, 0));
			copy_str(ctx->ext_version, sizeof(ctx->ext_version), PQgetvalue(res, 0, 1));
		}
		else
			copy_str(err, esz, "idempotency.edition() did not answer one edition and version");
		PQclear(res);
		return ok;
	}
	if (state == NULL ||
		(strcmp(state, "42883") != 0 && strcmp(state, "3F000") != 0 && strcmp(state, "42501") != 0))
	{
		copy_str(err, esz, one_line(PQresultErrorMessage(res)));
		PQclear(res);
		return false;
	}
	denied = strcmp(state, "42501") == 0;
	PQclear(res);
	copy_str(ctx->ext_edition, sizeof(ctx->ext_edition), "c");
	if (query_value(ctx, "SELECT extversion FROM pg_catalog.pg_extension "
					"WHERE extname OPERATOR(pg_catalog.=) 'idempotency'",
					ctx->ext_version, sizeof(ctx->ext_version), err, esz))
		return true;
	/* no extension, but a function we may not call: the portable edition */
	if (denied && strcmp(err, "no row") == 0)
		copy_str(err, esz, "permission denied for function idempotency.edition() "
				 "(GRANT EXECUTE ON FUNCTION idempotency.edition() to this role)");
	return false;
}

/* NOTICEs ("extension already exists", a held claim's) are not the report */
static void
ignore_notice(void *arg, const char *message)
{
	(void) arg;
	(void) message;
}

/* connect, check the extension, read what the report shows; 0 or exit code */
static int
prepare(matrix_ctx *ctx, bool create_extension)
{
	const char *keys[3];
	const char *vals[3];
	int			i = 0;
	char		err[512];
	PGresult   *res;

	if (ctx->dsn)
	{
		keys[i] = "dbname";
		vals[i++] = ctx->dsn;
	}
	keys[i] = "application_name";
	vals[i++] = "idempotency-matrix";
	keys[i] = NULL;
	vals[i] = NULL;
	ctx->conn = PQconnectdbParams(keys, vals, 1);
	if (PQstatus(ctx->conn) != CONNECTION_OK)
	{
		pg_log_error("cannot connect to the database: %s",
				one_line(PQerrorMessage(ctx->conn)));
		if (ctx->job == NULL)
			pg_log_error_hint("pass --dsn, or set PGHOST, PGPORT, PGUSER and PGDATABASE; "
							  "scripts/matrix starts a throwaway cluster and runs the matrix on it.");
		return 2;
	}
	PQsetNoticeProcessor(ctx->conn, ignore_notice, NULL);

	/* not over an install of either edition (the portable one has no row) */
	if (create_extension && !read_edition(ctx, err, sizeof(err)))
	{
		res = PQexec(ctx->conn, "CREATE EXTENSION IF NOT EXISTS idempotency");
		if (PQresultStatus(res) != PGRES_COMMAND_OK)
		{
			pg_log_error("CREATE EXTENSION idempotency failed: %s",
					one_line(PQresultErrorMessage(res)));
			PQclear(res);
			return 2;
		}
		PQclear(res);
	}
	if (!read_edition(ctx, err, sizeof(err)))
	{
		if (ctx->job)
		{
			/* a sign-off run: one sentence */
			if (strcmp(err, "no row") == 0)
				pg_log_error("the idempotency extension is not installed in database \"%s\" "
						"(a sign-off run needs 0.3 or later: CREATE EXTENSION idempotency)",
						PQdb(ctx->conn));
			else
				pg_log_error("cannot check for the idempotency extension: %s", err);
			return 2;
		}
		if (strcmp(err, "no row") == 0)
			pg_log_error("the idempotency extension is not installed in database \"%s\"",
					PQdb(ctx->conn));
		else
			pg_log_error("cannot check for the idempotency extension: %s", err);
		pg_log_error_hint("make install, then CREATE EXTENSION idempotency; or pass --create-extension.");
		return 2;
	}
	if (ctx->job)
	{
		int			major = 0,
					minor = 0;

		/* delivery tokens, wait => and the helpers' calls need 0.3 */
		if (sscanf(ctx->ext_version, "%d.%d", &major, &minor) != 2 ||
			major < 0 || (major == 0 && minor < 3))
		{
			pg_log_error("the idempotency extension in database \"%s\" is version %s (%s edition), "
					"and a sign-off run needs 0.3 or later (ALTER EXTENSION idempotency UPDATE)",
					PQdb(ctx->conn), ctx->ext_version, ctx->ext_edition);
			return 2;
		}
	}
	query_value(ctx, "SELECT pg_catalog.current_setting('server_version')",
				ctx->server_version, sizeof(ctx->server_version), err, sizeof(err));
	query_value(ctx, "SELECT pg_catalog.version()",
				ctx->server_version_full, sizeof(ctx->server_version_full), err, sizeof(err));
	query_value(ctx, "SELECT pg_catalog.current_setting('default_transaction_isolation')",
				ctx->isolation, sizeof(ctx->isolation), err, sizeof(err));
	snprintf(ctx->server_desc, sizeof(ctx->server_desc), "%s%s port %s, database %s, user %s",
			 (PQhost(ctx->conn) && PQhost(ctx->conn)[0] == '/') ? "socket " : "",
			 PQhost(ctx->conn) ? PQhost(ctx->conn) : "?", PQport(ctx->conn),
			 PQdb(ctx->conn), PQuser(ctx->conn));
	return 0;
}

/* the table for case 8's side-effect rows, in the current schema */
static void
create_effects_table(matrix_ctx *ctx)
{
	char		schema[200];
	char		citus[8];		/* "t" where Citus is installed */
	char		err[256];
	char		sql[600];
	char	   *qs;
	char	   *qt;
	char		table[100];
	PGresult   *res;

	if (!query_value(ctx, "SELECT pg_catalog.current_schema()", schema, sizeof(schema), err, sizeof(err)))
	{
		snprintf(ctx->effects_error, sizeof(ctx->effects_error),
				 "no current schema (search_path): %s", err);
		return;
	}
	snprintf(table, sizeof(table), "%s_effects", ctx->prefix);
	qs = PQescapeIdentifier(ctx->conn, schema, strlen(schema));
	qt = PQescapeIdentifier(ctx->conn, table, strlen(table));
	snprintf(ctx->effects_table, sizeof(ctx->effects_table), "%s.%s", qs, qt);
	PQfreemem(qs);
	PQfreemem(qt);
	snprintf(sql, sizeof(sql),
			 "CREATE TABLE %s (job_type text NOT NULL, operation_key text NOT NULL, "
			 "attempt integer NOT NULL, worker text NOT NULL)", ctx->effects_table);
	res = PQexec(ctx->conn, sql);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		snprintf(ctx->effects_error, sizeof(ctx->effects_error), "CREATE TABLE %s: %s",
				 ctx->effects_table, one_line(PQresultErrorMessage(res)));
		ctx->effects_table[0] = '\0';
		PQclear(res);
		return;
	}
	PQclear(res);

	/*
	 * Where Citus manages the records (idempotency.distribute()), the table
	 * is distributed by the key in their colocation group, as the README
	 * tells an application to do: claim, effect row and completion of one
	 * key then commit on one node, without two-phase commit.
	 */
	if (!query_value(ctx,
					 "SELECT pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL",
					 citus, sizeof(citus), err, sizeof(err)) || strcmp(citus, "t") != 0)
		return;
	qt = PQescapeLiteral(ctx->conn, ctx->effects_table, strlen(ctx->effects_table));
	snprintf(sql, sizeof(sql),
			 "SELECT pg_catalog.create_distributed_table(%s, 'operation_key', "
			 "colocate_with => 'idempotency.operations') "
			 "WHERE EXISTS (SELECT FROM pg_catalog.pg_dist_partition "
			 "WHERE logicalrelid OPERATOR(pg_catalog.=) 'idempotency.operations'::pg_catalog.regclass)",
			 qt);
	PQfreemem(qt);
	res = PQexec(ctx->conn, sql);
	/* the table stays named for the cleanup; case 8 fails with the error */
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		snprintf(ctx->effects_error, sizeof(ctx->effects_error), "create_distributed_table(%s): %s",
				 ctx->effects_table, one_line(PQresultErrorMessage(res)));
	PQclear(res);
}

/* remove everything this run made: records, job types, table, mailboxes */
static void
cleanup_run(matrix_ctx *ctx, bool failed)
{
	/* every process group the engine started, then its socket and logs */
	signoff_kill_all(ctx);
	signoff_remove_dir(ctx, ctx->keep || (failed && ctx->job));
	if (ctx->keep && ctx->job)
	{
		pg_log_info("kept job types %s_* and their records (--keep)", ctx->prefix);
		return;
	}
	if (ctx->keep)
	{
		pg_log_info("kept job types %s_*, their records%s%s, and the mailboxes in %s",
				ctx->prefix, ctx->effects_table[0] ? ", table " : "", ctx->effects_table, ctx->maildir);
		return;
	}
	if (ctx->conn && PQstatus(ctx->conn) != CONNECTION_OK)
		PQreset(ctx->conn);
	if (ctx->conn && PQstatus(ctx->conn) == CONNECTION_OK && ctx->prefix[0])
	{
		char		like[80];
		const char *params[1];
		PGresult   *res;

		snprintf(like, sizeof(like), "%s_", ctx->prefix);
		params[0] = like;

		/*
		 * The records of the run's job types (found in the small job_types
		 * table), by "job_type = ANY (...)", which the primary key answers:
		 * no scan of a user's whole operations table. Then the job types:
		 * deleting them fires job_types_guard, which locks operations in
		 * SHARE mode for that one statement, so claims elsewhere wait for
		 * it, briefly.
		 */
		res = db_exec(ctx, "DELETE FROM idempotency.operations "
					  "WHERE job_type OPERATOR(pg_catalog.=) ANY (ARRAY("
					  "SELECT job_type FROM idempotency.job_types "
					  "WHERE pg_catalog.\"left\"(job_type, pg_catalog.length($1)) OPERATOR(pg_catalog.=) $1))",
					  1, params);
		if (PQresultStatus(res) != PGRES_COMMAND_OK)
			pg_log_warning("cleanup: %s", one_line(PQresultErrorMessage(res)));
		PQclear(res);
		res = db_exec(ctx, "DELETE FROM idempotency.job_types "
					  "WHERE pg_catalog.\"left\"(job_type, pg_catalog.length($1)) OPERATOR(pg_catalog.=) $1",
					  1, params);
		if (PQresultStatus(res) != PGRES_COMMAND_OK)
			pg_log_warning("cleanup: %s", one_line(PQresultErrorMessage(res)));
		PQclear(res);
		if (ctx->effects_table[0])
		{
			char		drop[400];

			snprintf(drop, sizeof(drop), "DROP TABLE IF EXISTS %s", ctx->effects_table);
			res = PQexec(ctx->conn, drop);
			if (PQresultStatus(res) != PGRES_COMMAND_OK)
				pg_log_warning("cleanup: %s", one_line(PQresultErrorMessage(res)));
			PQclear(res);
		}
	}
	else if (ctx->prefix[0])
		pg_log_warning("cleanup: no connection; job types %s_* are left behind",
				ctx->prefix);
	if (ctx->maildir[0])
		remove_tree(ctx->maildir);
}

/* the run's end: its cleanup, then the guardian told that all is in order */
static void
cleanup(matrix_ctx *ctx, bool failed)
{
	cleanup_run(ctx, failed);
	guardian_done();
}

/*
 * What every run sets up before it connects: colour (--color, NO_COLOR,
 * TERM=dumb), progress on a terminal, the lease as SQL, the start time, and
 * SIGINT/SIGTERM/SIGHUP setting matrix_interrupted (the run then cleans up).
 */
static void
begin_run(matrix_ctx *ctx, const char *color)
{
	ctx->color = strcmp(color, "always") == 0 ||
		(strcmp(color, "auto") == 0 && isatty(STDOUT_FILENO) &&
		 getenv("NO_COLOR") == NULL &&
		 !(getenv("TERM") && strcmp(getenv("TERM"), "dumb") == 0));
	ctx->progress_tty = isatty(STDERR_FILENO);
	snprintf(ctx->lease_sql, sizeof(ctx->lease_sql), "%g second%s",
			 ctx->lease_s, ctx->lease_s == 1.0 ? "" : "s");
	iso_time(ctx->started_at, sizeof(ctx->started_at), false);

	catch_interrupts();
}

/* the run's id and its job types' prefix, base_<id>: unique to this run */
static void
name_run(matrix_ctx *ctx, const char *base)
{
	snprintf(ctx->run_id, sizeof(ctx->run_id), "%lx%x",
			 (unsigned long) time(NULL) & 0xffffffUL, (unsigned) getpid() & 0xffffu);
	snprintf(ctx->prefix, sizeof(ctx->prefix), "%s_%.31s", base, ctx->run_id);
}

/*
 * The sign-off run (--job FILE, docs/signoff.md). The job file, the options
 * and the case selection are checked before anything starts (exit 2, one
 * sentence); then, as the reference run: connect, check the extension (0.3
 * or later here), run, report, and clean up on exit, error or a signal.
 */
static int
signoff_main(matrix_ctx *ctx, const char *path, signoff_job *job,
			 const char *refused, const char *policy_arg, bool *want,
			 const char *html, const char *json, const char *color)
{
	int			rc;

	if (refused)
	{
		pg_log_error("%s", refused);
		return 2;
	}
	if (signoff_load_job(path, job) != 0)
		return 2;
	if (policy_arg == NULL)
		memcpy(want, job->want, sizeof(bool) * N_POLICIES);
	if (want[POLICY_LOOKUP] && job->effect == EFFECT_SMTP)
	{
		pg_log_error("the policy lookup needs a provider to look the operation up at; "
				"the run's SMTP endpoint has none (%s: effect = smtp): leave lookup out, or use effect = http, "
				"whose endpoint answers a GET", path);
		return 2;
	}
	if (want[POLICY_LOOKUP] && job->value[JF_EFFECTS] == NULL && job->value[JF_EFFECTS_SQL] == NULL &&
		job->effect == EFFECT_NONE)
	{
		pg_log_error("the policy lookup needs effects or effects_sql in %s "
				"(a handled report cannot tell whether the lookup found the effect)", path);
		return 2;
	}
	if (signoff_count_cases(ctx->cases, job) == 0)
	{
		char		ids[128] = "";
		int			k;

		for (k = 0; k < n_case_table; k++)
			if (signoff_case_wanted(NULL, job, &case_table[k]))
				list_append(ids, sizeof(ids), case_table[k].id);
		pg_log_error("--cases \"%s\" selects no case of this sign-off run "
				"(its cases: %s)", ctx->cases ? ctx->cases : "", ids);
		return 2;
	}
	ctx->job = job;
	ctx->lease_s = job->lease_s;
	ctx->timeout_s = job->timeout_s;
	ctx->stress = 0;
	begin_run(ctx, color);

	rc = prepare(ctx, false);
	if (rc != 0)
	{
		PQfinish(ctx->conn);
		return rc;
	}
	name_run(ctx, "signoff");

	rc = signoff_run(ctx, job, want, -1, html, json);
	if (matrix_interrupted)
	{
		progress_clear(ctx);
		pg_log_info("interrupted; cleaning up");
		rc = 130;
	}
	cleanup(ctx, rc == 1);
	PQfinish(ctx->conn);
	return rc;
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"dsn", required_argument, NULL, 'd'},
		{"policy", required_argument, NULL, 'p'},
		{"lease", required_argument, NULL, 'l'},
		{"cases", required_argument, NULL, 'c'},
		{"stress", required_argument, NULL, 1},
		{"html", required_argument, NULL, 2},
		{"json", required_argument, NULL, 3},
		{"color", required_argument, NULL, 4},
		{"colour", required_argument, NULL, 4},
		{"no-color", no_argument, NULL, 5},
		{"quiet", no_argument, NULL, 'q'},
		{"create-extension", no_argument, NULL, 6},
		{"keep", no_argument, NULL, 7},
		{"check-as", required_argument, NULL, 8},
		{"job", required_argument, NULL, 9},
		{"list-cases", required_argument, NULL, 10},
		{"reference-job", required_argument, NULL, 11},
		{"verify", required_argument, NULL, 14},
		{"junit", required_argument, NULL, 15},
		{"reference-dir", required_argument, NULL, 12},
		{"reference-table", required_argument, NULL, 13},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},
		{NULL, 0, NULL, 0}
	};
	matrix_ctx *ctx = &ctx_storage;
	bool		want[N_POLICIES] = {true, true, true, true};
	const char *cases = NULL;
	const char *html = NULL;
	const char *json = NULL;
	const char *color = "auto";
	bool		create_extension = false;
	int			check_as = -1;
	int			opt;
	int			rc;
	const char *tmp;
	const char *job_path = NULL;
	const char *reference_what = NULL;	/* the reference job's commands */
	const char *reference_dir = NULL;
	const char *reference_table = NULL;
	const char *policy_arg = NULL;
	const char *not_for_job = NULL;	/* an option a sign-off run refuses */
	static signoff_job job;

	setlocale(LC_ALL, "");
	pg_logging_init(argv[0]);
	memset(ctx, 0, sizeof(*ctx));
	ctx->lease_s = 2.0;
	ctx->stress = 16;
	ctx->progress = true;
	ctx->utf8 = strcmp(nl_langinfo(CODESET), "UTF-8") == 0;

	while ((opt = getopt_long(argc, argv, "d:p:l:c:qhV", longopts, NULL)) != -1)
	{
		switch (opt)
		{
			case 'd':
				ctx->dsn = optarg;
				break;
			case 'p':
				policy_arg = optarg;
				if (!parse_policies(optarg, want))
				{
					pg_log_error("--policy: \"%s\" is not a list of hold, retry, skip, lookup, all", optarg);
					return 2;
				}
				break;
			case 'l':
				not_for_job = "--lease does not apply to a sign-off run (--job): give lease in the job file";
				if (!parse_lease(optarg, &ctx->lease_s))
				{
					pg_log_error("--lease: \"%s\" is not a number of seconds between 0.1 and 600 (e.g. 2, 1.5, 500ms)", optarg);
					return 2;
				}
				break;
			case 'c':
				cases = optarg;
				ctx->cases = optarg;
				break;
			case 1:
				not_for_job = "--stress does not apply to a sign-off run (--job): it has no case 3s";
				{
					char	   *end;
					long		n = strtol(optarg, &end, 10);

					if (*end != '\0' || n < 0 || n == 1 || n > 64)
					{
						pg_log_error("--stress: give 0 (skip case 3s) or 2 to 64 workers");
						return 2;
					}
					ctx->stress = (int) n;
				}
				break;
			case 2:
				html = optarg;
				break;
			case 3:
				json = optarg;
				break;
			case 4:
				if (strcmp(optarg, "auto") != 0 && strcmp(optarg, "always") != 0 &&
					strcmp(optarg, "never") != 0)
				{
					pg_log_error("--color: auto, always or never");
					return 2;
				}
				color = optarg;
				break;
			case 5:
				color = "never";
				break;
			case 'q':
				ctx->progress = false;
				break;
			case 6:
				not_for_job = "--create-extension does not apply to a sign-off run (--job): it runs in your database, where the extension must be installed already";
				create_extension = true;
				break;
			case 7:
				ctx->keep = true;
				break;
			case 9:
				job_path = optarg;
				break;
			case 10:
				return case_table_list(optarg);
			case 11:
				reference_what = optarg;
				break;
			case 14:
				return provenance_verify(optarg);
			case 15:
				ctx->junit = optarg;
				break;
			case 12:
				reference_dir = optarg;
				break;
			case 13:
				reference_table = optarg;
				break;
			case 8:
				not_for_job = "--check-as does not apply to a sign-off run (--job)";
				check_as = policy_by_name(optarg);
				if (check_as < 0)
				{
					pg_log_error("--check-as: hold, retry, skip or lookup");
					return 2;
				}
				break;
			case 'h':
				usage(stdout);
				return 0;
			case 'V':
				printf("idempotency-matrix %s\n", MATRIX_VERSION);
				return 0;
			default:
				usage(stderr);
				return 2;
		}
	}
	if (reference_what)
		return reference_job_main(reference_what, reference_dir, reference_table,
								  optind < argc ? argv[optind] : NULL);
	if (optind < argc)
	{
		pg_log_error("unexpected argument \"%s\"", argv[optind]);
		usage(stderr);
		return 2;
	}
	if (job_path)
		return signoff_main(ctx, job_path, &job, not_for_job, policy_arg, want,
							html, json, color);
	if (reference_count_cases(ctx) == 0)
	{
		char		ids[128] = "";
		int			k;

		for (k = 0; k < n_case_table; k++)
			if (case_table[k].runs_in & RUN_REFERENCE)
				list_append(ids, sizeof(ids), case_table[k].id);
		pg_log_error("--cases \"%s\" selects no case (cases: %s)",
				cases ? cases : "", ids);
		return 2;
	}

	/* the longest wait for one step of one worker */
	ctx->timeout_s = 30.0 + 3.0 * ctx->lease_s;
	begin_run(ctx, color);
	if (check_as >= 0)
		snprintf(ctx->check_as_note, sizeof(ctx->check_as_note),
				 "every policy checked against the expectations of %s (--check-as)",
				 policy_names[check_as]);

	rc = prepare(ctx, create_extension);
	if (rc != 0)
	{
		PQfinish(ctx->conn);
		return rc;
	}
	name_run(ctx, "idempotency_matrix");
	tmp = getenv("TMPDIR");
	snprintf(ctx->maildir, sizeof(ctx->maildir), "%s/idempotency-matrix.XXXXXX",
			 tmp && *tmp ? tmp : "/tmp");
	if (mkdtemp(ctx->maildir) == NULL)
	{
		pg_log_error("cannot create a mail directory %s: %s",
				ctx->maildir, strerror(errno));
		ctx->maildir[0] = '\0';
		PQfinish(ctx->conn);
		return 2;
	}
	guardian_start();
	guardian_dir(ctx->maildir);
	if (case_selected(cases, "8"))
		create_effects_table(ctx);

	rc = reference_run(ctx, want, check_as, html, json);
	if (matrix_interrupted)
	{
		pg_log_info("interrupted; cleaning up");
		rc = 130;
	}
	cleanup(ctx, false);
	PQfinish(ctx->conn);
	return rc;
}
