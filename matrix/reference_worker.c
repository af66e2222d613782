/*
 * worker.c
 *		Worker processes: every delivery is a fork()ed process with its own
 *		database connection.
 *
 * A worker talks to the runner over two pipes. It reports each step as one
 * line on its event pipe ("ready <backend pid>", "verdict run 1 -",
 * "sent <id>", ...), each line a single write() shorter than PIPE_BUF. At a
 * pause point it reports "paused <where>" and blocks reading its command
 * pipe; the runner then either writes "go" or SIGKILLs it. That is how a
 * death lands exactly after the claim committed, or exactly after the email
 * left: the worker is provably standing at that point when it dies, and no
 * sleep is involved.
 *
 * Workers that must start at the same instant block on a shared barrier
 * pipe; the runner closes its write end once all of them reported "ready"
 * (connected), and every read() returns 0 at once.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "matrix.h"

#define MAX_LIVE 256
static worker *live[MAX_LIVE];

/* ---------------------------------------------------------------------
 * The worker process
 * --------------------------------------------------------------------- */

static void emit(int fd, const char *fmt,...) MX_PRINTF(2, 3);

static void
emit(int fd, const char *fmt,...)
{
	char		line[1024];
	va_list		ap;
	int			n;
	char	   *p;

	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t) n > sizeof(line) - 2)
		n = (int) sizeof(line) - 2;
	/* one event, one line */
	for (p = line; p < line + n; p++)
		if (*p == '\n' || *p == '\r')
			*p = ' ';
	line[n++] = '\n';
	if (write(fd, line, (size_t) n) < 0)
		_exit(4);
}

/* block until the runner says "go"; a closed pipe means the runner is gone */
static void
wait_go(int cmd)
{
	char		c;

	for (;;)
	{
		ssize_t		r = read(cmd, &c, 1);

		if (r == 0)
			_exit(3);
		if (r < 0)
		{
			if (errno == EINTR)
				continue;
			_exit(3);
		}
		if (c == '\n')
			return;
	}
}

static void
pause_at(int ev, int cmd, const char *where)
{
	emit(ev, "paused %s", where);
	wait_go(cmd);
}

static const char *
sqlstate_of(const PGresult *res)
{
	const char *s = PQresultErrorField(res, PG_DIAG_SQLSTATE);

	return s ? s : "-----";
}

static const char *
message_of(const PGresult *res, PGconn *conn)
{
	const char *s = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);

	return s ? s : PQerrorMessage(conn);
}

static bool
exec_ok(PGconn *conn, const char *sql, int ev)
{
	PGresult   *res = PQexec(conn, sql);
	bool		ok = PQresultStatus(res) == PGRES_COMMAND_OK;

	if (!ok)
		emit(ev, "fatal %s: %s %s", sql, sqlstate_of(res), message_of(res, conn));
	PQclear(res);
	return ok;
}

static void
ignore_notice(void *arg, const char *message)
{
	(void) arg;
	(void) message;
}

static void child_main(matrix_ctx *ctx, const worker_spec *s, const char *name,
					   int ev, int cmd, int barrier) __attribute__((noreturn));

static void
child_main(matrix_ctx *ctx, const worker_spec *s, const char *name,
		   int ev, int cmd, int barrier)
{
	const char *keys[3];
	const char *vals[3];
	char		appname[64];
	PGconn	   *conn;
	PGresult   *res;
	const char *params[4];
	char		verdict[32];
	char		attempt_s[16];
	int			attempt;
	char		message_id[96];
	int			i = 0;
	bool		tx = s->mode == W_TX;

	snprintf(appname, sizeof(appname), "idempotency-matrix %s", name);
	if (ctx->dsn)
	{
		keys[i] = "dbname";
		vals[i++] = ctx->dsn;
	}
	keys[i] = "application_name";
	vals[i++] = appname;
	keys[i] = NULL;
	vals[i] = NULL;
	conn = PQconnectdbParams(keys, vals, 1);
	if (PQstatus(conn) != CONNECTION_OK)
	{
		emit(ev, "fatal connection failed: %s", PQerrorMessage(conn));
		_exit(2);
	}
	PQsetNoticeProcessor(conn, ignore_notice, NULL);
	emit(ev, "ready %d", PQbackendPID(conn));

	/* the barrier: every worker of the case leaves it at the same instant */
	if (barrier >= 0)
	{
		char		c;
		ssize_t		r;

		while ((r = read(barrier, &c, 1)) != 0)
			if (r < 0 && errno != EINTR)
				break;
	}

	if (tx)
	{
		/* the server's pid (through a pooler, PQbackendPID is the pooler's) */
		if (!exec_ok(conn, "BEGIN", ev))
			_exit(2);
		res = PQexec(conn, "SELECT pg_catalog.pg_backend_pid()");
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			emit(ev, "fatal pg_backend_pid(): %s %s", sqlstate_of(res), message_of(res, conn));
			_exit(2);
		}
		emit(ev, "backend %s", PQgetvalue(res, 0, 0));
		PQclear(res);
	}

	params[0] = s->job_type;
	params[1] = s->key;
	params[2] = s->fingerprint;
	params[3] = name;
	res = PQexecParams(conn,
					   "SELECT verdict::text, attempt, result::text "
					   "FROM idempotency.claim_operation($1, $2, $3, $4)",
					   4, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		emit(ev, "error %s %s", sqlstate_of(res), message_of(res, conn));
		PQclear(res);
		PQfinish(conn);
		_exit(0);
	}
	if (PQntuples(res) != 1)
	{
		emit(ev, "fatal claim_operation returned %d rows", PQntuples(res));
		_exit(2);
	}
	copy_str(verdict, sizeof(verdict), PQgetvalue(res, 0, 0));
	attempt = PQgetisnull(res, 0, 1) ? 0 : atoi(PQgetvalue(res, 0, 1));
	emit(ev, "verdict %s %d %s", verdict, attempt,
		 PQgetisnull(res, 0, 2) ? "-" : PQgetvalue(res, 0, 2));
	PQclear(res);

	if (strcmp(verdict, "run") != 0 && strcmp(verdict, "verify") != 0)
	{
		/* completed, in_progress, held, skipped: stop */
		if (tx)
			exec_ok(conn, "COMMIT", ev);
		PQfinish(conn);
		_exit(0);
	}
	snprintf(attempt_s, sizeof(attempt_s), "%d", attempt);

	if (tx)
	{
		/* the effect is a row in the same database, in the claim's txn */
		char		sql[512];
		const char *p[4];

		snprintf(sql, sizeof(sql),
				 "INSERT INTO %s (job_type, operation_key, attempt, worker) "
				 "VALUES ($1, $2, $3, $4)", s->effects_table);
		p[0] = s->job_type;
		p[1] = s->key;
		p[2] = attempt_s;
		p[3] = name;
		res = PQexecParams(conn, sql, 4, NULL, p, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_COMMAND_OK)
		{
			emit(ev, "fatal effect row: %s %s", sqlstate_of(res), message_of(res, conn));
			_exit(2);
		}
		PQclear(res);
		emit(ev, "effect");
		if (s->pauses & PAUSE_CLAIMED)
			pause_at(ev, cmd, "in-transaction");
		copy_str(message_id, sizeof(message_id), "row");
	}
	else if (s->mode == W_RELEASE)
	{
		const char *p[3];

		/* the provider refused before sending: a known failure */
		emit(ev, "refused");
		p[0] = s->job_type;
		p[1] = s->key;
		p[2] = attempt_s;
		res = PQexecParams(conn,
						   "SELECT idempotency.release_operation($1, $2, $3)",
						   3, NULL, p, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
			emit(ev, "release-error %s %s", sqlstate_of(res), message_of(res, conn));
		else
			emit(ev, "released");
		PQclear(res);
		PQfinish(conn);
		_exit(0);
	}
	else
	{
		bool		found = false;

		if (s->pauses & PAUSE_CLAIMED)
			pause_at(ev, cmd, "claimed");

		if (s->mode == W_HEARTBEAT)
		{
			/* the long job: heartbeat until the runner lets it finish */
			int			ms = (int) (s->heartbeat_s * 1000.0);
			int			beats = 0;
			const char *p[3];

			p[0] = s->job_type;
			p[1] = s->key;
			p[2] = attempt_s;
			for (;;)
			{
				struct pollfd pfd;
				int			r;

				pfd.fd = cmd;
				pfd.events = POLLIN;
				pfd.revents = 0;
				r = poll(&pfd, 1, ms);
				if (r < 0 && errno == EINTR)
					continue;
				if (r != 0)
				{
					wait_go(cmd);
					break;
				}
				res = PQexecParams(conn,
								   "SELECT idempotency.extend_lease($1, $2, $3)",
								   3, NULL, p, NULL, NULL, 0);
				if (PQresultStatus(res) != PGRES_TUPLES_OK)
					emit(ev, "extend-error %s %s", sqlstate_of(res), message_of(res, conn));
				else
					emit(ev, "extended %d %s", ++beats, PQgetvalue(res, 0, 0));
				PQclear(res);
			}
		}

		if (strcmp(verdict, "verify") == 0)
		{
			int			l = s->lookup_provider ? provider_lookup(s->mailbox, s->key) : 0;

			if (l < 0)
			{
				emit(ev, "fatal lookup: %s", strerror(errno));
				_exit(2);
			}
			found = l == 1;
			emit(ev, "lookup %s", found ? "found" : "missing");
		}
		if (!found)
		{
			if (provider_send(s->mailbox, s->lookup_provider, s->key, name,
							  attempt, message_id, sizeof(message_id)) != 0)
			{
				emit(ev, "fatal provider: %s", strerror(errno));
				_exit(2);
			}
			emit(ev, "sent %s", message_id);
			if (s->pauses & PAUSE_SENT)
				pause_at(ev, cmd, "sent");
		}
		else
			copy_str(message_id, sizeof(message_id), "found-by-lookup");
	}

	/* complete, with the attempt as the fencing token */
	{
		sbuf		result;
		const char *p[4];

		sb_init(&result);
		sb_puts(&result, "{\"message_id\": ");
		json_string(&result, message_id);
		sb_puts(&result, ", \"worker\": ");
		json_string(&result, name);
		sb_puts(&result, "}");
		p[0] = s->job_type;
		p[1] = s->key;
		p[2] = attempt_s;
		p[3] = sb_str(&result);
		res = PQexecParams(conn,
						   "SELECT idempotency.complete_operation($1, $2, $3, $4::jsonb)",
						   4, NULL, p, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			emit(ev, "complete-error %s %s", sqlstate_of(res), message_of(res, conn));
			PQclear(res);
			if (tx)
				exec_ok(conn, "ROLLBACK", ev);
			PQfinish(conn);
			_exit(0);
		}
		PQclear(res);
		if (tx && !exec_ok(conn, "COMMIT", ev))
			_exit(2);
		emit(ev, "completed");
	}
	PQfinish(conn);
	_exit(0);
}

/* ---------------------------------------------------------------------
 * The runner's side
 * --------------------------------------------------------------------- */

static void
track(worker *w)
{
	int			i;

	for (i = 0; i < MAX_LIVE; i++)
		if (live[i] == NULL)
		{
			live[i] = w;
			return;
		}
}

static void
untrack(worker *w)
{
	int			i;

	for (i = 0; i < MAX_LIVE; i++)
		if (live[i] == w)
			live[i] = NULL;
}

/*
 * Fork a worker for one delivery. barrier_rd is the read end of the case's
 * barrier pipe, or -1 to claim as soon as it is connected. Returns 0, or -1
 * with w->problem set.
 */
int
worker_spawn(matrix_ctx *ctx, worker *w, const worker_spec *spec,
			 const char *name, int barrier_rd)
{
	int			ev[2];
	int			cmd[2];
	pid_t		parent = getpid();
	pid_t		pid;

	memset(w, 0, sizeof(*w));
	w->ev_fd = -1;
	w->cmd_fd = -1;
	w->lookup = -1;
	w->pid = -1;
	copy_str(w->name, sizeof(w->name), name);

	if (pipe(ev) != 0)
	{
		snprintf(w->problem, sizeof(w->problem), "pipe: %s", strerror(errno));
		return -1;
	}
	if (pipe(cmd) != 0)
	{
		snprintf(w->problem, sizeof(w->problem), "pipe: %s", strerror(errno));
		close(ev[0]);
		close(ev[1]);
		return -1;
	}
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0)
	{
		snprintf(w->problem, sizeof(w->problem), "fork: %s", strerror(errno));
		close(ev[0]);
		close(ev[1]);
		close(cmd[0]);
		close(cmd[1]);
		return -1;
	}
	if (pid == 0)
	{
		int			fd;
		int			maxfd = (int) sysconf(_SC_OPEN_MAX);

		/* die with the runner, whatever kills it */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		signal(SIGPIPE, SIG_DFL);

		/*
		 * Keep only this worker's pipes: the runner's connection, the other
		 * workers' pipes and the barrier's write end must not live on here
		 * (a barrier whose write end a worker holds would never open).
		 */
		if (maxfd < 0 || maxfd > 65536)
			maxfd = 65536;
		for (fd = 3; fd < maxfd; fd++)
			if (fd != ev[1] && fd != cmd[0] && fd != barrier_rd)
				close(fd);
		child_main(ctx, spec, name, ev[1], cmd[0], barrier_rd);
	}
	close(ev[1]);
	close(cmd[0]);
	w->pid = pid;
	w->ev_fd = ev[0];
	w->cmd_fd = cmd[1];
	track(w);
	return 0;
}

/* take in one event line */
static void
absorb(worker *w, char *line)
{
	char	   *rest = strchr(line, ' ');
	char	   *word = line;

	if (rest)
		*rest++ = '\0';
	else
		rest = line + strlen(line);

	if (strcmp(word, "ready") == 0)
	{
		w->ready = true;
		w->backend_pid = atoi(rest);
	}
	else if (strcmp(word, "backend") == 0)
		w->backend_pid = atoi(rest);
	else if (strcmp(word, "verdict") == 0)
	{
		char		v[32] = "";
		int			a = 0;
		int			off = 0;

		if (sscanf(rest, "%31s %d %n", v, &a, &off) >= 2)
		{
			copy_str(w->verdict, sizeof(w->verdict), v);
			w->attempt = a;
			copy_str(w->result, sizeof(w->result), off > 0 ? rest + off : "-");
		}
		else
			snprintf(w->problem, sizeof(w->problem), "unreadable claim answer: %s", rest);
	}
	else if (strcmp(word, "error") == 0)
	{
		copy_str(w->claim_error, sizeof(w->claim_error), rest);
		if (strlen(rest) >= 5)
			w->claim_error[5] = '\0';
		copy_str(w->error_text, sizeof(w->error_text), strlen(rest) > 6 ? rest + 6 : "");
	}
	else if (strcmp(word, "lookup") == 0)
		w->lookup = strcmp(rest, "found") == 0 ? 1 : 0;
	else if (strcmp(word, "sent") == 0)
	{
		w->sent++;
		copy_str(w->message_id, sizeof(w->message_id), rest);
	}
	else if (strcmp(word, "effect") == 0)
		w->effect = true;
	else if (strcmp(word, "paused") == 0)
		w->paused = true;
	else if (strcmp(word, "extended") == 0)
		w->extended++;
	else if (strcmp(word, "extend-error") == 0)
		snprintf(w->problem, sizeof(w->problem), "extend_lease failed: %s", rest);
	else if (strcmp(word, "released") == 0)
		w->released = true;
	else if (strcmp(word, "release-error") == 0)
		snprintf(w->problem, sizeof(w->problem), "release_operation failed: %s", rest);
	else if (strcmp(word, "completed") == 0)
		w->completed = true;
	else if (strcmp(word, "complete-error") == 0)
	{
		copy_str(w->complete_error, sizeof(w->complete_error), rest);
		if (strlen(rest) >= 5)
			w->complete_error[5] = '\0';
		copy_str(w->error_text, sizeof(w->error_text), strlen(rest) > 6 ? rest + 6 : "");
	}
	else if (strcmp(word, "fatal") == 0)
		snprintf(w->problem, sizeof(w->problem), "%s", rest);
}

/* the worker closed its event pipe: collect its exit status */
static void
reap(worker *w)
{
	int			status;

	if (w->reaped || w->pid <= 0)
		return;
	while (waitpid(w->pid, &status, 0) < 0)
		if (errno != EINTR)
			return;
	w->reaped = true;
	if (WIFEXITED(status))
		w->exit_status = WEXITSTATUS(status);
	else
		w->exit_status = 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
	if (w->exit_status != 0 && !w->killed && w->problem[0] == '\0')
		snprintf(w->problem, sizeof(w->problem), "worker exited with status %d", w->exit_status);
}

/*
 * Read one line; 1: a line, 0: end of file, -1: timeout, -2: interrupted.
 * timeout_ms < 0 blocks; 0 only takes what is there.
 */
static int
read_line(worker *w, char *out, size_t outsz, int timeout_ms)
{
	double		deadline = now_seconds() + timeout_ms / 1000.0;

	for (;;)
	{
		char	   *nl = memchr(w->buf, '\n', w->buflen);
		struct pollfd pfd;
		int			left;
		int			r;
		ssize_t		n;

		if (nl)
		{
			size_t		len = (size_t) (nl - w->buf);

			if (len >= outsz)
				len = outsz - 1;
			memcpy(out, w->buf, len);
			out[len] = '\0';
			w->buflen -= (size_t) (nl - w->buf) + 1;
			memmove(w->buf, nl + 1, w->buflen);
			return 1;
		}
		if (w->eof)
			return 0;
		if (matrix_interrupted)
			return -2;
		left = timeout_ms < 0 ? -1 : (int) ((deadline - now_seconds()) * 1000.0);
		if (timeout_ms >= 0 && left < 0)
			left = 0;
		pfd.fd = w->ev_fd;
		pfd.events = POLLIN;
		pfd.revents = 0;
		r = poll(&pfd, 1, left);
		if (r < 0)
		{
			if (errno == EINTR)
				continue;
			return -2;
		}
		if (r == 0)
			return -1;
		if (w->buflen >= sizeof(w->buf) - 1)
			w->buflen = 0;		/* an absurd line: drop it */
		n = read(w->ev_fd, w->buf + w->buflen, sizeof(w->buf) - 1 - w->buflen);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			w->eof = true;
		else
			w->buflen += (size_t) n;
	}
}

static bool
event_is(const char *line, const char *event)
{
	size_t		n;

	if (strcmp(event, "claim") == 0)
		return event_is(line, "verdict") || event_is(line, "error");
	n = strlen(event);
	return strncmp(line, event, n) == 0 && (line[n] == ' ' || line[n] == '\0');
}

/*
 * Wait for the worker's next event named `event` ("ready", "claim" = its
 * verdict or claim error, "paused", "extended", ...), or with event NULL
 * until it exits. Every event on the way is taken in. False, with
 * w->problem set, when the worker exits first, reports a fatal error, or
 * nothing comes within ctx->timeout_s.
 */
bool
worker_wait(matrix_ctx *ctx, worker *w, const char *event)
{
	double		deadline = now_seconds() + ctx->timeout_s;

	for (;;)
	{
		char		line[1100];
		char		copy[1100];
		int			left = (int) ((deadline - now_seconds()) * 1000.0);
		int			r = read_line(w, line, sizeof(line), left < 0 ? 0 : left);

		if (r == 1)
		{
			copy_str(copy, sizeof(copy), line);
			absorb(w, copy);
			if (event_is(line, "fatal"))
				return false;
			if (event && event_is(line, event))
				return true;
			continue;
		}
		if (r == 0)
		{
			reap(w);
			if (event == NULL)
				return w->problem[0] == '\0';
			if (w->problem[0] == '\0')
				snprintf(w->problem, sizeof(w->problem),
						 "%s exited before \"%s\"", w->name, event);
			return false;
		}
		snprintf(w->problem, sizeof(w->problem), "%s: %s waiting for \"%s\"",
				 w->name, r == -1 ? "timed out" : "interrupted",
				 event ? event : "exit");
		return false;
	}
}

/* take in whatever events are there without waiting; false once it exited */
bool
worker_drain(worker *w)
{
	char		line[1100];
	int			r;

	while ((r = read_line(w, line, sizeof(line), 0)) == 1)
		absorb(w, line);
	if (r == 0)
	{
		reap(w);
		return false;
	}
	return true;
}

/* let a paused worker go on */
void
worker_go(worker *w)
{
	w->paused = false;
	if (w->cmd_fd >= 0 && write(w->cmd_fd, "go\n", 3) != 3)
		snprintf(w->problem, sizeof(w->problem), "%s: cannot signal it: %s",
				 w->name, strerror(errno));
}

/* the worker's death: SIGKILL, no chance to clean up, then reap it */
void
worker_kill(worker *w)
{
	if (w->pid > 0 && !w->reaped)
	{
		kill(w->pid, SIGKILL);
		w->killed = true;
		reap(w);
	}
}

void
worker_dispose(worker *w)
{
	worker_kill(w);
	if (w->ev_fd >= 0)
		close(w->ev_fd);
	if (w->cmd_fd >= 0)
		close(w->cmd_fd);
	w->ev_fd = -1;
	w->cmd_fd = -1;
	untrack(w);
}

/* on the way out: no worker outlives the runner */
void
workers_kill_all(void)
{
	int			i;

	for (i = 0; i < MAX_LIVE; i++)
		if (live[i])
			worker_dispose(live[i]);
}

/* what the worker's claim answered, as the matrix shows it */
const char *
worker_verdict_text(const worker *w, char *buf, size_t sz)
{
	if (w->claim_error[0])
		snprintf(buf, sz, "%s", w->claim_error);
	else if (strcmp(w->verdict, "verify") == 0 && w->lookup >= 0)
		snprintf(buf, sz, "verify (%s)", w->lookup ? "found" : "not found");
	else if (w->verdict[0])
		snprintf(buf, sz, "%s", w->verdict);
	else
		snprintf(buf, sz, "%s", "no answer");
	return buf;
}
