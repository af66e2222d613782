/*
 * reference_job.c
 *		The seed's reference job, as a job signed off like any other: a
 *		worker that speaks the sign-off protocol, a queue and a count of
 *		its effects (idempotency-matrix --reference-job=...).
 *
 * The reference run (reference.c) signs this job off through the same
 * engine as a user's job (engine.c, case_steps.c); only the job file is built in. The
 * job: send_confirmation sends one confirmation email for an order through
 * the fake mail provider (reference_provider.c), whose mailbox is a file
 * outside the database, so that cases 5 and 6 are really uncertain.
 *
 *	--reference-job=worker		one worker process: takes messages from the
 *								queue, one at a time, until SIGTERM
 *	--reference-job=enqueue KEY	one message for KEY
 *	--reference-job=enqueue-other KEY	one with other arguments (case 11)
 *	--reference-job=effects KEY	prints the emails of KEY (case 8: its rows)
 *
 * --reference-dir=DIR holds the queue (DIR/queue, a message a file, taken
 * by rename(), so exactly one worker gets it; a worker killed holding one
 * loses it, as Sidekiq's basic fetch does) and the mailboxes (DIR/mail, one
 * file per run job type). The worker reads the protocol's environment
 * (docs/signoff-protocol.md) and the run's database from
 * IDEMPOTENCY_SIGNOFF_DSN (else libpq's environment).
 *
 * What only this worker does, its capabilities beyond the protocol:
 *	- in case 8 (IDEMPOTENCY_SIGNOFF_CASE=8) it works in the transactional
 *	  mode: BEGIN, claim, the effect as a row of --reference-table,
 *	  completion, COMMIT; its points claimed and handled are inside that
 *	  transaction, so a death there leaves nothing;
 *	- at judged (completed) it sends the stored result ("result"), which the
 *	  run compares with the record (case 2); in the transactional mode it
 *	  sends its server process ("backend_pid"), which case 8 waits for;
 *	- it is quick to start (no interpreter), so case 3s can start 16.
 */
#include "postgres_fe.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/logging.h"
#include "matrix.h"

#define REFERENCE_JOB_TYPE "send_confirmation"
#define TX_CASE "8"
#define QUEUE_POLL_MS 5

static volatile sig_atomic_t stopping = 0;

static void
on_term(int sig)
{
	(void) sig;
	stopping = 1;
}

static int
fail_with(const char *fmt,...) MX_PRINTF(1, 2);

/* one sentence on stderr (the worker's log); exit status 2 */
static int
fail_with(const char *fmt,...)
{
	va_list		ap;
	char		sentence[4096];

	va_start(ap, fmt);
	vsnprintf(sentence, sizeof(sentence), fmt, ap);
	va_end(ap);
	pg_log_error("reference job (pid %d): %s", (int) getpid(), sentence);
	return 2;
}

/* the run's job type for ours, from IDEMPOTENCY_SIGNOFF_JOB_TYPES */
static void
mapped_job_type(char *out, size_t sz)
{
	const char *map = getenv("IDEMPOTENCY_SIGNOFF_JOB_TYPES");
	size_t		n = strlen(REFERENCE_JOB_TYPE);

	copy_str(out, sz, REFERENCE_JOB_TYPE);
	while (map && *map)
	{
		size_t		len = strcspn(map, ",");

		if (len > n + 1 && strncmp(map, REFERENCE_JOB_TYPE, n) == 0 && map[n] == '=')
		{
			size_t		vlen = len - n - 1;

			if (vlen >= sz)
				vlen = sz - 1;
			memcpy(out, map + n + 1, vlen);
			out[vlen] = '\0';
			return;
		}
		map += len;
		if (*map == ',')
			map++;
	}
}

static bool
in_tx_case(void)
{
	const char *c = getenv("IDEMPOTENCY_SIGNOFF_CASE");

	return c && strcmp(c, TX_CASE) == 0;
}

static void
payload_of(const char *key, bool other, char *buf, size_t sz)
{
	snprintf(buf, sz, "order=%s;customer=C-77;items=1;total=%s", key, other ? "43.00" : "42.00");
}

/* FNV-1a of the arguments: the claim's fingerprint */
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

static PGconn *
connect_db(const char *name)
{
	const char *keys[3];
	const char *vals[3];
	const char *dsn = getenv("IDEMPOTENCY_SIGNOFF_DSN");
	int			i = 0;
	PGconn	   *conn;

	if (dsn && *dsn)
	{
		keys[i] = "dbname";
		vals[i++] = dsn;
	}
	keys[i] = "application_name";
	vals[i++] = name;
	keys[i] = NULL;
	vals[i] = NULL;
	conn = PQconnectdbParams(keys, vals, 1);
	if (PQstatus(conn) != CONNECTION_OK)
	{
		fail_with("cannot connect: %s", one_line(PQerrorMessage(conn)));
		PQfinish(conn);
		return NULL;
	}
	return conn;
}

static const char *
sqlstate_of(const PGresult *res)
{
	const char *s = PQresultErrorField(res, PG_DIAG_SQLSTATE);

	return s ? s : "";
}

/* ---------------------------------------------------------------------
 * enqueue, effects
 * --------------------------------------------------------------------- */

static int
enqueue(const char *dir, const char *key, bool other)
{
	char		tmp[1200];
	char		path[1200];
	char		payload[400];
	struct timespec ts;
	FILE	   *f;

	clock_gettime(CLOCK_REALTIME, &ts);
	snprintf(tmp, sizeof(tmp), "%s/queue/.%ld%09ld-%d.tmp", dir, (long) ts.tv_sec, ts.tv_nsec, (int) getpid());
	snprintf(path, sizeof(path), "%s/queue/%ld%09ld-%d.msg", dir, (long) ts.tv_sec, ts.tv_nsec, (int) getpid());
	payload_of(key, other, payload, sizeof(payload));
	f = fopen(tmp, "w");
	if (f == NULL)
		return fail_with("cannot write %s: %s", tmp, strerror(errno));
	fprintf(f, "%s\n%s\n%s\n", REFERENCE_JOB_TYPE, key, payload);
	if (fclose(f) != 0 || rename(tmp, path) != 0)
		return fail_with("cannot enqueue into %s/queue: %s", dir, strerror(errno));
	return 0;
}

static int
effects(const char *dir, const char *table, const char *key)
{
	char		jt[200];

	mapped_job_type(jt, sizeof(jt));
	if (in_tx_case())
	{
		/* the transactional mode's effects: its rows */
		PGconn	   *conn = connect_db("idempotency-matrix reference effects");
		char		sql[600];
		const char *params[2] = {jt, key};
		PGresult   *res;
		int			rc = 0;

		if (conn == NULL)
			return 2;
		snprintf(sql, sizeof(sql),
				 "SELECT count(*) FROM %s WHERE job_type OPERATOR(pg_catalog.=) $1 "
				 "AND operation_key OPERATOR(pg_catalog.=) $2", table);
		res = PQexecParams(conn, sql, 2, NULL, params, NULL, NULL, 0);
		if (PQresultStatus(res) == PGRES_TUPLES_OK)
			printf("%s\n", PQgetvalue(res, 0, 0));
		else
			rc = fail_with("cannot count the effect rows: %s", one_line(PQresultErrorMessage(res)));
		PQclear(res);
		PQfinish(conn);
		return rc;
	}
	else
	{
		char		mailbox[1200];
		int			n;

		snprintf(mailbox, sizeof(mailbox), "%s/mail/%s", dir, jt);
		n = provider_count(mailbox, key);
		if (n < 0)
			return fail_with("cannot read %s: %s", mailbox, strerror(errno));
		printf("%d\n", n);
		return 0;
	}
}

/* ---------------------------------------------------------------------
 * The worker's side of the protocol
 * --------------------------------------------------------------------- */

typedef struct point_line
{
	const char *point;
	const char *job_type;
	const char *key;
	const char *verdict;
	int			attempt;		/* 0: null */
	const char *sqlstate;		/* NULL: none */
	bool		heartbeat;
	const char *result;			/* NULL: none */
	long		backend_pid;	/* 0: none */
} point_line;

typedef struct beat
{
	PGconn	   *conn;			/* NULL: no heartbeat */
	const char *job_type;
	const char *key;
	int			attempt;
	int			every_ms;
} beat;

static void
extend(const beat *b)
{
	char		a[16];
	const char *params[3];
	PGresult   *res;

	snprintf(a, sizeof(a), "%d", b->attempt);
	params[0] = b->job_type;
	params[1] = b->key;
	params[2] = a;
	res = PQexecParams(b->conn, "SELECT idempotency.extend_lease($1, $2, $3)",
					   3, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		fail_with("extend_lease: %s", one_line(PQresultErrorMessage(res)));
	PQclear(res);
}

/*
 * Tell the runner we stand at a point; its answer ("continue", "fail") in
 * answer. While we wait, the heartbeat (b) extends the lease. Unarmed (no
 * IDEMPOTENCY_SIGNOFF): "continue" at once. false: no answer (the
 * protocol says raise: the worker stops).
 */
static bool
at_point(const point_line *pl, const beat *b, char *answer, size_t asz)
{
	const char *sock = getenv("IDEMPOTENCY_SIGNOFF");
	struct sockaddr_un addr;
	StringInfoData line;
	int			fd;
	size_t		got = 0;
	bool		ok = false;

	copy_str(answer, asz, "continue");
	if (sock == NULL || *sock == '\0')
		return true;
	initStringInfo(&line);
	appendStringInfoString(&line, "{\"v\":1,\"point\":");
	json_string(&line, pl->point);
	appendStringInfoString(&line, ",\"job_type\":");
	json_string(&line, pl->job_type);
	appendStringInfoString(&line, ",\"key\":");
	json_string(&line, pl->key);
	if (pl->attempt > 0)
		appendStringInfo(&line, ",\"attempt\":%d", pl->attempt);
	else
		appendStringInfoString(&line, ",\"attempt\":null");
	appendStringInfoString(&line, ",\"verdict\":");
	json_string(&line, pl->verdict);
	if (pl->sqlstate)
	{
		appendStringInfoString(&line, ",\"sqlstate\":");
		json_string(&line, pl->sqlstate);
	}
	if (pl->result)
	{
		appendStringInfoString(&line, ",\"result\":");
		json_string(&line, pl->result);
	}
	if (pl->backend_pid > 0)
		appendStringInfo(&line, ",\"backend_pid\":%ld", pl->backend_pid);
	appendStringInfo(&line, ",\"pid\":%d,\"heartbeat\":%s}\n", (int) getpid(), pl->heartbeat ? "true" : "false");

	memset(&addr, 0, sizeof(addr));
	addr.sun_family = AF_UNIX;
	copy_str(addr.sun_path, sizeof(addr.sun_path), sock);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *) &addr, sizeof(addr)) != 0)
	{
		fail_with("cannot reach the runner at %s: %s", sock, strerror(errno));
		goto out;
	}
	if (write(fd, line.data, line.len) != (ssize_t) line.len)
	{
		fail_with("cannot write to the runner: %s", strerror(errno));
		goto out;
	}
	for (;;)
	{
		struct pollfd pfd = {fd, POLLIN, 0};
		int			r = poll(&pfd, 1, b && b->conn ? b->every_ms : -1);
		ssize_t		n;

		if (r < 0 && errno == EINTR)
			continue;
		if (r == 0)
		{
			extend(b);
			continue;
		}
		n = read(fd, answer + got, asz - 1 - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
		{
			fail_with("the runner closed the exchange at %s without an answer", pl->point);
			goto out;
		}
		got += (size_t) n;
		answer[got] = '\0';
		if (strchr(answer, '\n'))
		{
			*strchr(answer, '\n') = '\0';
			ok = true;
			break;
		}
		if (got >= asz - 1)
		{
			fail_with("the runner's answer is too long");
			goto out;
		}
	}
out:
	if (fd >= 0)
		close(fd);
	pfree(line.data);
	return ok;
}

/* ---------------------------------------------------------------------
 * The worker
 * --------------------------------------------------------------------- */

/* take the oldest message: its path in taken/, or false (none yet) */
static bool
take_message(const char *dir, char *taken, size_t sz)
{
	char		qdir[1100];
	DIR		   *d;
	struct dirent *de;
	char		oldest[256] = "";

	snprintf(qdir, sizeof(qdir), "%s/queue", dir);
	d = opendir(qdir);
	if (d == NULL)
		return false;
	while ((de = readdir(d)) != NULL)
	{
		size_t		len = strlen(de->d_name);

		if (len > 4 && strcmp(de->d_name + len - 4, ".msg") == 0 &&
			(oldest[0] == '\0' || strcmp(de->d_name, oldest) < 0))
			copy_str(oldest, sizeof(oldest), de->d_name);
	}
	closedir(d);
	if (oldest[0] == '\0')
		return false;
	{
		char		from[1400];

		snprintf(from, sizeof(from), "%s/%s", qdir, oldest);
		snprintf(taken, sz, "%s/taken/%s.%d", dir, oldest, (int) getpid());
		/* another worker may have taken it first: then look again */
		return rename(from, taken) == 0;
	}
}

static bool
exec_ok(PGconn *conn, const char *sql)
{
	PGresult   *res = PQexec(conn, sql);
	bool		ok = PQresultStatus(res) == PGRES_COMMAND_OK;

	if (!ok)
		fail_with("%s: %s", sql, one_line(PQresultErrorMessage(res)));
	PQclear(res);
	return ok;
}

/* an error the claim will not heal from (judged "error"), or the bound ("busy") */
static const char *
error_verdict(const char *state)
{
	if (strcmp(state, "55P03") == 0 || strcmp(state, "57014") == 0)
		return "busy";
	return "error";
}

/*
 * One delivery: claim, and for run or verify the email (or, in case 8, the
 * row), then the completion. false: the worker must stop (the runner did
 * not answer, or the database is gone).
 */
static bool
deliver(PGconn *conn, const char *dir, const char *table, const char *name,
		const char *msg_path, double lease_s)
{
	FILE	   *f = fopen(msg_path, "r");
	char		user_jt[200] = "",
				key[200] = "",
				payload[400] = "";
	char		jt[200];
	char		fp[64];
	char		verdict[32];
	char		attempt_s[16];
	char		answer[64];
	char		message_id[96] = "";
	const char *params[4];
	PGresult   *res;
	int			attempt;
	bool		tx = in_tx_case();
	point_line	pl;
	beat		b;

	if (f == NULL)
	{
		fail_with("cannot read %s: %s", msg_path, strerror(errno));
		return false;			/* the worker stops */
	}
	if (fgets(user_jt, sizeof(user_jt), f) == NULL || fgets(key, sizeof(key), f) == NULL ||
		fgets(payload, sizeof(payload), f) == NULL)
	{
		fclose(f);
		fail_with("%s is not a message", msg_path);
		return true;
	}
	fclose(f);
	unlink(msg_path);			/* taken: from now on it is this worker's */
	trim(user_jt);
	key[strcspn(key, "\n")] = '\0';
	payload[strcspn(payload, "\n")] = '\0';
	mapped_job_type(jt, sizeof(jt));
	fingerprint(payload, fp, sizeof(fp));

	memset(&pl, 0, sizeof(pl));
	if (tx)
	{
		/* the server process of the transaction (through a pooler: not PQbackendPID's) */
		if (!exec_ok(conn, "BEGIN"))
			return false;
		res = PQexec(conn, "SELECT pg_catalog.pg_backend_pid()");
		if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
			pl.backend_pid = atol(PQgetvalue(res, 0, 0));
		PQclear(res);
	}
	params[0] = jt;
	params[1] = key;
	params[2] = fp;
	params[3] = name;
	res = PQexecParams(conn,
					   "SELECT verdict::text, attempt, result::text "
					   "FROM idempotency.claim_operation($1, $2, $3, $4)",
					   4, NULL, params, NULL, NULL, 0);
	pl.job_type = jt;
	pl.key = key;
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		char		state[8];

		copy_str(state, sizeof(state), sqlstate_of(res));
		fail_with("claim of %s: %s", key, one_line(PQresultErrorMessage(res)));
		PQclear(res);
		if (tx)
			exec_ok(conn, "ROLLBACK");
		if (PQstatus(conn) != CONNECTION_OK)
			return false;
		pl.point = "judged";
		pl.verdict = error_verdict(state);
		pl.sqlstate = state;
		return at_point(&pl, NULL, answer, sizeof(answer));
	}
	copy_str(verdict, sizeof(verdict), PQgetvalue(res, 0, 0));
	attempt = PQgetisnull(res, 0, 1) ? 0 : atoi(PQgetvalue(res, 0, 1));
	pl.verdict = verdict;
	pl.attempt = attempt;
	if (strcmp(verdict, "run") != 0 && strcmp(verdict, "verify") != 0)
	{
		char		result[600] = "";
		bool		has_result = !PQgetisnull(res, 0, 2);

		/* completed, in_progress, held, skipped: acknowledge, run nothing */
		if (has_result)
			copy_str(result, sizeof(result), PQgetvalue(res, 0, 2));
		PQclear(res);
		if (tx && !exec_ok(conn, "COMMIT"))
			return false;
		pl.point = "judged";
		pl.result = has_result ? result : NULL;
		return at_point(&pl, NULL, answer, sizeof(answer));
	}
	PQclear(res);
	snprintf(attempt_s, sizeof(attempt_s), "%d", attempt);

	/* claimed: the heartbeat runs while the runner holds us here */
	memset(&b, 0, sizeof(b));
	b.conn = tx ? NULL : conn;
	b.job_type = jt;
	b.key = key;
	b.attempt = attempt;
	b.every_ms = (int) (lease_s * 1000.0 / 4.0);
	if (b.every_ms < 10)
		b.every_ms = 10;
	pl.point = "claimed";
	pl.heartbeat = !tx;
	if (!at_point(&pl, &b, answer, sizeof(answer)))
		return false;
	if (strcmp(answer, "fail") == 0)
	{
		/* the known failure: release, so that the next delivery runs */
		const char *p[3] = {jt, key, attempt_s};

		res = PQexecParams(conn, "SELECT idempotency.release_operation($1, $2, $3)",
						   3, NULL, p, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
			fail_with("release_operation: %s", one_line(PQresultErrorMessage(res)));
		PQclear(res);
		if (tx)
			exec_ok(conn, "COMMIT");
		return true;
	}

	/* the handler */
	if (tx)
	{
		char		sql[600];
		const char *p[4] = {jt, key, attempt_s, name};

		snprintf(sql, sizeof(sql),
				 "INSERT INTO %s (job_type, operation_key, attempt, worker) VALUES ($1, $2, $3, $4)",
				 table);
		res = PQexecParams(conn, sql, 4, NULL, p, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_COMMAND_OK)
		{
			fail_with("the effect row: %s", one_line(PQresultErrorMessage(res)));
			PQclear(res);
			exec_ok(conn, "ROLLBACK");
			return true;
		}
		PQclear(res);
		copy_str(message_id, sizeof(message_id), "row");
	}
	else
	{
		char		mailbox[1200];
		bool		found = false;

		snprintf(mailbox, sizeof(mailbox), "%s/mail/%s", dir, jt);
		if (strcmp(verdict, "verify") == 0)
		{
			int			l = provider_lookup(mailbox, key);

			if (l < 0)
			{
				fail_with("lookup in %s: %s", mailbox, strerror(errno));
				return false;	/* the worker stops: its message is lost */
			}
			found = l == 1;
		}
		if (found)
			copy_str(message_id, sizeof(message_id), "found-by-lookup");
		else if (provider_send(mailbox, true, key, name, attempt, message_id, sizeof(message_id)) != 0)
		{
			fail_with("the provider: %s", strerror(errno));
			return false;		/* the worker stops: its message is lost */
		}
	}
	pl.point = "handled";
	if (!at_point(&pl, NULL, answer, sizeof(answer)))
		return false;

	/* complete, with the attempt as the fencing token */
	{
		StringInfoData result;
		const char *p[4];

		initStringInfo(&result);
		appendStringInfoString(&result, "{\"message_id\": ");
		json_string(&result, message_id);
		appendStringInfoString(&result, ", \"worker\": ");
		json_string(&result, name);
		appendStringInfoString(&result, "}");
		p[0] = jt;
		p[1] = key;
		p[2] = attempt_s;
		p[3] = result.data;
		res = PQexecParams(conn, "SELECT idempotency.complete_operation($1, $2, $3, $4::jsonb)",
						   4, NULL, p, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			/* ID003: another worker owns it now; the message is done all the same */
			fail_with("complete_operation of %s attempt %d: %s", key, attempt,
					  one_line(PQresultErrorMessage(res)));
			if (tx)
				exec_ok(conn, "ROLLBACK");
		}
		else if (tx)
			exec_ok(conn, "COMMIT");
		PQclear(res);
		pfree(result.data);
	}
	return PQstatus(conn) == CONNECTION_OK;
}

static int
worker(const char *dir, const char *table)
{
	struct sigaction sa;
	char		name[64];
	const char *lease = getenv("IDEMPOTENCY_SIGNOFF_LEASE");
	double		lease_s = 2.0;
	PGconn	   *conn;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_term;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (lease && !parse_lease(lease, &lease_s))
		return fail_with("IDEMPOTENCY_SIGNOFF_LEASE=%s is not a lease in seconds", lease);
	snprintf(name, sizeof(name), "reference-worker/%d", (int) getpid());
	conn = connect_db(name);
	if (conn == NULL)
		return 2;
	while (!stopping)
	{
		char		taken[1400];

		if (!take_message(dir, taken, sizeof(taken)))
		{
			sleep_ms(QUEUE_POLL_MS);
			continue;
		}
		if (!deliver(conn, dir, table, name, taken, lease_s))
		{
			PQfinish(conn);
			return 1;
		}
	}
	PQfinish(conn);
	return 0;
}

/*
 * --reference-job=WHAT [--reference-dir=DIR] [--reference-table=T] [KEY]:
 * the exit status of the command.
 */
int
reference_job_main(const char *what, const char *dir, const char *table, const char *key)
{
	if (dir == NULL)
		return fail_with("--reference-job needs --reference-dir");
	if (strcmp(what, "worker") == 0)
	{
		char		sub[1100];

		snprintf(sub, sizeof(sub), "%s/taken", dir);
		if (mkdir(sub, 0700) != 0 && errno != EEXIST)
			return fail_with("cannot create %s: %s", sub, strerror(errno));
		return worker(dir, table ? table : "");
	}
	if (key == NULL)
		return fail_with("--reference-job=%s needs a key", what);
	if (strcmp(what, "enqueue") == 0)
		return enqueue(dir, key, false);
	if (strcmp(what, "enqueue-other") == 0)
		return enqueue(dir, key, true);
	if (strcmp(what, "effects") == 0)
		return effects(dir, table ? table : "", key);
	return fail_with("--reference-job: \"%s\" is not worker, enqueue, enqueue-other or effects", what);
}
