/*
 * hello.c
 *		What a worker's helper says about itself, and a claim that failed.
 *
 * The point "hello" (docs/signoff-protocol.md): once per worker process,
 * before its first claimed or judged point, a helper that sees
 * IDEMPOTENCY_SIGNOFF_HELLO=1 (the runner exports it to every worker; an
 * older runner does not, and would refuse the point) tells the runner its
 * package and version, its language runtime, the queue library it runs
 * under, and the database its claims go to: current_database(), the
 * server's port (inet_server_port(): null over a Unix socket) and the
 * cluster's system identifier (pg_control_system(), which any role may
 * call; through PgBouncer it is the server's behind it). The runner
 * records each worker's hello by pid, for the report, and compares the
 * database with its own (--dsn): another database name, or another
 * system identifier, stops the run at once with one sentence, instead of
 * every case waiting for points that never come.
 *
 * The hello's "wrapper" says what made the process's claims: "plain" (the
 * helper's plain functions), "plain_batch" (their batch call), or the name
 * of a wrapper as its helper spells it (IdempotentTask, SidekiqMiddleware,
 * idempotent, idempotentBatch, or a user's own). A helper from before it
 * sends none: the report says "not reported". A value that is not a name
 * (not a string, empty, longer than 47 bytes, or other than letters,
 * digits and "_.:-") is reported as such and changes nothing else.
 *
 * The point "judged" with the verdict "error" (any claim error the helper
 * gives up on: a refusal such as 42501, a job type unknown to the
 * database, ID001, a connection lost for longer than the reconnect bound)
 * fails the case at once with one sentence naming its SQLSTATE and
 * message, except ID002, which case 11 expects.
 *
 * This file only decides and records; engine.c reads the lines and
 * answers them.
 */
#include "postgres_fe.h"

#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

#define MAX_HELLOS 1024			/* worker processes of a run with a hello */
#define MAX_KINDS 16			/* distinct helper, runtime, queue library */

typedef struct hello_kind
{
	hello_info	h;
	int			workers;
} hello_kind;

static long hello_pids[MAX_HELLOS];
static int	nhello_pids;
static hello_kind kinds[MAX_KINDS];
static int	nkinds;

/* the run's own database, read once on the control connection */
static bool run_db_read;
static char run_db[128];
static char run_sysid[32];

/* a wrapper's name: 1-47 bytes of letters, digits and "_.:-" */
static bool
wrapper_name_ok(const char *s)
{
	size_t		n = strlen(s);
	size_t		i;

	if (n == 0 || n >= sizeof(((hello_info *) 0)->wrapper))
		return false;
	for (i = 0; i < n; i++)
		if (!isalnum((unsigned char) s[i]) && strchr("_.:-", s[i]) == NULL)
			return false;
	return true;
}

/*
 * A field of a hello line into h; false: not a hello field (engine.c's
 * parser knows the others, and ignores what neither knows)
 */
bool
hello_field(hello_info *h, const char *name, const char *sval,
			bool is_str, bool is_null, double num)
{
	static const struct
	{
		const char *name;
		size_t		off;
		size_t		sz;
	}			text[] =
	{
		{"helper", offsetof(hello_info, helper), sizeof(h->helper)},
		{"helper_version", offsetof(hello_info, helper_version), sizeof(h->helper_version)},
		{"runtime", offsetof(hello_info, runtime), sizeof(h->runtime)},
		{"runtime_version", offsetof(hello_info, runtime_version), sizeof(h->runtime_version)},
		{"queue_library", offsetof(hello_info, queue), sizeof(h->queue)},
		{"queue_library_version", offsetof(hello_info, queue_version), sizeof(h->queue_version)},
		{"database", offsetof(hello_info, database), sizeof(h->database)},
		{"system_identifier", offsetof(hello_info, system_identifier), sizeof(h->system_identifier)},
	};
	size_t		i;

	for (i = 0; i < sizeof(text) / sizeof(text[0]); i++)
		if (strcmp(name, text[i].name) == 0)
		{
			if (is_str)
				copy_str((char *) h + text[i].off, text[i].sz, sval);
			return true;
		}
	if (strcmp(name, "wrapper") == 0)
	{
		h->wrapper[0] = '\0';
		h->wrapper_bad = false;
		if (is_str && wrapper_name_ok(sval))
			copy_str(h->wrapper, sizeof(h->wrapper), sval);
		else if (!is_null)
			h->wrapper_bad = true;	/* null: as if absent */
		return true;
	}
	if (strcmp(name, "server_port") == 0)
	{
		if (!is_str && !is_null && num > 0)
			h->server_port = (long) num;
		return true;
	}
	return false;
}

/* where the worker was given the run's database: the end of the sentence */
static const char *
where_run_db(const signoff_state *s)
{
	return s->ctx->dsn ?
		"the runner gives it to the worker in libpq's PG* variables and as IDEMPOTENCY_SIGNOFF_DSN; the "
		"worker's command or its own configuration names another" :
		"the worker inherits the runner's PG* variables; its command or its own configuration names another";
}

static void
read_run_db(signoff_state *s)
{
	PGresult   *res;

	if (run_db_read)
		return;
	run_db_read = true;
	/* libpq itself, not db.c: report.c, which db.c uses, uses this file */
	res = PQexec(s->ctx->conn, "SELECT pg_catalog.current_database(), "
				 "(SELECT system_identifier::text FROM pg_catalog.pg_control_system())");
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
	{
		copy_str(run_db, sizeof(run_db), PQgetvalue(res, 0, 0));
		if (!PQgetisnull(res, 0, 1))
			copy_str(run_sysid, sizeof(run_sysid), PQgetvalue(res, 0, 1));
	}
	else
		copy_str(run_db, sizeof(run_db), PQdb(s->ctx->conn));
	PQclear(res);
}

static bool
same_kind(const hello_info *a, const hello_info *b)
{
	return strcmp(a->helper, b->helper) == 0 && strcmp(a->helper_version, b->helper_version) == 0 &&
		strcmp(a->runtime, b->runtime) == 0 && strcmp(a->runtime_version, b->runtime_version) == 0 &&
		strcmp(a->queue, b->queue) == 0 && strcmp(a->queue_version, b->queue_version) == 0 &&
		strcmp(a->database, b->database) == 0 && strcmp(a->wrapper, b->wrapper) == 0 &&
		a->wrapper_bad == b->wrapper_bad;
}

/*
 * A worker's hello: recorded (once per pid), and its database compared
 * with the run's. Another one stops the run: the case in hand fails with
 * the sentence (case_steps.c fails the next one with it when the hello
 * came between cases), and the later cases are not run.
 */
void
hello_record(signoff_state *s, long pid, const hello_info *h)
{
	int			i;

	for (i = 0; i < nhello_pids; i++)
		if (hello_pids[i] == pid)
			break;
	if (i == nhello_pids && nhello_pids < MAX_HELLOS)
	{
		hello_pids[nhello_pids++] = pid;
		for (i = 0; i < nkinds; i++)
			if (same_kind(&kinds[i].h, h))
				break;
		if (i == nkinds && nkinds < MAX_KINDS)
			kinds[nkinds++].h = *h;
		if (i < nkinds)
			kinds[i].workers++;
	}
	if (h->database[0] == '\0' || s->stopped[0])
		return;					/* not connected yet: nothing to compare */
	read_run_db(s);
	if (strcmp(h->database, run_db) != 0)
		snprintf(s->stopped, sizeof(s->stopped),
				 "the worker (pid %ld) uses the database \"%s\", but the run reads \"%s\" (%s), so no claim of "
				 "the worker's can reach the run: start the worker on the run's database (%s)",
				 pid, h->database, run_db, s->ctx->dsn ? "--dsn" : "libpq's PG* variables", where_run_db(s));
	else if (h->system_identifier[0] && run_sysid[0] && strcmp(h->system_identifier, run_sysid) != 0)
	{
		char		theirs[80];

		if (h->server_port)
			snprintf(theirs, sizeof(theirs), "system identifier %s, port %ld", h->system_identifier,
					 h->server_port);
		else
			snprintf(theirs, sizeof(theirs), "system identifier %s", h->system_identifier);
		snprintf(s->stopped, sizeof(s->stopped),
				 "the worker (pid %ld) uses a database \"%s\" on another server (%s), but the run reads \"%s\" "
				 "on the server with system identifier %s (%s): start the worker on the run's database (%s)",
				 pid, h->database, theirs, run_db, run_sysid, s->ctx->dsn ? "--dsn" : "libpq's PG* variables",
				 where_run_db(s));
	}
	else
		return;
	if (s->cr)
	{
		case_fail(s->cr, "%s", s->stopped);
		s->stop_said = true;
	}
}

/*
 * judged with the verdict error, for a key of the case: the case fails at
 * once with the claim's SQLSTATE and message (ID002 is case 11's verdict,
 * judged with the others)
 */
void
claim_error_seen(signoff_state *s, const exch *x)
{
	if (s->cr == NULL || strcmp(x->verdict, "error") != 0 || strcmp(x->sqlstate, "ID002") == 0 ||
		s->claim_failed == s->cr || s->stopped[0])
		return;
	s->claim_failed = s->cr;
	if (x->sqlstate[0])
		case_fail(s->cr, "the claim failed: %s %s (worker pid %ld, key %s)", x->sqlstate,
				  x->message[0] ? x->message : "(the helper sent no message)", x->pid, x->key);
	else
		case_fail(s->cr, "the claim failed without an SQLSTATE (a lost connection that did not come back "
				  "within the helper's reconnect bound): %s (worker pid %ld, key %s)",
				  x->message[0] ? x->message : "(the helper sent no message)", x->pid, x->key);
}

/* does the case in hand (or the run) stand failed, so no wait can help? */
bool
run_stopped(const signoff_state *s)
{
	return s->stopped[0] || (s->cr != NULL && s->claim_failed == s->cr);
}

/* worker processes that said hello */
int
hello_workers(void)
{
	return nhello_pids;
}

/* what made the claims, in words */
static void
wrapper_text(StringInfo b, const hello_info *h)
{
	if (h->wrapper_bad)
		appendStringInfoString(b, "a wrapper that is not a name");
	else if (h->wrapper[0] == '\0')
		appendStringInfoString(b, "wrapper not reported");
	else if (strcmp(h->wrapper, "plain") == 0)
		appendStringInfoString(b, "the plain functions");
	else if (strcmp(h->wrapper, "plain_batch") == 0)
		appendStringInfoString(b, "the plain functions' batch call");
	else
		appendStringInfo(b, "wrapper %s", h->wrapper);
}

static void
kind_text(StringInfo b, const hello_info *h)
{
	appendStringInfo(b, "%s %s (%s %s", h->helper[0] ? h->helper : "?", h->helper_version[0] ? h->helper_version : "?",
			  h->runtime[0] ? h->runtime : "?", h->runtime_version);
	if (h->queue[0])
		appendStringInfo(b, ", %s %s", h->queue, h->queue_version[0] ? h->queue_version : "?");
	else
		appendStringInfoString(b, ", no queue library");
	appendStringInfo(b, ", database %s)", h->database[0] ? h->database : "unknown");
	appendStringInfoString(b, ", ");
	wrapper_text(b, h);
}

/* the helpers that ran, for the report's settings: one line */
void
hello_text(StringInfo b)
{
	int			i;

	if (nkinds == 0)
	{
		appendStringInfoString(b, "no worker said which (a helper without the point hello, or a worker of your own that does not send it)");
		return;
	}
	for (i = 0; i < nkinds; i++)
	{
		if (i)
			appendStringInfoString(b, "; ");
		kind_text(b, &kinds[i].h);
		appendStringInfo(b, ", in %d worker process%s", kinds[i].workers, kinds[i].workers == 1 ? "" : "es");
	}
}

static void
json_or_null(StringInfo b, const char *s)
{
	if (s[0])
		json_string(b, s);
	else
		appendStringInfoString(b, "null");
}

/* the signoff object's "helpers": an array, one object per kind */
void
hello_json(StringInfo b)
{
	int			i;

	appendStringInfoString(b, "[");
	for (i = 0; i < nkinds; i++)
	{
		const hello_info *h = &kinds[i].h;

		appendStringInfoString(b, i ? ",\n      {\"helper\": " : "\n      {\"helper\": ");
		json_or_null(b, h->helper);
		appendStringInfoString(b, ", \"helper_version\": ");
		json_or_null(b, h->helper_version);
		appendStringInfoString(b, ", \"runtime\": ");
		json_or_null(b, h->runtime);
		appendStringInfoString(b, ", \"runtime_version\": ");
		json_or_null(b, h->runtime_version);
		appendStringInfoString(b, ", \"queue_library\": ");
		json_or_null(b, h->queue);
		appendStringInfoString(b, ", \"queue_library_version\": ");
		json_or_null(b, h->queue_version);
		appendStringInfoString(b, ", \"database\": ");
		json_or_null(b, h->database);
		appendStringInfoString(b, ", \"wrapper\": ");
		json_or_null(b, h->wrapper_bad ? "" : h->wrapper);
		appendStringInfo(b, ", \"workers\": %d}", kinds[i].workers);
	}
	appendStringInfoString(b, nkinds ? "\n    ]" : "]");
}

/*
 * What made the claims, one word per kind of worker, for JUnit's
 * properties: "IdempotentTask", "plain, idempotentBatch"; "not reported"
 * where a worker's helper sent none, "" when no worker said hello
 */
void
hello_wrappers(StringInfo b)
{
	int			i,
				j;

	for (i = 0; i < nkinds; i++)
	{
		const hello_info *h = &kinds[i].h;
		const char *w = h->wrapper_bad ? "not a name" : h->wrapper[0] ? h->wrapper : "not reported";

		for (j = 0; j < i; j++)
		{
			const hello_info *o = &kinds[j].h;

			if (strcmp(w, o->wrapper_bad ? "not a name" : o->wrapper[0] ? o->wrapper : "not reported") == 0)
				break;
		}
		if (j < i)
			continue;			/* said already */
		if (b->data[0])
			appendStringInfoString(b, ", ");
		appendStringInfoString(b, w);
	}
}
