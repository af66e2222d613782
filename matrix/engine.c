/*
 * engine.c
 *		The engine of both runs: it starts a job's workers (each in a
 *		process group of its own), serves the sign-off protocol's socket,
 *		runs the job's commands, waits for points, kills at them, and reads
 *		what a case observed. The steps of each case, and the run over the
 *		policies and cases, are case_steps.c's.
 *
 * docs/signoff.md is the user's description; docs/signoff-protocol.md the
 * protocol the helpers speak. In short: the runner starts the user's worker
 * command (each in a process group of its own, via setsid, with
 * IDEMPOTENCY_SIGNOFF naming the runner's Unix socket), enqueues messages
 * with the user's enqueue command, and the helper in the worker reports the
 * points claimed, judged and handled over the socket: one line of JSON per
 * point, on a connection of its own, answered with one line ("continue",
 * "fail") or not at all, while the runner SIGKILLs the worker's process
 * group. A user's job (--job) and the reference job (reference.c) are run
 * alike; which cases a job has, and what each must give, is
 * case_table.c's; the effects are counted by the job file's effects command
 * or effects_sql, else by the handled reports.
 *
 * How a case runs: the case "arms" the point it wants to hold for a key
 * (one-shot); every other exchange is answered "continue" at once and only
 * recorded. Each exchange of a claimed or judged point is one delivery of a
 * message; a handled point belongs to its claimed one (key, pid, attempt).
 * The verdicts of a case are its keys' deliveries in the order they
 * arrived. At the end of a case its workers are stopped (SIGTERM to each
 * group, which a worker takes as "finish the message in hand and exit";
 * SIGKILL after the timeout), or, for a job file's run, they stay for the
 * next case, as a queue's workers do; then the effects are counted. An
 * effect a worker makes after its last point (after "judged" or
 * "handled") is counted too, at the latest by the drain's count.
 *
 * Waiting is for events, never a guessed time: poll() on the socket (with
 * the job file's timeout as the bound), stale_claims() polled for a lease
 * to run out, the record polled for a completion or a release.
 */
#include "postgres_fe.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "common/logging.h"
#include "diagnosis.h"
#include "engine.h"

sproc		procs[MAX_PROCS];
int			nprocs;
signoff_state *live_state;

/* ---------------------------------------------------------------------
 * Processes: each in a session and process group of its own
 * --------------------------------------------------------------------- */

/* the command with every {key} replaced by the key, shell-quoted */
static void
expand(StringInfo b, const char *tmpl, const char *key)
{
	const char *p = tmpl;

	while (*p)
	{
		const char *k = key ? strstr(p, "{key}") : NULL;

		if (k == NULL)
		{
			appendStringInfoString(b, p);
			break;
		}
		appendBinaryStringInfo(b, p, (size_t) (k - p));
		shell_quote(b, key);
		p = k + 5;
	}
}

/*
 * /bin/sh -c cmd in the job's directory, in a new session (so a process
 * group of its own, whose id is the pid), stdin from /dev/null, stdout and
 * stderr to the given files, with the environment plus env ("NAME=value",
 * NULL-terminated) and without the variables of the sign-off protocol
 * unless env sets them. Returns the pid once the shell has started (after
 * setsid), or -1 (reason in why).
 */
static pid_t
spawn(signoff_state *s, const char *cmd, const char *out_path, const char *err_path,
	  bool append, char *const *env, char *why, size_t wsz)
{
	int			sync[2];
	pid_t		parent = getpid();
	pid_t		pid;
	char		c;
	ssize_t		r;

	if (pipe2(sync, O_CLOEXEC) != 0)
	{
		snprintf(why, wsz, "pipe: %s", strerror(errno));
		return -1;
	}
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0)
	{
		snprintf(why, wsz, "fork: %s", strerror(errno));
		close(sync[0]);
		close(sync[1]);
		return -1;
	}
	if (pid == 0)
	{
		int			flags = O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC);
		int			fd;
		int			maxfd = (int) sysconf(_SC_OPEN_MAX);
		sigset_t	none;

		setsid();
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		signal(SIGHUP, SIG_DFL);
		signal(SIGPIPE, SIG_DFL);
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		fd = open("/dev/null", O_RDONLY);
		if (fd >= 0 && fd != 0)
		{
			dup2(fd, 0);
			close(fd);
		}
		fd = open(out_path, flags, 0644);
		if (fd >= 0 && fd != 1)
		{
			dup2(fd, 1);
			close(fd);
		}
		if (err_path == NULL)
			dup2(1, 2);
		else
		{
			fd = open(err_path, flags, 0644);
			if (fd >= 0 && fd != 2)
			{
				dup2(fd, 2);
				close(fd);
			}
		}
		if (maxfd < 0 || maxfd > 65536)
			maxfd = 65536;
		for (fd = 3; fd < maxfd; fd++)
			if (fd != sync[1])
				close(fd);
		unsetenv("IDEMPOTENCY_SIGNOFF");
		unsetenv("IDEMPOTENCY_SIGNOFF_JOB_TYPES");
		unsetenv("IDEMPOTENCY_SIGNOFF_LEASE");
		unsetenv("IDEMPOTENCY_SIGNOFF_CASE");
		unsetenv("IDEMPOTENCY_SIGNOFF_DSN");
		unsetenv("IDEMPOTENCY_SIGNOFF_RUN");
		unsetenv("IDEMPOTENCY_SIGNOFF_HTTP");
		unsetenv("IDEMPOTENCY_SIGNOFF_SMTP");
		unsetenv("IDEMPOTENCY_SIGNOFF_HELLO");
		unsetenv("IDEMPOTENCY_SIGNOFF_ENDED");
		for (; env && *env; env++)
			putenv(*env);
		if (chdir(s->job->dir) != 0)
		{
			pg_log_error("cannot enter %s: %s", s->job->dir, strerror(errno));
			_exit(127);
		}
		execl("/bin/sh", "sh", "-c", cmd, (char *) NULL);
		pg_log_error("cannot run /bin/sh: %s", strerror(errno));
		_exit(127);
	}
	close(sync[1]);
	/* EOF once the child has called exec (after setsid): its group exists */
	while ((r = read(sync[0], &c, 1)) < 0 && errno == EINTR)
		;
	close(sync[0]);
	return pid;
}

/* a slot for a new group (a free one: its group is gone and forgotten) */
static int
track_proc(pid_t pid, const char *name, const char *log)
{
	sproc	   *p;
	int			i;

	for (i = 0; i < nprocs; i++)
		if (!procs[i].used)
			break;
	if (i == nprocs)
	{
		if (nprocs >= MAX_PROCS)
			return -1;
		nprocs++;
	}
	p = &procs[i];
	memset(p, 0, sizeof(*p));
	p->used = true;
	p->pid = pid;
	guardian_group(pid);
	copy_str(p->name, sizeof(p->name), name);
	copy_str(p->log, sizeof(p->log), log);
	return i;
}

/* a group that is gone: its slot may be used again */
void
forget_proc(int i)
{
	if (procs[i].gone)
		procs[i].used = false;
}

static int
status_of(int st)
{
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	if (WIFSIGNALED(st))
		return 128 + WTERMSIG(st);
	return -1;
}

/*
 * Reap what there is to reap of our groups (the runner is a child
 * subreaper, so a group's orphans are its children too) and note which
 * groups are gone.
 */
static void
reap(void)
{
	int			i;

	for (i = 0; i < nprocs; i++)
	{
		sproc	   *p = &procs[i];
		int			st;
		pid_t		r;

		if (!p->used || p->gone)
			continue;
		while ((r = waitpid(-p->pid, &st, WNOHANG)) > 0)
			if (r == p->pid)
			{
				p->reaped = true;
				p->status = status_of(st);
			}
		if (!p->reaped && r < 0 && errno == ECHILD)
			p->reaped = true;	/* reaped elsewhere; status unknown */
		if (p->reaped && kill(-p->pid, 0) != 0 && errno == ESRCH)
		{
			p->gone = true;
			guardian_gone(p->pid);
		}
	}
}

/* SIGKILL to the group, and wait (bounded) until it is gone */
static void
kill_group(sproc *p)
{
	double		t0 = now_seconds();

	if (p->gone)
		return;
	kill(-p->pid, SIGKILL);
	p->killed = true;
	for (;;)
	{
		reap();
		if (p->gone || now_seconds() - t0 > 5.0)
			break;
		{
			struct timespec ts = {0, 1000000L};

			nanosleep(&ts, NULL);
		}
	}
}

/* on the way out (exit, error, a signal): every group the run started */
void
signoff_kill_all(matrix_ctx *ctx)
{
	int			i;

	(void) ctx;
	for (i = 0; i < nprocs; i++)
		if (procs[i].used && !procs[i].gone)
			kill(-procs[i].pid, SIGKILL);
	for (i = 0; i < nprocs; i++)
		if (procs[i].used)
			kill_group(&procs[i]);
	effect_stop();
}

/* the socket and the logs; the logs stay where a case failed */
void
signoff_remove_dir(matrix_ctx *ctx, bool keep_logs)
{
	DIR		   *d;
	struct dirent *de;

	if (ctx->signoff_dir[0] == '\0')
		return;
	if (live_state && live_state->lfd >= 0)
	{
		close(live_state->lfd);
		live_state->lfd = -1;
	}
	d = opendir(ctx->signoff_dir);
	if (d)
	{
		while ((de = readdir(d)) != NULL)
		{
			char		path[600];
			size_t		n = strlen(de->d_name);

			if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
				continue;
			if (keep_logs && n > 4 && strcmp(de->d_name + n - 4, ".log") == 0)
				continue;
			snprintf(path, sizeof(path), "%s/%s", ctx->signoff_dir, de->d_name);
			unlink(path);
		}
		closedir(d);
	}
	if (rmdir(ctx->signoff_dir) != 0 && keep_logs)
		pg_log_info("the worker logs are kept in %s", ctx->signoff_dir);
}

/*
 * A line of a library's warnings that says nothing of the job: Python's
 * DeprecationWarning and its source line, Node's deprecation notices, the
 * AWS SDK's notice of Node versions, the redis gem's deprecation notices
 * under Debian's Sidekiq 6.4 ("Redis#sadd will always return an Integer
 * in Redis 5.0.0 ...(called from: ...)", "Passing the timeout as a
 * positional argument is deprecated ...:" and its indented example line)
 * and Sidekiq's own ("... will be removed in Sidekiq 7.0"). A notice whose
 * line ends with ":" goes on in the indented (or empty) lines after it
 * (notice: in it, kept by the caller). Left out of a log's tail (counted).
 */
static bool
log_noise(const char *line, bool *notice)
{
	static const char *const noise[] = {
		"DeprecationWarning", "PendingDeprecationWarning", "deprecated", "Deprecated",
		"--trace-warnings", "--trace-deprecation", "will no longer support Node.js",
		"warnings.warn(", "NOTE: The AWS SDK for JavaScript",
		"(called from: ", "will always return an Integer", "will return an Integer",
		"will be removed in Sidekiq", "will be removed in Redis", "will be removed in redis-rb",
	};
	size_t		i;
	size_t		n = strlen(line);

	if (*notice && (n == 0 || line[0] == ' ' || line[0] == '\t' ||
					strncmp(line, "You should use the following form instead", 41) == 0))
		return true;
	*notice = false;
	for (i = 0; i < sizeof(noise) / sizeof(noise[0]); i++)
		if (strstr(line, noise[i]))
		{
			*notice = n > 0 && line[n - 1] == ':';
			return true;
		}
	return false;
}

/*
 * The last lines of a file, as notes ("  | line"), without library
 * warnings; the helper's last line first when the end has none of its.
 */
static void
note_tail(case_result *cr, const char *path, const char *prefix)
{
	FILE	   *f = fopen(path, "r");
	char	   *ring[TAIL_KEEP];
	char	   *helper = NULL;	/* the last line of the helper's */
	int			n = 0,
				noise = 0,
				i;
	bool		helper_shown = false;
	bool		notice = false; /* inside a library's notice of several lines */
	char	   *line = NULL;
	size_t		cap = 0;
	ssize_t		len;

	if (f == NULL)
	{
		case_note(cr, "%s(%s: %s)", prefix, path, strerror(errno));
		return;
	}
	memset(ring, 0, sizeof(ring));
	while ((len = getline(&line, &cap, f)) >= 0)
	{
		while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
			line[--len] = '\0';
		if (log_noise(line, &notice))
		{
			noise++;
			continue;
		}
		if (strstr(line, "idempotency") || strstr(line, "Idempotent") || strstr(line, "signoff"))
		{
			pg_free(helper);
			helper = pg_strdup(line);
		}
		pg_free(ring[n % TAIL_KEEP]);
		ring[n % TAIL_KEEP] = pg_strdup(line);
		n++;
	}
	free(line);
	fclose(f);
	if (n == 0)
		case_note(cr, "%s(%s)", prefix, noise ? "only library warnings" : "empty");
	for (i = n > TAIL_LINES ? n - TAIL_LINES : 0; i < n; i++)
		if (helper && strcmp(ring[i % TAIL_KEEP], helper) == 0)
			helper_shown = true;
	if (helper && !helper_shown)
		case_note(cr, "%s%.240s", prefix, helper);	/* the helper's last word, then the end */
	if (helper && !helper_shown && n > TAIL_LINES)
		case_note(cr, "%s...", prefix);
	for (i = n > TAIL_LINES ? n - TAIL_LINES : 0; i < n; i++)
		case_note(cr, "%s%.240s", prefix, ring[i % TAIL_KEEP]);
	if (noise)
		case_note(cr, "%s(%d line%s of library warnings left out: deprecation notices; the whole log is kept)",
				  prefix, noise, noise == 1 ? "" : "s");
	for (i = 0; i < TAIL_KEEP; i++)
		pg_free(ring[i]);
	pg_free(helper);
}

/* ---------------------------------------------------------------------
 * The socket: exchanges
 * --------------------------------------------------------------------- */

/*
 * One line of the protocol (a JSON object, read by json.c with
 * libpgcommon's parser) into x; false: why. Any valid JSON object is read
 * (whitespace, key order, nested values); a field the runner does not know
 * is ignored, and so is a known one of another type. result may come as a
 * JSON text in a string (the protocol) or as the JSON value itself: then
 * its text, as the line has it.
 */
bool
parse_line(const char *line, exch *x, char *why, size_t wsz)
{
	char		perr[200];
	json_value *obj;
	int			i;

	x->v = 0;
	x->point[0] = x->job_type[0] = x->key[0] = x->verdict[0] = x->sqlstate[0] = '\0';
	x->attempt = 0;
	x->pid = 0;
	x->heartbeat = false;
	x->has_result = false;
	x->result[0] = '\0';
	x->backend_pid = 0;
	x->message[0] = '\0';
	x->ending[0] = x->ended_how[0] = '\0';
	memset(&x->hello, 0, sizeof(x->hello));
	obj = json_parse(line, strlen(line), perr, sizeof(perr));
	if (obj == NULL)
	{
		snprintf(why, wsz, "not JSON: %s", perr);
		return false;
	}
	if (obj->kind != JSON_KIND_OBJECT || obj->nitems == 0)
	{
		json_free(obj);
		snprintf(why, wsz, "not a JSON object");
		return false;
	}
	for (i = 0; i < obj->nitems; i++)
	{
		const json_value *m = obj->items[i];
		const char *name = m->name;
		bool		is_str = m->kind == JSON_KIND_STRING;
		bool		is_null = m->kind == JSON_KIND_NULL;
		bool		nested = m->kind == JSON_KIND_OBJECT || m->kind == JSON_KIND_ARRAY;
		const char *sval = is_str ? m->text : "";
		double		num = m->kind == JSON_KIND_NUMBER ? strtod(m->text, NULL) :
			m->kind == JSON_KIND_TRUE ? 1 : 0;

		if (strcmp(name, "v") == 0 && !is_str && !is_null && !nested)
			x->v = (int) num;
		else if (strcmp(name, "point") == 0 && is_str)
			copy_str(x->point, sizeof(x->point), sval);
		else if (strcmp(name, "job_type") == 0 && is_str)
			copy_str(x->job_type, sizeof(x->job_type), sval);
		else if (strcmp(name, "key") == 0 && is_str)
			copy_str(x->key, sizeof(x->key), sval);
		else if (strcmp(name, "verdict") == 0 && is_str)
			copy_str(x->verdict, sizeof(x->verdict), sval);
		else if (strcmp(name, "sqlstate") == 0 && is_str)
			copy_str(x->sqlstate, sizeof(x->sqlstate), sval);
		else if (strcmp(name, "attempt") == 0 && !is_str && !nested)
			x->attempt = is_null ? 0 : (int) num;
		else if (strcmp(name, "pid") == 0 && !is_str && !is_null && !nested)
			x->pid = (long) num;
		else if (strcmp(name, "heartbeat") == 0 && !is_str && !is_null && !nested)
			x->heartbeat = num != 0;
		else if (strcmp(name, "backend_pid") == 0 && !is_str && !is_null && !nested)
			x->backend_pid = (long) num;
		else if (strcmp(name, "result") == 0 && (is_str || nested))
		{
			x->has_result = true;
			copy_str(x->result, sizeof(x->result), m->text);
		}
		else if (strcmp(name, "message") == 0 && is_str)
			copy_str(x->message, sizeof(x->message), sval);
		else if (strcmp(name, "ending") == 0 && is_str)
			copy_str(x->ending, sizeof(x->ending), sval);
		else if (strcmp(name, "delivery") == 0 && is_str)
			copy_str(x->ended_how, sizeof(x->ended_how), sval);
		else
			hello_field(&x->hello, name, sval, is_str, is_null, num);
	}
	json_free(obj);
	if (x->v != 1)
	{
		snprintf(why, wsz, "protocol version %d, not 1", x->v);
		return false;
	}
	if (strcmp(x->point, "hello") == 0 && x->pid > 0)
		return true;			/* the optional point: no key, no job type */
	if (strcmp(x->point, "claimed") != 0 && strcmp(x->point, "judged") != 0 &&
		strcmp(x->point, "handled") != 0 && strcmp(x->point, "ended") != 0)
	{
		snprintf(why, wsz, "no point claimed, judged, handled, ended or hello (\"%s\")", x->point);
		return false;
	}
	if (x->key[0] == '\0' || x->job_type[0] == '\0' || x->pid <= 0)
	{
		snprintf(why, wsz, "no key, job_type or pid");
		return false;
	}
	return true;
}

static void
exch_free(signoff_state *s, exch *x)
{
	int			i;

	if (x->fd >= 0)
		close(x->fd);
	for (i = 0; i < s->nx; i++)
		if (s->x[i] == x)
		{
			s->x[i] = s->x[--s->nx];
			break;
		}
	pg_free(x);
}

/* the answer line, and the exchange is over */
void
answer(signoff_state *s, exch *x, const char *word)
{
	char		line[32];
	size_t		n = (size_t) snprintf(line, sizeof(line), "%s\n", word);

	if (x->state != X_GONE && x->fd >= 0)
	{
		/* a few bytes on a fresh socket: they fit its buffer */
		if (write(x->fd, line, n) != (ssize_t) n && s->cr)
			case_note(s->cr, "The answer \"%s\" to pid %ld could not be written: %s.",
					  word, x->pid, strerror(errno));
	}
	exch_free(s, x);
}


/* does key contain k as its prefix or suffix, at a boundary ("refund:K", "K/v2")? */
static bool
contains_key(const char *key, const char *k)
{
	size_t		n = strlen(key);
	size_t		m = strlen(k);

	if (n <= m)
		return false;
	if (strncmp(key, k, m) == 0 && !isalnum((unsigned char) key[m]))
		return true;
	return strcmp(key + n - m, k) == 0 && !isalnum((unsigned char) key[n - m - 1]);
}

/*
 * The case's key a claimed key maps to, or -1: the operation key given by
 * the job file (key, key_command) or seen before, else one that contains
 * the run's key as its prefix or suffix (with learn, learned here: the
 * record is read under it from now on; without, nothing is changed).
 */
static int
map_key(signoff_state *s, const char *key, bool learn)
{
	int			i;

	for (i = 0; i < s->nkeys; i++)
		if (strcmp(s->opkey[i], key) == 0)
			return i;
	if (s->job->value[JF_KEY] || s->job->value[JF_KEY_COMMAND])
		return -1;
	for (i = 0; i < s->nkeys; i++)
		if (!s->opkey_known[i] && contains_key(key, s->keys[i]))
		{
			if (!learn)
				return i;
			copy_str(s->opkey[i], KEYSZ, key);
			s->opkey_known[i] = true;
			know_key(s, key);
			if (s->cr)
				case_note(s->cr, "The worker claims %s under the operation key %s, which contains it: the record is read under that key.",
						  s->keys[i], key);
			return i;
		}
	return -1;
}

/*
 * A key of this run (an earlier case's, kept by the queue), not one the
 * worker made up: an operation key the run knew (given, or seen), or one
 * that holds a run key "signoff-<run>-..." at a boundary.
 */
static bool
run_key(signoff_state *s, const char *key)
{
	char		mark[64];
	const char *p;
	int			i;

	if (s->job->reference)
		return true;
	for (i = 0; i < s->nknown; i++)
		if (strcmp(s->known[i], key) == 0)
			return true;
	snprintf(mark, sizeof(mark), "signoff-%s-", s->ctx->run_id);
	for (p = strstr(key, mark); p; p = strstr(p + 1, mark))
		if (p == key || !isalnum((unsigned char) p[-1]))
		{
			const char *end = p + strspn(p, "abcdefghijklmnopqrstuvwxyz0123456789-");

			if (!isalnum((unsigned char) *end))
				return true;
		}
	return false;
}

/* the earlier case of this policy whose key is in key (run key or operation key), or -1 */
static int
late_owner(signoff_state *s, const char *key)
{
	int			c,
				k;

	if (s->pr == NULL)
		return -1;
	for (c = 0; c < s->pr->ncases; c++)
		for (k = 0; k < s->case_nkeys[c]; k++)
			if (s->case_keys[c][k][0] &&
				(strcmp(key, s->case_keys[c][k]) == 0 || strcmp(key, s->case_opkeys[c][k]) == 0 ||
				 contains_key(key, s->case_keys[c][k])))
				return &s->pr->cases[c] == s->cr ? -1 : c;
	return -1;
}

/* remember an operation key of this run, for run_key() */
void
know_key(signoff_state *s, const char *key)
{
	if (s->nknown < MAX_KNOWN)
		copy_str(s->known[s->nknown++], KEYSZ, key);
}

/*
 * A claim under a key the run cannot map: the case fails at once, naming
 * the key seen and the key expected, and every wait of the run ends.
 */
static void
unmappable_key(signoff_state *s, const exch *x)
{
	if (s->cr == NULL || s->nkeys == 0)
		return;					/* between cases (the drain, the cleanup): no case to judge by it */
	s->nunmapped++;
	s->unmappable = true;
	if (s->unmapped[0] == '\0')
	{
		copy_str(s->unmapped, KEYSZ, x->key);
		case_fail(s->cr, "a worker claimed under the key \"%s\" (point %s), which the run cannot map to its key \"%s\": "
				  "the operation key must be the run's key, contain it as a prefix or suffix (refund:{key}), or be "
				  "declared in the job file (key = a template with {key}, key_command = a command that prints it)",
				  x->key, x->point, s->nkeys > 0 ? s->keys[0] : "?");
	}
	else if (s->nunmapped == 2)
	{
		if (strcmp(s->unmapped, x->key) != 0)
			case_fail(s->cr, "the key changes between deliveries of one message (\"%s\", then \"%s\"): it is a "
					  "message id (Sidekiq's jid, SQS's MessageId, Celery's task id), not the operation's key, so "
					  "no redelivery can ever find the first claim", s->unmapped, x->key);
		else
			case_note(s->cr, "The same message sent again was claimed under the same key \"%s\": the key is the "
					  "same for every delivery, but made differently from the run's key.", x->key);
	}
}

/* the case's key that key holds at a boundary (not as itself), or -1 */
static int
case_key_held(signoff_state *s, const char *key)
{
	int			i;

	for (i = 0; i < s->nkeys; i++)
	{
		size_t		m = strlen(s->keys[i]);
		const char *p;

		if (m == 0 || strcmp(key, s->keys[i]) == 0)
			continue;
		for (p = strstr(key, s->keys[i]); p; p = strstr(p + 1, s->keys[i]))
			if ((p == key || !isalnum((unsigned char) p[-1])) && !isalnum((unsigned char) p[m]))
				return i;
	}
	return -1;
}

/*
 * A claim (or judgement) under key, which holds the case's key k but is
 * not its operation key, while the case runs. The first delivery of k
 * under it, where the job file declares the operation key: the declared
 * key is not what the worker claims; where it does not: a key the run
 * cannot map (unmappable_key()). After a delivery of k that the queue
 * delivers again (its operation not completed): the key changed between
 * deliveries of one message. Either fails the case at once, naming both
 * keys and what changed, and every wait of the run ends (the later cases
 * would fail alike); true. A claim after the operation completed is a
 * copy the job scheduled under a key of its own: the diagnosis names it
 * (diagnosis.c); false.
 */
static bool
key_changed(signoff_state *s, const exch *x, int k)
{
	const char *eff = s->job->value[JF_EFFECT_NAME] ? s->job->value[JF_EFFECT_NAME] : "effect";
	char		diff[300];
	char		status[32] = "";
	int			attempt = 0;
	bool		declared = s->job->value[JF_KEY] || s->job->value[JF_KEY_COMMAND];
	bool		seen = count_deliveries(s, k) > 0;

	if (!seen && !declared)
	{
		unmappable_key(s, x);
		return true;
	}
	if (seen && record_row(s, s->opkey[k], status, sizeof(status), &attempt) &&
		strcmp(status, "completed") == 0)
		return false;
	key_diff(s->opkey[k], x->key, diff, sizeof(diff));
	if (seen)
		case_defect(s, "the operation key changes between deliveries of one message of %s: \"%s\", then \"%s\" "
					"(%s), so the redelivery (pid %ld, %s) cannot find the first claim and may make the %s "
					"again: make the key from the operation alone, the same for every delivery of the message",
					s->keys[k], s->opkey[k], x->key, diff, x->pid, x->point, eff);
	else
		case_defect(s, "the worker (pid %ld) claimed the run's key %s under \"%s\", but the job file declares the "
					"operation key \"%s\" (%s): the worker makes its key from something the declaration does not "
					"have; make the key from the operation alone and declare that (key, key_command)",
					x->pid, s->keys[k], x->key, s->opkey[k], diff);
	s->unmappable = true;
	s->key_probed = true;		/* both keys are known: no probe */
	if (s->unmapped[0] == '\0')
		copy_str(s->unmapped, KEYSZ, x->key);
	return true;
}

static bool
pred_probed(signoff_state *s, const void *arg)
{
	(void) arg;
	return s->nunmapped >= 2;
}

/*
 * After the first claim under a key the run cannot map: the same message
 * once more, to tell a key made differently (the same again) from a
 * message id (another one).
 */
static void
probe_key(signoff_state *s)
{
	if (s->key_probed || s->nkeys == 0)
		return;
	s->key_probed = true;
	s->unmappable = false;		/* so that the wait below can run */
	if (enqueue(s, 0, JF_ENQUEUE))
		wait_for(s, pred_probed, NULL, true, s->job->timeout_s);
	s->unmappable = true;
}

static int	worker_of(signoff_state *s, long pid);
static void keep_young_due(signoff_state *s);

static delivery *
new_delivery(signoff_state *s, const exch *x)
{
	delivery   *d;

	if (s->nd == s->dcap)
	{
		s->dcap = s->dcap ? s->dcap * 2 : 64;
		s->d = pg_realloc_array(s->d, delivery, s->dcap);
	}
	d = &s->d[s->nd++];
	memset(d, 0, sizeof(*d));
	copy_str(d->key, sizeof(d->key), x->key);
	copy_str(d->verdict, sizeof(d->verdict), x->verdict);
	copy_str(d->sqlstate, sizeof(d->sqlstate), x->sqlstate);
	d->attempt = x->attempt;
	d->pid = x->pid;
	d->heartbeat = x->heartbeat;
	d->has_result = x->has_result;
	copy_str(d->result, sizeof(d->result), x->result);
	d->eff_before = d->eff_after = -1;
	d->ki = x->ki;
	d->at = now_seconds();
	{
		/* how long a worker takes to start and take a message: the drain's slack */
		int			w = worker_of(s, x->pid);

		if (w >= 0 && procs[w].started > 0 && !procs[w].pointed)
		{
			double		took = d->at - procs[w].started;

			procs[w].pointed = true;
			if (took > s->startup_s && took < s->job->timeout_s)
				s->startup_s = took;
		}
	}
	return d;
}

/*
 * The point ended: the job ended the operation of its delivery (key, pid,
 * attempt) as a permanent failure (PermanentFailure), before its
 * completion; recorded on the delivery, and noted in the case, with how the
 * helper then ends the delivery in its queue library's words.
 */
static void
ended_seen(signoff_state *s, exch *x)
{
	int			ki = map_key(s, x->key, false);
	int			i;

	s->last_delivery = now_seconds();
	for (i = s->nd - 1; i >= 0; i--)
		if (s->d[i].runs && !s->d[i].handled && s->d[i].pid == x->pid &&
			s->d[i].attempt == x->attempt && strcmp(s->d[i].key, x->key) == 0)
			break;
	if (i < 0)
		return;
	snprintf(s->d[i].ended, sizeof(s->d[i].ended), "%s (\"%.200s\"): the operation completed #%d with the "
			 "refusal as its result; the delivery: %s", x->ending[0] ? x->ending : "an ending",
			 x->message, x->attempt, x->ended_how[0] ? x->ended_how : "not said");
	if (ki >= 0 && s->cr && !s->d[i].stray)
		case_note(s->cr, "The job ended %s (pid %ld) with %s.", x->key, x->pid, s->d[i].ended);
}

/* a complete line arrived on x */
static void
arrived(signoff_state *s, exch *x)
{
	char		why[300];
	char	   *nl = memchr(x->buf, '\n', x->len);
	int			ki;
	int			i;
	delivery   *d = NULL;
	bool		claimed,
				judged;

	*nl = '\0';
	if (!parse_line(x->buf, x, why, sizeof(why)))
	{
		if (s->cr)
			case_fail(s->cr, "a worker sent a line that is not the sign-off protocol's (%s): %.200s",
					  why, x->buf);
		exch_free(s, x);		/* no answer: the helper raises */
		return;
	}
	if (strcmp(x->point, "hello") == 0)
	{
		/* who the worker is, and its database (hello.c) */
		hello_record(s, x->pid, &x->hello);
		answer(s, x, "continue");
		return;
	}
	if (strcmp(x->job_type, s->job_type) != 0)
	{
		/*
		 * Another job type of the same worker is not the run's business;
		 * but the case's key under another job type means the worker
		 * claims under a job type the job file does not name, so nothing
		 * it does reaches the run's records: said once, and the run stops
		 * (every case would wait for its timeout alike).
		 */
		if (s->cr && !s->stopped[0] && map_key(s, x->key, false) >= 0)
		{
			snprintf(s->stopped, sizeof(s->stopped),
					 "the worker (pid %ld) %s the case's key %s under the job type \"%s\"%s%s, but the job file "
					 "says job_type = %s (the run gives the worker IDEMPOTENCY_SIGNOFF_JOB_TYPES=%s): set job_type "
					 "to the job type the worker claims under",
					 x->pid, strcmp(x->point, "judged") == 0 ? "was judged on" : "reached its point with",
					 x->key, x->job_type, x->sqlstate[0] ? ", with the claim error " : "", x->sqlstate,
					 s->job->value[JF_JOB_TYPE], s->map);
			case_fail(s->cr, "%s", s->stopped);
			s->stop_said = true;
		}
		answer(s, x, "continue");
		return;
	}
	if (strcmp(x->point, "ended") == 0)
	{
		ended_seen(s, x);
		answer(s, x, "continue");
		return;
	}
	claimed = strcmp(x->point, "claimed") == 0;
	judged = strcmp(x->point, "judged") == 0;
	ki = map_key(s, x->key, true);
	x->ki = ki;
	s->last_delivery = now_seconds();
	x->delivery = -1;
	if (claimed || judged)
	{
		d = new_delivery(s, x);
		d->runs = claimed;
		d->stray = ki < 0;
		x->delivery = (int) (d - s->d);
		/*
		 * verify: the effects now and at handled tell found from not found;
		 * a user's job: every point's count, for the diagnosis (diagnosis.c)
		 */
		if (ki >= 0 && strcmp(s->job->effects_source, "handled reports") != 0 &&
			((claimed && strcmp(x->verdict, "verify") == 0) || !s->job->reference))
		{
			int			n = effects_count(s, s->keys[ki], false);

			d = &s->d[x->delivery];
			d->eff_before = n;
		}
	}
	else
	{
		/* handled: the claimed delivery it ends (key, pid, attempt) */
		for (i = s->nd - 1; i >= 0; i--)
			if (s->d[i].runs && !s->d[i].handled && s->d[i].pid == x->pid &&
				s->d[i].attempt == x->attempt && strcmp(s->d[i].key, x->key) == 0)
				break;
		if (i < 0)
		{
			/* no claimed point seen for it: a handler run all the same */
			d = new_delivery(s, x);
			d->runs = true;
			d->stray = true;
			copy_str(d->mark, sizeof(d->mark), "no claimed point");
			i = (int) (d - s->d);
		}
		s->d[i].handled = true;
		s->d[i].handled_at = now_seconds();
		x->delivery = i;
		if (ki >= 0 && s->d[i].eff_before >= 0)
		{
			int			n = effects_count(s, s->keys[ki], false);

			s->d[x->delivery].eff_after = n;
		}
	}
	if (ki < 0 && !run_key(s, x->key))
	{
		if (claimed || judged)
			unmappable_key(s, x);	/* a delivery; its handled point is no other */
		answer(s, x, "continue");
		return;
	}
	if (ki < 0 && (claimed || judged) && s->cr && s->nkeys > 0 && !s->unmappable &&
		late_owner(s, x->key) < 0)
	{
		int			k = case_key_held(s, x->key);

		if (k >= 0 && key_changed(s, x, k))
		{
			answer(s, x, "continue");
			return;
		}
	}
	if (ki < 0)
	{
		int			owner = late_owner(s, x->key);

		if (owner >= 0 && (claimed || judged))
		{
			/* counted in its own case, which the drain judges again */
			s->late[owner]++;
			case_note(&s->pr->cases[owner], "A late delivery of %s reached %s (%s%s%s) after this case had ended%s%s.",
					  x->key, x->point, x->verdict[0] ? x->verdict : "-", x->sqlstate[0] ? " " : "", x->sqlstate,
					  s->case_id ? ", during case " : "", s->case_id ? s->case_id : "");
		}
		/* the points of a claim the case failed for its key (key_changed()) say nothing more */
		if (s->cr && !(s->unmappable && strcmp(x->key, s->unmapped) == 0))
			case_note(s->cr, "A delivery of %s, not a key of this case (%s), reached %s (%s%s%s): answered continue.",
					  x->key, owner >= 0 ? "a late delivery of an earlier case's key, noted there" :
					  "a message the queue kept from an earlier case",
					  x->point, x->verdict[0] ? x->verdict : "-",
					  x->sqlstate[0] ? " " : "", x->sqlstate);
		answer(s, x, "continue");
		return;
	}
	if (judged)
		claim_error_seen(s, x);	/* an error fails the case at once (hello.c) */
	for (i = 0; i < (int) (sizeof(s->arms) / sizeof(s->arms[0])); i++)
		if (s->arms[i].on && s->arms[i].key == ki && strcmp(s->arms[i].point, x->point) == 0)
		{
			s->arms[i].on = false;
			x->state = X_HELD;
			return;
		}
	answer(s, x, "continue");
}

/*
 * The case fails for a defect of the job that its steps saw and can name:
 * the sentence becomes the case's "Diagnosis: ..." (diagnosis.c), its first
 * note, instead of a FAILED note. The first one counts; a second, and the
 * reference run's (not diagnosed), are FAILED notes.
 */
void
case_defect(signoff_state *s, const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	if (s->job->reference || s->cr->defect[0])
		case_vfail(s->cr, fmt, ap);
	else
	{
		vsnprintf(s->cr->defect, sizeof(s->cr->defect), fmt, ap);
		s->cr->checks_ok = false;
	}
	va_end(ap);
}

/*
 * Seconds left of the lease of the case's key ki, by the database's clock
 * (the record's heartbeat_at and its job type's lease against
 * clock_timestamp()); negative: it has run out. NAN: no record, or the
 * query failed. status and attempt (NULL: not wanted): the record's.
 */
static double
record_lease_left(signoff_state *s, int ki, char *status, size_t ssz, int *attempt)
{
	const char *params[2];
	PGresult   *res;
	double		left = NAN;

	params[0] = s->job_type;
	params[1] = s->opkey[ki];
	res = db_exec(s->ctx,
				  "SELECT pg_catalog.date_part('epoch', (o.heartbeat_at OPERATOR(pg_catalog.+) jt.lease) "
				  "       OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp()), o.status::text, o.attempt "
				  "FROM idempotency.operations o "
				  "JOIN idempotency.job_types jt ON jt.job_type OPERATOR(pg_catalog.=) o.job_type "
				  "WHERE o.job_type OPERATOR(pg_catalog.=) $1 "
				  "  AND o.operation_key OPERATOR(pg_catalog.=) $2",
				  2, params);
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
	{
		left = atof(PQgetvalue(res, 0, 0));
		if (status)
			copy_str(status, ssz, PQgetvalue(res, 0, 1));
		if (attempt)
			*attempt = atoi(PQgetvalue(res, 0, 2));
	}
	PQclear(res);
	return left;
}

double
lease_left(signoff_state *s, int ki)
{
	return record_lease_left(s, ki, NULL, 0, NULL);
}

/*
 * 7a, 7b: the runner keeps the dead worker's claim (key ki, attempt) young
 * from now on, as the worker's heartbeat would have: extend_lease() every
 * fifth of the lease, while the socket is served (pump()), until
 * keep_young_stop(). So the message sent again comes inside the lease
 * however long the enqueue, the queue and the worker take. It stops by
 * itself (young_ended says why) when an extension finds the lease run out
 * by the database's clock (the runner was descheduled longer than the
 * lease: it never makes a stale claim young again) or the claim taken
 * further (a verdict after the lease, a completion, a release).
 */
void
keep_young(signoff_state *s, int ki, int attempt)
{
	s->young_on = true;
	s->young_ki = ki;
	s->young_attempt = attempt;
	s->young_at = 0;
	s->young_extended = 0;
	s->young_ended[0] = '\0';
	keep_young_due(s);
}

void
keep_young_stop(signoff_state *s)
{
	s->young_on = false;
}

static void
keep_young_due(signoff_state *s)
{
	char		attempt[16];
	char		status[32] = "";
	int			now_attempt = 0;
	const char *params[3];
	PGresult   *res;
	double		left;

	if (now_seconds() - s->young_at < s->ctx->lease_s / 5)
		return;
	left = record_lease_left(s, s->young_ki, status, sizeof(status), &now_attempt);
	if (isnan(left))
	{
		s->young_on = false;
		snprintf(s->young_ended, sizeof(s->young_ended), "the record of %s could not be read",
				 s->keys[s->young_ki]);
		return;
	}
	if (strcmp(status, "claimed") != 0 || now_attempt != s->young_attempt)
	{
		s->young_on = false;
		snprintf(s->young_ended, sizeof(s->young_ended), "the record had become %s #%d", status, now_attempt);
		return;
	}
	if (left <= 0)
	{
		s->young_on = false;
		snprintf(s->young_ended, sizeof(s->young_ended),
				 "the runner got to it only %.1f s after the lease had run out by the database's clock", -left);
		return;
	}
	snprintf(attempt, sizeof(attempt), "%d", s->young_attempt);
	params[0] = s->job_type;
	params[1] = s->opkey[s->young_ki];
	params[2] = attempt;
	res = db_exec(s->ctx, "SELECT idempotency.extend_lease($1, $2, $3::integer)", 3, params);
	if (PQresultStatus(res) == PGRES_TUPLES_OK)
	{
		s->young_at = now_seconds();
		s->young_extended++;
	}
	else
	{
		const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
		const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);

		s->young_on = false;
		snprintf(s->young_ended, sizeof(s->young_ended), "extend_lease() refused it (%s: %s)",
				 state ? state : "no SQLSTATE", msg ? one_line(msg) : one_line(PQresultErrorMessage(res)));
	}
	PQclear(res);
}

/*
 * Take in what the socket has within ms milliseconds: new connections,
 * lines, closed connections; and reap the groups that ended.
 */
void
pump(signoff_state *s, int ms)
{
	struct pollfd pfd[MAX_EXCH + 1];
	exch	   *who[MAX_EXCH + 1];
	int			n = 0;
	int			i;
	int			r;

	pfd[n].fd = s->lfd;
	pfd[n].events = POLLIN;
	pfd[n].revents = 0;
	who[n++] = NULL;
	for (i = 0; i < s->nx; i++)
		if (s->x[i]->state != X_GONE)
		{
			pfd[n].fd = s->x[i]->fd;
			pfd[n].events = POLLIN;
			pfd[n].revents = 0;
			who[n++] = s->x[i];
		}
	if (s->young_on)
		keep_young_due(s);
	r = poll(pfd, (nfds_t) n, ms);
	if (r > 0)
	{
		for (i = 1; i < n; i++)
		{
			exch	   *x = who[i];
			ssize_t		got;

			if (pfd[i].revents == 0)
				continue;
			if (x->state == X_HELD)
			{
				char		c;

				/* a held worker sends nothing more: this is its end */
				got = read(x->fd, &c, 1);
				if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR))
				{
					x->state = X_GONE;
					close(x->fd);
					x->fd = -1;
				}
				continue;
			}
			got = read(x->fd, x->buf + x->len, sizeof(x->buf) - 1 - x->len);
			if (got < 0 && (errno == EAGAIN || errno == EINTR))
				continue;
			if (got <= 0)
			{
				/* closed before a whole line: nothing to answer */
				exch_free(s, x);
				continue;
			}
			x->len += (size_t) got;
			x->buf[x->len] = '\0';
			if (memchr(x->buf, '\n', x->len))
				arrived(s, x);
			else if (x->len >= sizeof(x->buf) - 1)
			{
				if (s->cr)
					case_fail(s->cr, "a worker sent a line longer than %zu bytes", sizeof(x->buf) - 1);
				exch_free(s, x);
			}
		}
		if (pfd[0].revents & POLLIN)
		{
			for (;;)
			{
				int			fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
				exch	   *x;

				if (fd < 0)
					break;
				if (s->nx >= MAX_EXCH)
				{
					close(fd);
					if (s->cr)
						case_fail(s->cr, "more than %d exchanges open at once", MAX_EXCH);
					continue;
				}
				x = pg_malloc0_object(exch);
				x->fd = fd;
				x->state = X_READING;
				x->delivery = -1;
				s->x[s->nx++] = x;
			}
		}
	}
	reap();
}

/* ---------------------------------------------------------------------
 * The environment of the run's processes
 * --------------------------------------------------------------------- */

/* the protocol's 10, and libpq's variables of what --dsn names (about 40 settings) */
#define N_ENV 64

typedef struct run_env
{
	char		var[N_ENV][1200];
	char	   *env[N_ENV + 1];
} run_env;

/*
 * What every worker and command gets: the run's id, the job-type map, the
 * lease, the case, the run's database (--dsn; else the worker uses its own
 * configuration or libpq's environment); a worker also the socket. With
 * --dsn, also libpq's variable of each setting it names (PGHOST, PGPORT,
 * PGDATABASE, PGUSER, PGPASSWORD, PGSSLMODE, ...: PQconninfoParse's
 * envvar), so that whatever connects with libpq's defaults in the worker
 * or a command (a helper given no connection, the app's own code, a pool
 * made from the environment, psql in effects) reaches the run's database,
 * as the runner does; a setting --dsn does not name stays as the
 * environment has it (the runner's own connection took it from there too).
 */
static void
make_env(signoff_state *s, bool worker, run_env *e)
{
	int			n = 0;
	int			i;

	if (s->ctx->dsn)
	{
		char	   *err = NULL;
		PQconninfoOption *opts = PQconninfoParse(s->ctx->dsn, &err);
		PQconninfoOption *o;

		/* the runner connected with it: it parses (else nothing to add) */
		for (o = opts; o && o->keyword && n < N_ENV - 10; o++)
			if (o->val && o->envvar && strlen(o->envvar) + strlen(o->val) + 2 <= sizeof(e->var[0]))
				snprintf(e->var[n++], sizeof(e->var[0]), "%s=%s", o->envvar, o->val);
		PQconninfoFree(opts);
		PQfreemem(err);
	}

	snprintf(e->var[n++], sizeof(e->var[0]), "IDEMPOTENCY_SIGNOFF_RUN=%s", s->ctx->run_id);
	snprintf(e->var[n++], sizeof(e->var[0]), "IDEMPOTENCY_SIGNOFF_JOB_TYPES=%s", s->map);
	snprintf(e->var[n++], sizeof(e->var[0]), "IDEMPOTENCY_SIGNOFF_LEASE=%g", s->job->lease_s);
	snprintf(e->var[n++], sizeof(e->var[0]), "IDEMPOTENCY_SIGNOFF_CASE=%s", s->case_id ? s->case_id : "");
	if (s->ctx->dsn)
		snprintf(e->var[n++], sizeof(e->var[0]), "IDEMPOTENCY_SIGNOFF_DSN=%s", s->ctx->dsn);
	if (s->job->effect == EFFECT_HTTP)
		snprintf(e->var[n++], sizeof(e->var[0]), "IDEMPOTENCY_SIGNOFF_HTTP=%s", s->effect_addr);
	else if (s->job->effect == EFFECT_SMTP)
		snprintf(e->var[n++], sizeof(e->var[0]), "IDEMPOTENCY_SIGNOFF_SMTP=%s", s->effect_addr);
	if (worker)
	{
		snprintf(e->var[n++], sizeof(e->var[0]), "IDEMPOTENCY_SIGNOFF=%s", s->sock);
		/* this runner answers the points hello and ended (an older one refused them) */
		snprintf(e->var[n++], sizeof(e->var[0]), "IDEMPOTENCY_SIGNOFF_HELLO=1");
		snprintf(e->var[n++], sizeof(e->var[0]), "IDEMPOTENCY_SIGNOFF_ENDED=1");
	}
	for (i = 0; i < n; i++)
		e->env[i] = e->var[i];
	e->env[n] = NULL;
}

/* ---------------------------------------------------------------------
 * Commands: enqueue, enqueue_other, effects
 * --------------------------------------------------------------------- */

/* a file's content (at most a few kB of its end), for messages */
static void
read_file(const char *path, StringInfo b, size_t max)
{
	FILE	   *f = fopen(path, "r");
	char		buf[4096];
	size_t		n;
	long		size;

	if (f == NULL)
		return;
	if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) > (long) max)
		fseek(f, size - (long) max, SEEK_SET);
	else
		fseek(f, 0, SEEK_SET);
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		appendBinaryStringInfo(b, buf, n);
	fclose(f);
}

/*
 * Run a command of the job file for the key and wait for it, bounded by
 * the timeout; meanwhile the socket is served (pump_meanwhile: not when
 * called from inside the socket's own handling). 0: it exited 0, and out
 * (if not NULL) has its standard output. Otherwise the case fails naming
 * the command, its exit status and the end of its standard error, and the
 * result is non-zero.
 */
int
run_command(signoff_state *s, job_field which, const char *key, bool pump_meanwhile,
			StringInfo out)
{
	StringInfoData cmd;
	char		why[256];
	run_env		env;
	pid_t		pid;
	int			idx;
	int			status;
	double		t0;
	bool		timed_out = false;
	char		out_path[320];
	char		err_path[320];

	/*
	 * While a command runs, the socket is served (pump_meanwhile), and a
	 * point that arrives meanwhile may run the effects command itself
	 * (arrived()): each level its own files, or the inner command's output
	 * would be read as the outer one's (with workers that outlive their
	 * case, points arrive while a case counts its effects).
	 */
	snprintf(out_path, sizeof(out_path), "%s.%d", s->cmd_out, s->command_depth);
	snprintf(err_path, sizeof(err_path), "%s.%d", s->cmd_err, s->command_depth);
	initStringInfo(&cmd);
	expand(&cmd, s->job->value[which], key);
	make_env(s, false, &env);
	pid = spawn(s, cmd.data, out_path, err_path, false, env.env, why, sizeof(why));
	idx = pid < 0 ? -1 : track_proc(pid, job_field_names[which], err_path);
	if (idx < 0)
	{
		if (pid > 0)
			kill(-pid, SIGKILL);
		case_fail(s->cr, "the %s command `%s` could not start: %s", job_field_names[which],
				  cmd.data, pid < 0 ? why : "too many processes");
		pfree(cmd.data);
		return -1;
	}
	t0 = now_seconds();
	for (;;)
	{
		reap();
		if (procs[idx].reaped)
			break;
		if (matrix_interrupted)
		{
			kill_group(&procs[idx]);
			forget_proc(idx);
			pfree(cmd.data);
			case_fail(s->cr, "interrupted");
			return -1;
		}
		if (now_seconds() - t0 > s->job->timeout_s)
		{
			timed_out = true;
			break;
		}
		if (pump_meanwhile)
		{
			s->command_depth++;
			pump(s, 1);
			s->command_depth--;
		}
		else
			poll(NULL, 0, 1);
	}
	/* the command is over; so is whatever it left running in its group */
	kill_group(&procs[idx]);
	status = timed_out ? -1 : procs[idx].status;
	forget_proc(idx);
	if (status != 0)
	{
		StringInfoData err;
		const char *p;

		if (timed_out)
			case_fail(s->cr, "the %s command `%s` did not end within %g s (timeout): killed",
					  job_field_names[which], cmd.data, s->job->timeout_s);
		else
			case_fail(s->cr, "the %s command `%s` exited with status %d", job_field_names[which],
					  cmd.data, status);
		initStringInfo(&err);
		read_file(err_path, &err, 2000);
		if (err.len == 0)
			case_note(s->cr, "  (its standard error was empty)");
		else
		{
			int			lines = 0;
			const char *start;

			/* the last TAIL_LINES lines */
			p = err.data + err.len;
			while (p > err.data && (p[-1] == '\n'))
				p--;
			start = p;
			while (start > err.data && lines < TAIL_LINES)
			{
				start--;
				if (*start == '\n')
					lines++;
			}
			if (*start == '\n')
				start++;
			case_note(s->cr, "  the end of its standard error:");
			while (start < p)
			{
				size_t		len = strcspn(start, "\n");

				case_note(s->cr, "  | %.*s", (int) (len > 240 ? 240 : len), start);
				start += len;
				if (*start == '\n')
					start++;
			}
		}
		pfree(err.data);
	}
	else if (out)
		read_file(out_path, out, 4096);
	pfree(cmd.data);
	return status;
}

/*
 * The effects of the key: the effects command's number, effects_sql's, or
 * the handler runs that returned (handled reports). -1: could not be
 * counted (the case fails, noted).
 */
int
effects_count(signoff_state *s, const char *key, bool pump_meanwhile)
{
	if (s->job->effect != EFFECT_NONE)
	{
		effect_stats st;

		if (!effect_stats_of(key, &st))
		{
			case_fail(s->cr, "the run's %s endpoint did not answer: the effects of %s cannot be counted",
					  effect_kind_names[s->job->effect], key);
			return -1;
		}
		return st.effects;
	}
	if (s->job->value[JF_EFFECTS])
	{
		StringInfoData out;
		char	   *p;
		char	   *end;
		long		n;

		initStringInfo(&out);
		if (run_command(s, JF_EFFECTS, key, pump_meanwhile, &out) != 0)
		{
			pfree(out.data);
			return -1;
		}
		p = trim(out.data ? out.data : (char *) "");
		n = strtol(p, &end, 10);
		if (end == p || *end != '\0' || n < 0 || n > INT_MAX)
		{
			case_fail(s->cr, "the effects command for %s printed \"%.80s\", not a number of effects", key, p);
			pfree(out.data);
			return -1;
		}
		pfree(out.data);
		return (int) n;
	}
	if (s->job->value[JF_EFFECTS_SQL])
	{
		const char *params[1];
		PGresult   *res;
		int			n = -1;

		params[0] = key;
		res = db_exec(s->ctx, s->job->value[JF_EFFECTS_SQL], 1, params);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
			case_fail(s->cr, "effects_sql for %s failed: %s", key, case_sql_error(res, s->ctx));
		else if (PQntuples(res) != 1 || PQnfields(res) != 1 || PQgetisnull(res, 0, 0) ||
				 strspn(PQgetvalue(res, 0, 0), "0123456789") != strlen(PQgetvalue(res, 0, 0)) ||
				 PQgetvalue(res, 0, 0)[0] == '\0')
			case_fail(s->cr, "effects_sql for %s did not answer one number (%d rows, %d columns)",
					  key, PQntuples(res), PQnfields(res));
		else
			n = atoi(PQgetvalue(res, 0, 0));
		PQclear(res);
		return n;
	}
	{
		const char *op = key;	/* the operation key the worker claims it under */
		int			i,
					k,
					n = 0;

		for (k = 0; k < s->nkeys; k++)
			if (strcmp(s->keys[k], key) == 0)
				op = s->opkey[k];
		for (i = 0; i < s->nd; i++)
			if (s->d[i].runs && s->d[i].handled &&
				(strcmp(s->d[i].key, key) == 0 || strcmp(s->d[i].key, op) == 0 || contains_key(s->d[i].key, key)))
				n++;
		return n;
	}
}

/* ---------------------------------------------------------------------
 * Workers
 * --------------------------------------------------------------------- */

/*
 * SIGTERM to each of the groups (a worker finishes the message in hand and
 * exits), the socket served meanwhile, SIGKILL after the timeout.
 */
static void
stop_groups(signoff_state *s, const int *idx, int n)
{
	int			i;
	double		t0 = now_seconds();

	for (i = 0; i < n; i++)
		if (!procs[idx[i]].gone)
			kill(-procs[idx[i]].pid, SIGTERM);
	for (;;)
	{
		bool		alive = false;

		for (i = 0; i < n; i++)
			alive |= !procs[idx[i]].gone;
		if (!alive || matrix_interrupted || now_seconds() - t0 > s->job->timeout_s)
			break;
		pump(s, POLL_MS);
	}
	for (i = 0; i < n; i++)
	{
		sproc	   *p = &procs[idx[i]];

		if (p->gone)
			continue;
		if (!matrix_interrupted && s->cr)
			case_note(s->cr, "%s (pid %d) did not end within %g s of SIGTERM: killed with SIGKILL.",
					  p->name, (int) p->pid, s->job->timeout_s);
		kill_group(p);
	}
}

/*
 * The case's first start_workers takes the workers the cases before left
 * running, as many as it asks for, and stops the others: a case has the
 * number of workers it asks for.
 */
static void
take_kept_workers(signoff_state *s, int n)
{
	int			i;

	s->took_kept = true;
	for (i = 0; i < s->nkept; i++)
		if (!procs[s->kept[i]].gone && n > 0 && s->nworkers < MAX_CASE_WORKERS)
		{
			s->workers[s->nworkers++] = s->kept[i];
			n--;
			s->kept[i] = -1;
		}
	{
		int			rest[MAX_CASE_WORKERS] = {0};
		int			nrest = 0;

		for (i = 0; i < s->nkept; i++)
			if (s->kept[i] >= 0)
				rest[nrest++] = s->kept[i];
		stop_groups(s, rest, nrest);
		for (i = 0; i < nrest; i++)
			forget_proc(rest[i]);
	}
	s->nkept = 0;
}

/* the policy's kept workers stop (its end, or before the drain's) */
void
stop_kept_workers(signoff_state *s)
{
	int			i;

	stop_groups(s, s->kept, s->nkept);
	for (i = 0; i < s->nkept; i++)
		forget_proc(s->kept[i]);
	s->nkept = 0;
}

/*
 * n workers that take messages alike: all kept ones, or all new. A case
 * whose message must reach the second worker within a lease (7a, 7b)
 * cannot have one worker ready and the other still starting (a Node.js
 * worker under load: seconds).
 */
bool
start_workers_alike(signoff_state *s, int n)
{
	int			i,
				live = 0;

	if (s->keep_workers && !s->took_kept)
	{
		for (i = 0; i < s->nkept; i++)
			live += !procs[s->kept[i]].gone;
		if (live < n)
		{
			stop_kept_workers(s);
			s->took_kept = true;
		}
	}
	return start_workers(s, n);
}

bool
start_workers(signoff_state *s, int n)
{
	int			i;
	int			have = s->nworkers;

	if (s->keep_workers && !s->took_kept)
		take_kept_workers(s, n);
	for (i = s->nworkers - have; i < n; i++)
	{
		char		name[16];
		char		log[600];
		char		why[256];
		static run_env env;
		pid_t		pid;
		int			idx;

		if (s->nworkers >= MAX_CASE_WORKERS)
			return false;
		snprintf(name, sizeof(name), "w%d", ++s->worker_seq);
		snprintf(log, sizeof(log), "%s/%s-%s-%s.log", s->ctx->signoff_dir,
				 policy_names[s->policy], s->case_id, name);
		make_env(s, true, &env);
		pid = spawn(s, s->job->value[JF_WORKER], log, NULL, true, env.env, why, sizeof(why));
		idx = pid < 0 ? -1 : track_proc(pid, name, log);
		if (idx < 0)
		{
			if (pid > 0)
				kill(-pid, SIGKILL);
			case_fail(s->cr, "the worker command could not start: %s", pid < 0 ? why : "too many processes");
			return false;
		}
		procs[idx].started = now_seconds();
		s->ctx->worker_processes++;
		s->workers[s->nworkers++] = idx;
	}
	return true;
}

/* the case's worker whose process group holds pid, or -1 */
static int
worker_of(signoff_state *s, long pid)
{
	pid_t		g = getpgid((pid_t) pid);
	int			i;

	if (g < 0)
		return -1;
	for (i = 0; i < s->nworkers; i++)
		if (procs[s->workers[i]].pid == g && !procs[s->workers[i]].gone)
			return s->workers[i];
	return -1;
}

static bool
any_worker_alive(signoff_state *s)
{
	int			i;

	for (i = 0; i < s->nworkers; i++)
		if (!procs[s->workers[i]].gone)
			return true;
	return false;
}

/* the worker at x's point dies: SIGKILL to its group, and no answer */
bool
kill_at(signoff_state *s, exch *x, const char *where)
{
	int			w = worker_of(s, x->pid);
	delivery   *d = x->delivery >= 0 ? &s->d[x->delivery] : NULL;

	if (w < 0)
	{
		case_fail(s->cr, "pid %ld, which reached %s, is in no process group this case started: not killed",
				  x->pid, x->point);
		answer(s, x, "continue");
		return false;
	}
	kill_group(&procs[w]);
	if (d)
		d->killed = true;
	case_note(s->cr, "%s (pid %ld) reached %s (%s, attempt %d) and was killed %s: SIGKILL to its process group %d.",
			  procs[w].name, x->pid, x->point, x->verdict, x->attempt, where, (int) procs[w].pid);
	exch_free(s, x);
	return true;
}

/* what a case leaves when its workers stop or stay: no arm, no held point */
static void
release_points(signoff_state *s)
{
	int			i;

	for (i = 0; i < (int) (sizeof(s->arms) / sizeof(s->arms[0])); i++)
		s->arms[i].on = false;
	for (i = s->nx - 1; i >= 0; i--)
		if (s->x[i]->state == X_HELD || s->x[i]->state == X_GONE)
			answer(s, s->x[i], "continue");
}

/*
 * The case's workers stop now: SIGTERM to each group (a worker finishes
 * the message in hand and exits), the socket served meanwhile (every point
 * is answered continue), SIGKILL after the timeout.
 */
void
stop_workers_now(signoff_state *s)
{
	release_points(s);
	stop_groups(s, s->workers, s->nworkers);
	/* exchanges that came in at the very end */
	pump(s, 0);
}

/*
 * The end of a case's part for its workers: with keep_workers the live
 * ones stay for the next case (the socket keeps being served; a point
 * they reach meanwhile is a late delivery, noted in its own case), else
 * they stop now. Either way no arm and no held point outlives the case.
 */
void
stop_workers(signoff_state *s)
{
	int			i,
				n = 0;

	if (!s->keep_workers)
	{
		stop_workers_now(s);
		return;
	}
	release_points(s);
	pump(s, 0);
	for (i = 0; i < s->nworkers; i++)
	{
		if (!procs[s->workers[i]].gone && s->nkept < MAX_CASE_WORKERS)
			s->kept[s->nkept++] = s->workers[i];
		else
			s->workers[n++] = s->workers[i];	/* gone: the caller forgets it */
	}
	s->nworkers = n;
}

/* ---------------------------------------------------------------------
 * Waiting
 * --------------------------------------------------------------------- */



/*
 * Serve the socket until pred holds; bounded by the timeout, and (with
 * need_worker) by the case's workers: when all of them ended, nothing can
 * make pred true.
 */
wres
wait_for(signoff_state *s, wait_pred pred, const void *arg, bool need_worker, double limit)
{
	double		t0 = now_seconds();

	for (;;)
	{
		if (pred(s, arg))
			return WAIT_OK;
		if (matrix_interrupted)
			return WAIT_INTERRUPTED;
		if (s->unmappable)
			return WAIT_UNMAPPED;
		if (run_stopped(s))
			return WAIT_STOPPED;
		if (need_worker && !any_worker_alive(s))
		{
			pump(s, 0);
			return pred(s, arg) ? WAIT_OK : WAIT_NO_WORKER;
		}
		if (now_seconds() - t0 > limit)
			return WAIT_TIMEOUT;
		pump(s, POLL_MS);
	}
}


static int	case_points(signoff_state *s);

/* a wait that failed: why, with the end of each worker's log */
static void
wait_failed(signoff_state *s, wres r, const char *what)
{
	int			i;
	int			points = case_points(s);

	if (r == WAIT_INTERRUPTED)
	{
		case_fail(s->cr, "interrupted");
		return;
	}
	if (r == WAIT_UNMAPPED)
	{
		probe_key(s);			/* the case failed naming the key already */
		return;
	}
	if (r == WAIT_STOPPED)
		return;					/* the case failed saying why already */
	if (r == WAIT_NO_WORKER)
		case_fail(s->cr, "no worker reached %s: every worker of the case ended", what);
	else if (points == 0)
		case_fail(s->cr, "no worker reached %s within %g s: the helper is not installed or not armed in that worker "
				  "(no point at all reached the runner's socket)", what, s->job->timeout_s);
	else
		case_fail(s->cr, "no worker reached %s within %g s", what, s->job->timeout_s);
	for (i = 0; i < s->nworkers; i++)
	{
		sproc	   *p = &procs[s->workers[i]];
		char		state[64];
		char		prefix[16];

		if (p->killed)
			snprintf(state, sizeof(state), "killed by the run");
		else if (p->reaped)
			snprintf(state, sizeof(state), "exited with status %d", p->status);
		else
			snprintf(state, sizeof(state), "running");
		case_note(s->cr, "%s (pid %d, %s): the end of its log %s:", p->name, (int) p->pid, state, p->log);
		snprintf(prefix, sizeof(prefix), "  | ");
		note_tail(s->cr, p->log, prefix);
	}
	if (points == 0 && r != WAIT_INTERRUPTED)
		s->not_armed = true;
}

/* deliveries (claimed or judged points) of the case, all keys or key ki */
int			case_first_delivery;

static int
case_points(signoff_state *s)
{
	int			i,
				n = 0;

	for (i = case_first_delivery; i < s->nd; i++)
		n++;
	return n;
}

int
count_deliveries(signoff_state *s, int ki)
{
	int			i,
				n = 0;

	for (i = case_first_delivery; i < s->nd; i++)
		if (!s->d[i].stray && s->d[i].ki == ki)
			n++;
	return n;
}

/* the n-th (1-based) delivery of key ki in this case (its index), or -1 */
int
nth_delivery(signoff_state *s, int ki, int n)
{
	int			i;

	for (i = case_first_delivery; i < s->nd; i++)
		if (!s->d[i].stray && s->d[i].ki == ki && --n == 0)
			return i;
	return -1;
}

typedef struct nth_arg
{
	int			ki;
	int			n;
} nth_arg;

static bool
pred_nth(signoff_state *s, const void *arg)
{
	const nth_arg *a = arg;

	return count_deliveries(s, a->ki) >= a->n;
}

/* wait for the n-th delivery of key ki: its index; -1: failed (noted) */
int
wait_nth(signoff_state *s, int ki, int n)
{
	nth_arg		a = {ki, n};
	wres		r = wait_for(s, pred_nth, &a, true, s->job->timeout_s);
	char		what[300];

	if (r == WAIT_OK)
		return nth_delivery(s, ki, n);
	snprintf(what, sizeof(what), "a claimed or judged point for delivery %d of %s", n, s->keys[ki]);
	wait_failed(s, r, what);
	return -1;
}

typedef struct held_arg
{
	int			ki;
	const char *point;
} held_arg;

static exch *
find_held(signoff_state *s, int ki, const char *point)
{
	int			i;

	for (i = 0; i < s->nx; i++)
		if (s->x[i]->state != X_READING && strcmp(s->x[i]->point, point) == 0 &&
			s->x[i]->ki == ki)
			return s->x[i];
	return NULL;
}

static bool
pred_held(signoff_state *s, const void *arg)
{
	const held_arg *a = arg;

	return find_held(s, a->ki, a->point) != NULL;
}

void
arm_point(signoff_state *s, int ki, const char *point)
{
	int			i;

	for (i = 0; i < (int) (sizeof(s->arms) / sizeof(s->arms[0])); i++)
		if (!s->arms[i].on)
		{
			s->arms[i].on = true;
			s->arms[i].key = ki;
			copy_str(s->arms[i].point, sizeof(s->arms[i].point), point);
			return;
		}
}

/* wait until a worker stands at the armed point of key ki; NULL: failed */
exch *
wait_held(signoff_state *s, int ki, const char *point)
{
	held_arg	a = {ki, point};
	wres		r = wait_for(s, pred_held, &a, true, s->job->timeout_s);
	char		what[300];
	exch	   *x;

	if (r == WAIT_OK)
	{
		x = find_held(s, ki, point);
		if (x->state == X_GONE)
		{
			case_fail(s->cr, "the worker at %s of %s (pid %ld) closed the exchange without an answer",
					  point, s->keys[ki], x->pid);
			exch_free(s, x);
			return NULL;
		}
		return x;
	}
	snprintf(what, sizeof(what), "the point %s of %s", point, s->keys[ki]);
	wait_failed(s, r, what);
	return NULL;
}

/* status and attempt of the record; false: none (or an error, noted) */
bool
record_row(signoff_state *s, const char *key, char *status, size_t ssz, int *attempt)
{
	PGresult   *res = record_query(s->ctx, s->job_type, key);
	bool		found = false;

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		case_fail(s->cr, "cannot read the record of %s: %s", key, case_sql_error(res, s->ctx));
	else if (PQntuples(res) == 1)
	{
		copy_str(status, ssz, PQgetvalue(res, 0, 0));
		*attempt = atoi(PQgetvalue(res, 0, 1));
		found = true;
	}
	PQclear(res);
	return found;
}

/* the delivery's run is over: its completion (or release) reached the record */
static bool
pred_settled(signoff_state *s, const void *arg)
{
	const delivery *d = &s->d[*(const int *) arg];
	char		status[32];
	int			attempt = 0;

	if (!record_row(s, d->key, status, sizeof(status), &attempt))
		return true;			/* nothing to wait for */
	return strcmp(status, "claimed") != 0 || attempt != d->attempt;
}

static bool
pred_handled(signoff_state *s, const void *arg)
{
	const delivery *d = &s->d[*(const int *) arg];
	int			w;

	if (d->handled || d->killed || d->failed)
		return true;
	w = worker_of(s, d->pid);
	return w < 0;				/* its worker is gone */
}

static bool
held_delivery(signoff_state *s, const delivery *d)
{
	int			i;

	for (i = 0; i < s->nx; i++)
		if (s->x[i]->state != X_READING && s->x[i]->delivery == (int) (d - s->d))
			return true;
	return false;
}

/*
 * Every message enqueued so far has been delivered (a claimed or judged
 * point of its key), and every run that is not held, killed or failed has
 * returned (handled) and completed (the record moved on). False: a wait
 * failed (noted).
 */
bool
settle(signoff_state *s)
{
	int			ki;
	int			i;

	for (ki = 0; ki < s->nkeys; ki++)
		if (s->enqueued[ki] > 0 && wait_nth(s, ki, s->enqueued[ki]) < 0)
			return false;
	for (i = case_first_delivery; i < s->nd; i++)
	{
		delivery   *d = &s->d[i];
		wres		r;
		char		what[300];

		if (d->stray || !d->runs || d->killed || d->failed || held_delivery(s, d))
			continue;
		/* by index: s->d grows (moves) while the socket is served */
		r = wait_for(s, pred_handled, &i, true, s->job->timeout_s);
		d = &s->d[i];
		if (r != WAIT_OK || !d->handled)
		{
			if (r == WAIT_OK)
				case_fail(s->cr, "the worker (pid %ld) of %s's attempt %d ended before the handled point",
						  d->pid, d->key, d->attempt);
			else
			{
				snprintf(what, sizeof(what), "the point handled of %s (attempt %d, pid %ld): the handler did not return",
						 d->key, d->attempt, d->pid);
				wait_failed(s, r, what);
			}
			return false;
		}
		r = wait_for(s, pred_settled, &i, true, s->job->timeout_s);
		d = &s->d[i];
		if (r != WAIT_OK)
		{
			if (r == WAIT_INTERRUPTED)
				case_fail(s->cr, "interrupted");
			else
				case_fail(s->cr, "%s's attempt %d returned (handled), but its record was still claimed %s",
						  d->key, d->attempt,
						  r == WAIT_TIMEOUT ? "after the timeout" : "when its workers had ended");
			return false;
		}
	}
	return true;
}

bool
enqueue(signoff_state *s, int ki, job_field which)
{
	if (run_command(s, which, s->keys[ki], true, NULL) != 0)
		return false;
	s->enqueued[ki]++;
	return true;
}

/* ---------------------------------------------------------------------
 * What a case observed
 * --------------------------------------------------------------------- */

/* a delivery as the matrix shows it: "run", "run (killed)", "held", "ID002" */
static void
delivery_text(const delivery *d, char *buf, size_t sz)
{
	if (!d->runs)
	{
		if (strcmp(d->verdict, "error") == 0)
			snprintf(buf, sz, "%s", d->sqlstate[0] ? d->sqlstate : "error");
		else
			snprintf(buf, sz, "%s", d->verdict[0] ? d->verdict : "?");
	}
	else if (d->killed)
		snprintf(buf, sz, "%s (%s)", d->verdict, d->mark[0] ? d->mark : "killed");
	else if (d->mark[0])
		snprintf(buf, sz, "%s (%s)", d->verdict, d->mark);
	else if (strcmp(d->verdict, "verify") == 0 && d->eff_before >= 0 && d->eff_after >= 0)
		snprintf(buf, sz, "verify (%s)", d->eff_after > d->eff_before ? "not found" : "found");
	else
		snprintf(buf, sz, "%s", d->verdict);
}

/* an answer that runs nothing: a queue may deliver a message again */
static bool
runs_nothing(const char *v)
{
	return strcmp(v, "completed") == 0 || strcmp(v, "in_progress") == 0 ||
		strcmp(v, "held") == 0 || strcmp(v, "skipped") == 0 || strcmp(v, "busy") == 0;
}


static int
split_items(const char *list, char items[][64])
{
	int			n = 0;
	const char *p = list;

	while (*p && n < MAX_ITEMS)
	{
		const char *end = strstr(p, ", ");
		size_t		len = end ? (size_t) (end - p) : strlen(p);

		if (len > 63)
			len = 63;
		memcpy(items[n], p, len);
		items[n][len] = '\0';
		n++;
		if (end == NULL)
			break;
		p = end + 2;
	}
	return n;
}

/*
 * The verdict rule of a sign-off run: the expected verdicts must appear in
 * the observed ones in their order, and every other observed one must be an
 * answer that runs nothing (the queue's own redeliveries). Then the cell
 * shows the expected ones and the note lists the others; else the cell
 * shows all that was observed.
 */
static void
judge_verdicts(signoff_state *s, const char *observed)
{
	case_result *cr = s->cr;
	char		exp[MAX_ITEMS][64];
	char		obs[MAX_ITEMS][64];
	int			ne = split_items(cr->exp_verdicts, exp);
	int			no = split_items(observed, obs);
	int			i,
				j = 0;
	bool		ok = true;
	char		extras[CELL] = "";

	for (i = 0; i < no; i++)
	{
		if (j < ne && strcmp(obs[i], exp[j]) == 0)
			j++;
		else
		{
			list_append(extras, sizeof(extras), obs[i]);
			if (!runs_nothing(obs[i]))
				ok = false;
		}
	}
	if (j < ne)
		ok = false;
	if (ok)
	{
		copy_str(cr->obs_verdicts, CELL, cr->exp_verdicts);
		if (extras[0])
			case_note(cr, "Also delivered, besides the expected verdicts: %s (the queue delivered a message "
					  "once more by itself; these answers run nothing).", extras);
	}
	else
		copy_str(cr->obs_verdicts, CELL, observed[0] ? observed : "no answer");
}

/* "run, in_progress, in_progress" -> "run, 2× in_progress" (case 3s) */
static void
group_items(char *list, size_t sz, bool utf8)
{
	static char items[MAX_ITEMS][64];
	int			n = split_items(list, items);
	int			i = 0;

	list[0] = '\0';
	while (i < n)
	{
		int			j = i;
		char		item[96];

		while (j < n && strcmp(items[j], items[i]) == 0)
			j++;
		if (j - i > 1)
			snprintf(item, sizeof(item), "%d%s %s", j - i, utf8 ? "\xC3\x97" : "x", items[i]);
		else
			snprintf(item, sizeof(item), "%s", items[i]);
		list_append(list, sz, item);
		i = j;
	}
}

/*
 * With the run's endpoint: requests since the last look that named none of
 * the run's keys fail the case (the run cannot tell whose effect it was)
 */
void
check_unmatched(signoff_state *s)
{
	char		first[200];
	int			n;

	if (s->job->effect == EFFECT_NONE)
		return;
	n = effect_unmatched(first, sizeof(first));
	if (n <= s->unmatched)
		return;
	case_fail(s->cr, "%d request%s to the run's %s endpoint named none of the run's keys (the first: \"%s\"), "
			  "so the run cannot tell whose %s it was: put the operation key into the request "
			  "(an Idempotency-Key header, the path, the query or the body)",
			  n - s->unmatched, n - s->unmatched == 1 ? "" : "s", effect_kind_names[s->job->effect],
			  first, s->job->value[JF_EFFECT_NAME] ? s->job->value[JF_EFFECT_NAME] : "effect");
	s->unmatched = n;
}

/* the end of a case: effects (the workers stopped, or stay for the next case), records, verdicts */
void
observe(signoff_state *s, const char *suffix)
{
	case_result *cr = s->cr;
	char		items[CELL * 8] = "";
	int			ki,
				i;

	if (s->nkeys == 1)
		cr->obs_emails = effects_count(s, s->keys[0], true);
	else
	{
		int			total = 0;

		for (ki = 0; ki < s->nkeys; ki++)
		{
			int			n = effects_count(s, s->keys[ki], true);

			if (n < 0)
				total = -1;
			else
			{
				if (n != 1)
					case_fail(cr, "%s has %d effects", s->keys[ki], n);
				if (total >= 0)
					total += n;
			}
		}
		cr->obs_emails = total;
	}
	check_unmatched(s);
	for (ki = 0; ki < s->nkeys; ki++)
	{
		char		rec[CELL];

		record_text_of(s->ctx, cr, s->job_type, s->opkey[ki], rec, sizeof(rec), NULL, 0);
		list_append(cr->obs_record, CELL, rec);
	}
	for (ki = 0; ki < s->nkeys; ki++)
		for (i = case_first_delivery; i < s->nd; i++)
		{
			char		t[64];

			if (s->d[i].stray || s->d[i].ki != ki)
				continue;
			delivery_text(&s->d[i], t, sizeof(t));
			list_append(items, sizeof(items), t);
			if (s->d[i].after[0])
				list_append(items, sizeof(items), s->d[i].after);
		}
	if (suffix && suffix[0])
		list_append(items, sizeof(items), suffix);
	if (strcmp(s->case_id, "3s") == 0)
		group_items(items, sizeof(items), s->ctx->utf8);
	judge_verdicts(s, items);
}

/* stale_wait()'s idle: the socket is served while a lease runs out */
static void
pump_idle(void *arg, int ms)
{
	pump((signoff_state *) arg, ms);
}

/* the record of key ki must be a claim for stale_claims() to list it */
bool
wait_stale_checked(signoff_state *s, int ki)
{
	char		status[32];
	int			attempt = 0;

	if (record_row(s, s->opkey[ki], status, sizeof(status), &attempt) && strcmp(status, "claimed") != 0)
	{
		case_fail(s->cr, "the record of %s is %s #%d already, so stale_claims() will never list it: "
				  "was the completion sent before the handler returned?", s->keys[ki], status, attempt);
		return false;
	}
	return stale_wait(s->ctx, s->cr, s->job_type, s->opkey[ki], policy_names[s->policy],
					  pump_idle, s);
}
