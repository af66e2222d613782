/*
 * signoff.c
 *		The sign-off run (--job FILE): the replay matrix on the user's job.
 *
 * docs/signoff.md is the user's description; docs/signoff-protocol.md the
 * protocol the helpers speak. In short: the runner starts the user's worker
 * command (each in a process group of its own, via setsid, with
 * IDEMPOTENCY_SIGNOFF naming the runner's Unix socket), enqueues messages
 * with the user's enqueue command, and the helper in the worker reports the
 * points claimed, judged and handled over the socket: one line of JSON per
 * point, on a connection of its own, answered with one line ("continue",
 * "fail") or not at all, while the runner SIGKILLs the worker's process
 * group. The cases are the reference run's 1-7 and 9-13 (not 8 and 3s,
 * which test the extension, not the job), with case_expectations()'s
 * expectations; the effects are counted by the job file's effects command
 * or effects_sql, else by the handled reports.
 *
 * How a case runs: the case "arms" the point it wants to hold for a key
 * (one-shot); every other exchange is answered "continue" at once and only
 * recorded. Each exchange of a claimed or judged point is one delivery of a
 * message; a handled point belongs to its claimed one (key, pid, attempt).
 * The verdicts of a case are its keys' deliveries in the order they
 * arrived. At the end of a case its workers are stopped (SIGTERM to each
 * group, which a worker takes as "finish the message in hand and exit";
 * SIGKILL after the timeout), and only then are the effects counted: an
 * effect a worker makes after its last point (after "judged" or "handled")
 * is counted too.
 *
 * Waiting is for events, never a guessed time: poll() on the socket (with
 * the job file's timeout as the bound), stale_claims() polled for a lease
 * to run out, the record polled for a completion or a release.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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

#include "matrix.h"

#define KEYSZ 160
#define MAX_PROCS 256			/* process groups of a whole run */
#define MAX_CASE_WORKERS 65		/* case 3s: --stress up to 64, and one */
#define MAX_EXCH 64				/* exchanges open at once */
#define POLL_MS 10
#define TAIL_LINES 8

/* ---------------------------------------------------------------------
 * The cases of a sign-off run
 * --------------------------------------------------------------------- */

typedef struct signoff_state signoff_state;
typedef void (*signoff_case_fn) (signoff_state *s);

static void sc_1(signoff_state *s);
static void sc_2(signoff_state *s);
static void sc_3(signoff_state *s);
static void sc_3s(signoff_state *s);
static void sc_4(signoff_state *s);
static void sc_5(signoff_state *s);
static void sc_6(signoff_state *s);
static void sc_7a(signoff_state *s);
static void sc_7b(signoff_state *s);
static void sc_8(signoff_state *s);
static void sc_9(signoff_state *s);
static void sc_10(signoff_state *s);
static void sc_11(signoff_state *s);
static void sc_12(signoff_state *s);
static void sc_13(signoff_state *s);

/* the steps of each case the sign-off run has; the case itself is in case_table.c */
static const struct
{
	const char *id;
	signoff_case_fn run;
}			signoff_steps[] = {
	{"1", sc_1},
	{"2", sc_2},
	{"3", sc_3},
	{"3s", sc_3s},
	{"4", sc_4},
	{"5", sc_5},
	{"6", sc_6},
	{"7a", sc_7a},
	{"7b", sc_7b},
	{"8", sc_8},
	{"9", sc_9},
	{"10", sc_10},
	{"11", sc_11},
	{"12", sc_12},
	{"13", sc_13},
};

static signoff_case_fn
steps_of(const char *id)
{
	size_t		i;

	for (i = 0; i < sizeof(signoff_steps) / sizeof(signoff_steps[0]); i++)
		if (strcmp(signoff_steps[i].id, id) == 0)
			return signoff_steps[i].run;
	return NULL;
}


bool
signoff_case_wanted(const char *cases, const signoff_job *job, const case_spec *c)
{
	if (job->reference)
	{
		/* the reference job's worker can do every case */
		if (strcmp(c->id, "3s") == 0 && job->stress == 0)
			return false;
		return case_selected(cases, c->id);
	}
	if (!(c->runs_in & (job->transactional ? RUN_TX : RUN_SIGNOFF)))
		return false;
	if (strcmp(c->id, "11") == 0 && job->value[JF_ENQUEUE_OTHER] == NULL)
		return false;
	return case_selected(cases, c->id);
}

int
signoff_count_cases(const char *cases, const signoff_job *job)
{
	int			k,
				n = 0;

	for (k = 0; k < n_case_table; k++)
		if (signoff_case_wanted(cases, job, &case_table[k]))
			n++;
	return n;
}

/* ---------------------------------------------------------------------
 * State
 * --------------------------------------------------------------------- */

/* a process group the run started: a worker, or a command */
typedef struct sproc
{
	bool		used;			/* the slot holds a group of this run */
	pid_t		pid;			/* also its process group (setsid) */
	char		name[16];		/* "w1" */
	char		log[600];
	bool		reaped;
	bool		killed;
	bool		gone;			/* the whole group is gone */
	int			status;			/* exit status, 128 + signal */
} sproc;

/* one delivery of a message: a claimed or a judged point */
typedef struct delivery
{
	char		key[KEYSZ];
	bool		runs;			/* claimed (run or verify), else judged */
	char		verdict[32];
	char		sqlstate[8];
	int			attempt;
	long		pid;
	bool		heartbeat;
	bool		handled;
	bool		killed;
	bool		failed;			/* answered fail at claimed */
	char		mark[32];		/* the case's word for it: "slow", ... */
	char		after[24];		/* an item after it: "released" */
	int			eff_before;		/* verify: effects at claimed; -1 */
	int			eff_after;		/* verify: effects at handled; -1 */
	bool		stray;			/* not a key of the case it came in */
	bool		has_result;		/* judged: the line gave the stored result */
	char		result[512];
} delivery;

/* one exchange on the socket */
typedef enum
{
	X_READING,
	X_HELD,						/* waiting for the case's answer */
	X_GONE						/* the worker closed it while held */
} xstate;

typedef struct exch
{
	int			fd;
	xstate		state;
	char		buf[4096];
	size_t		len;
	/* the line */
	char		point[16];
	char		job_type[200];
	char		key[KEYSZ];
	char		verdict[32];
	char		sqlstate[8];
	int			attempt;
	long		pid;
	int			v;
	bool		heartbeat;
	bool		has_result;
	char		result[512];	/* optional: the stored result, at judged */
	long		backend_pid;	/* optional: the server process of its transaction */
	int			delivery;		/* index into deliveries, or -1 */
} exch;

typedef struct arm
{
	int			key;			/* index into the case's keys */
	char		point[16];
	bool		on;
} arm;

struct signoff_state
{
	matrix_ctx *ctx;
	const signoff_job *job;
	char		sock[300];
	int			lfd;
	char		cmd_out[300];
	char		cmd_err[300];

	/* the policy */
	policy_t	policy;
	char		job_type[160];	/* the run's: <prefix>_<policy> */
	char		map[400];		/* IDEMPOTENCY_SIGNOFF_JOB_TYPES */

	/* the case */
	case_result *cr;
	const char *case_id;
	char		keys[2][KEYSZ];
	int			nkeys;
	int			enqueued[2];
	int			workers[MAX_CASE_WORKERS];	/* indexes into procs */
	int			nworkers;
	arm			arms[4];
	bool		not_armed;		/* a case found no worker reaching its point */
	char		record_early[CELL]; /* the record, read before the case's end */

	exch	   *x[MAX_EXCH];
	int			nx;
	delivery   *d;
	int			nd;
	int			dcap;
};

static sproc procs[MAX_PROCS];
static int	nprocs;
static signoff_state *live_state;

/* ---------------------------------------------------------------------
 * Processes: each in a session and process group of its own
 * --------------------------------------------------------------------- */

static void
shell_quote(sbuf *b, const char *s)
{
	sb_puts(b, "'");
	for (; *s; s++)
	{
		if (*s == '\'')
			sb_puts(b, "'\\''");
		else
			sb_append(b, s, 1);
	}
	sb_puts(b, "'");
}

/* the command with every {key} replaced by the key, shell-quoted */
static void
expand(sbuf *b, const char *tmpl, const char *key)
{
	const char *p = tmpl;

	while (*p)
	{
		const char *k = key ? strstr(p, "{key}") : NULL;

		if (k == NULL)
		{
			sb_puts(b, p);
			break;
		}
		sb_append(b, p, (size_t) (k - p));
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
		for (; env && *env; env++)
			putenv(*env);
		if (chdir(s->job->dir) != 0)
		{
			fprintf(stderr, "idempotency-matrix: cannot enter %s: %s\n", s->job->dir, strerror(errno));
			_exit(127);
		}
		execl("/bin/sh", "sh", "-c", cmd, (char *) NULL);
		fprintf(stderr, "idempotency-matrix: cannot run /bin/sh: %s\n", strerror(errno));
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
	copy_str(p->name, sizeof(p->name), name);
	copy_str(p->log, sizeof(p->log), log);
	return i;
}

/* a group that is gone: its slot may be used again */
static void
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
			p->gone = true;
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
		fprintf(stderr, "idempotency-matrix: the worker logs are kept in %s\n", ctx->signoff_dir);
}

/* the last lines of a file, as notes ("  | line") */
static void
note_tail(case_result *cr, const char *path, const char *prefix)
{
	FILE	   *f = fopen(path, "r");
	char	   *lines[TAIL_LINES];
	int			n = 0,
				i;
	char	   *line = NULL;
	size_t		cap = 0;
	ssize_t		len;

	if (f == NULL)
	{
		case_note(cr, "%s(%s: %s)", prefix, path, strerror(errno));
		return;
	}
	memset(lines, 0, sizeof(lines));
	while ((len = getline(&line, &cap, f)) >= 0)
	{
		while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
			line[--len] = '\0';
		free(lines[n % TAIL_LINES]);
		lines[n % TAIL_LINES] = strdup(line);
		n++;
	}
	free(line);
	fclose(f);
	if (n == 0)
		case_note(cr, "%s(empty)", prefix);
	for (i = n > TAIL_LINES ? n - TAIL_LINES : 0; i < n; i++)
	{
		char		cut[300];

		copy_str(cut, sizeof(cut), lines[i % TAIL_LINES]);
		case_note(cr, "%s%s", prefix, cut);
	}
	for (i = 0; i < TAIL_LINES; i++)
		free(lines[i]);
}

/* ---------------------------------------------------------------------
 * The socket: exchanges
 * --------------------------------------------------------------------- */

/* a JSON string at *p (after the quote); false if malformed */
static bool
json_str(const char **pp, char *out, size_t sz)
{
	const char *p = *pp;
	size_t		n = 0;

	for (;;)
	{
		unsigned int c = (unsigned char) *p++;

		if (c == '\0')
			return false;
		if (c == '"')
			break;
		if (c == '\\')
		{
			c = (unsigned char) *p++;
			switch (c)
			{
				case 'n':
					c = '\n';
					break;
				case 't':
					c = '\t';
					break;
				case 'r':
					c = '\r';
					break;
				case 'b':
					c = '\b';
					break;
				case 'f':
					c = '\f';
					break;
				case 'u':
					{
						unsigned int u = 0;
						int			k;

						for (k = 0; k < 4; k++)
						{
							char		h = *p++;

							u <<= 4;
							if (h >= '0' && h <= '9')
								u |= (unsigned) (h - '0');
							else if (h >= 'a' && h <= 'f')
								u |= (unsigned) (h - 'a' + 10);
							else if (h >= 'A' && h <= 'F')
								u |= (unsigned) (h - 'A' + 10);
							else
								return false;
						}
						c = u < 0x80 ? u : '?';	/* the fields are ASCII */
					}
					break;
				case '"':
				case '\\':
				case '/':
					break;
				default:
					return false;
			}
		}
		if (n + 1 < sz)
			out[n++] = (char) c;
	}
	out[n] = '\0';
	*pp = p;
	return true;
}

static const char *
skip_ws(const char *p)
{
	while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
		p++;
	return p;
}

/* one line of the protocol (a flat JSON object) into x; false: why */
static bool
parse_line(const char *line, exch *x, char *why, size_t wsz)
{
	const char *p = skip_ws(line);

	x->v = 0;
	x->point[0] = x->job_type[0] = x->key[0] = x->verdict[0] = x->sqlstate[0] = '\0';
	x->attempt = 0;
	x->pid = 0;
	x->heartbeat = false;
	x->has_result = false;
	x->result[0] = '\0';
	x->backend_pid = 0;
	if (*p++ != '{')
		goto bad;
	p = skip_ws(p);
	if (*p == '}')
		goto bad;
	for (;;)
	{
		char		name[32];
		char		sval[512];
		bool		is_str = false;
		bool		is_null = false;
		double		num = 0;

		p = skip_ws(p);
		if (*p++ != '"' || !json_str(&p, name, sizeof(name)))
			goto bad;
		p = skip_ws(p);
		if (*p++ != ':')
			goto bad;
		p = skip_ws(p);
		sval[0] = '\0';
		if (*p == '"')
		{
			p++;
			if (!json_str(&p, sval, sizeof(sval)))
				goto bad;
			is_str = true;
		}
		else if (strncmp(p, "null", 4) == 0)
		{
			is_null = true;
			p += 4;
		}
		else if (strncmp(p, "true", 4) == 0)
		{
			num = 1;
			p += 4;
		}
		else if (strncmp(p, "false", 5) == 0)
		{
			num = 0;
			p += 5;
		}
		else
		{
			char	   *end;

			num = strtod(p, &end);
			if (end == p)
				goto bad;
			p = end;
		}
		if (strcmp(name, "v") == 0 && !is_str && !is_null)
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
		else if (strcmp(name, "attempt") == 0 && !is_str)
			x->attempt = is_null ? 0 : (int) num;
		else if (strcmp(name, "pid") == 0 && !is_str && !is_null)
			x->pid = (long) num;
		else if (strcmp(name, "heartbeat") == 0 && !is_str && !is_null)
			x->heartbeat = num != 0;
		else if (strcmp(name, "backend_pid") == 0 && !is_str && !is_null)
			x->backend_pid = (long) num;
		else if (strcmp(name, "result") == 0 && is_str)
		{
			x->has_result = true;
			copy_str(x->result, sizeof(x->result), sval);
		}
		p = skip_ws(p);
		if (*p == ',')
		{
			p++;
			continue;
		}
		if (*p == '}')
			break;
		goto bad;
	}
	if (x->v != 1)
	{
		snprintf(why, wsz, "protocol version %d, not 1", x->v);
		return false;
	}
	if (strcmp(x->point, "claimed") != 0 && strcmp(x->point, "judged") != 0 &&
		strcmp(x->point, "handled") != 0)
	{
		snprintf(why, wsz, "no point claimed, judged or handled (\"%s\")", x->point);
		return false;
	}
	if (x->key[0] == '\0' || x->job_type[0] == '\0' || x->pid <= 0)
	{
		snprintf(why, wsz, "no key, job_type or pid");
		return false;
	}
	return true;

bad:
	snprintf(why, wsz, "not a JSON object");
	return false;
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
	free(x);
}

/* the answer line, and the exchange is over */
static void
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

static int	effects_count(signoff_state *s, const char *key, bool pump_meanwhile);

static int
case_key(signoff_state *s, const char *key)
{
	int			i;

	for (i = 0; i < s->nkeys; i++)
		if (strcmp(s->keys[i], key) == 0)
			return i;
	return -1;
}

static delivery *
new_delivery(signoff_state *s, const exch *x)
{
	delivery   *d;

	if (s->nd == s->dcap)
	{
		s->dcap = s->dcap ? s->dcap * 2 : 64;
		s->d = realloc(s->d, (size_t) s->dcap * sizeof(delivery));
		if (s->d == NULL)
		{
			fprintf(stderr, "idempotency-matrix: out of memory\n");
			abort();
		}
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
	return d;
}

/* a complete line arrived on x */
static void
arrived(signoff_state *s, exch *x)
{
	char		why[128];
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
	if (strcmp(x->job_type, s->job_type) != 0)
	{
		/* another job type of the same worker: not the run's business */
		answer(s, x, "continue");
		return;
	}
	claimed = strcmp(x->point, "claimed") == 0;
	judged = strcmp(x->point, "judged") == 0;
	ki = case_key(s, x->key);
	x->delivery = -1;
	if (claimed || judged)
	{
		d = new_delivery(s, x);
		d->runs = claimed;
		d->stray = ki < 0;
		x->delivery = (int) (d - s->d);
		/* verify: the effects now and at handled tell found from not found */
		if (claimed && ki >= 0 && strcmp(x->verdict, "verify") == 0 &&
			strcmp(s->job->effects_source, "handled reports") != 0)
		{
			int			n = effects_count(s, x->key, false);

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
		x->delivery = i;
		if (ki >= 0 && s->d[i].eff_before >= 0)
		{
			int			n = effects_count(s, x->key, false);

			s->d[x->delivery].eff_after = n;
		}
	}
	if (ki < 0)
	{
		if (s->cr)
			case_note(s->cr, "A delivery of %s, not a key of this case (a message the queue kept from an "
					  "earlier case), reached %s (%s%s%s): answered continue.",
					  x->key, x->point, x->verdict[0] ? x->verdict : "-",
					  x->sqlstate[0] ? " " : "", x->sqlstate);
		answer(s, x, "continue");
		return;
	}
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
 * Take in what the socket has within ms milliseconds: new connections,
 * lines, closed connections; and reap the groups that ended.
 */
static void
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
				x = calloc(1, sizeof(exch));
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

#define N_ENV 6

typedef struct run_env
{
	char		var[N_ENV][1200];
	char	   *env[N_ENV + 1];
} run_env;

/*
 * What every worker and command gets: the run's id, the job-type map, the
 * lease, the case, the run's database (--dsn; else the worker uses its own
 * configuration or libpq's environment); a worker also the socket.
 */
static void
make_env(signoff_state *s, bool worker, run_env *e)
{
	int			n = 0;
	int			i;

	snprintf(e->var[n++], sizeof(e->var[0]), "IDEMPOTENCY_SIGNOFF_RUN=%s", s->ctx->run_id);
	snprintf(e->var[n++], sizeof(e->var[0]), "IDEMPOTENCY_SIGNOFF_JOB_TYPES=%s", s->map);
	snprintf(e->var[n++], sizeof(e->var[0]), "IDEMPOTENCY_SIGNOFF_LEASE=%g", s->job->lease_s);
	snprintf(e->var[n++], sizeof(e->var[0]), "IDEMPOTENCY_SIGNOFF_CASE=%s", s->case_id ? s->case_id : "");
	if (s->ctx->dsn)
		snprintf(e->var[n++], sizeof(e->var[0]), "IDEMPOTENCY_SIGNOFF_DSN=%s", s->ctx->dsn);
	if (worker)
		snprintf(e->var[n++], sizeof(e->var[0]), "IDEMPOTENCY_SIGNOFF=%s", s->sock);
	for (i = 0; i < n; i++)
		e->env[i] = e->var[i];
	e->env[n] = NULL;
}

/* ---------------------------------------------------------------------
 * Commands: enqueue, enqueue_other, effects
 * --------------------------------------------------------------------- */

/* a file's content (at most a few kB of its end), for messages */
static void
read_file(const char *path, sbuf *b, size_t max)
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
		sb_append(b, buf, n);
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
static int
run_command(signoff_state *s, job_field which, const char *key, bool pump_meanwhile,
			sbuf *out)
{
	sbuf		cmd;
	char		why[256];
	static run_env env;
	pid_t		pid;
	int			idx;
	int			status;
	double		t0;
	bool		timed_out = false;

	sb_init(&cmd);
	expand(&cmd, s->job->value[which], key);
	make_env(s, false, &env);
	pid = spawn(s, sb_str(&cmd), s->cmd_out, s->cmd_err, false, env.env, why, sizeof(why));
	idx = pid < 0 ? -1 : track_proc(pid, job_field_names[which], s->cmd_err);
	if (idx < 0)
	{
		if (pid > 0)
			kill(-pid, SIGKILL);
		case_fail(s->cr, "the %s command `%s` could not start: %s", job_field_names[which],
				  sb_str(&cmd), pid < 0 ? why : "too many processes");
		sb_free(&cmd);
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
			sb_free(&cmd);
			case_fail(s->cr, "interrupted");
			return -1;
		}
		if (now_seconds() - t0 > s->job->timeout_s)
		{
			timed_out = true;
			break;
		}
		if (pump_meanwhile)
			pump(s, 1);
		else
			poll(NULL, 0, 1);
	}
	/* the command is over; so is whatever it left running in its group */
	kill_group(&procs[idx]);
	status = timed_out ? -1 : procs[idx].status;
	forget_proc(idx);
	if (status != 0)
	{
		sbuf		err;
		const char *p;

		if (timed_out)
			case_fail(s->cr, "the %s command `%s` did not end within %g s (timeout): killed",
					  job_field_names[which], sb_str(&cmd), s->job->timeout_s);
		else
			case_fail(s->cr, "the %s command `%s` exited with status %d", job_field_names[which],
					  sb_str(&cmd), status);
		sb_init(&err);
		read_file(s->cmd_err, &err, 2000);
		if (err.len == 0)
			case_note(s->cr, "  (its standard error was empty)");
		else
		{
			int			lines = 0;
			const char *start;

			/* the last TAIL_LINES lines */
			p = sb_str(&err) + err.len;
			while (p > sb_str(&err) && (p[-1] == '\n'))
				p--;
			start = p;
			while (start > sb_str(&err) && lines < TAIL_LINES)
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
		sb_free(&err);
	}
	else if (out)
		read_file(s->cmd_out, out, 4096);
	sb_free(&cmd);
	return status;
}

/*
 * The effects of the key: the effects command's number, effects_sql's, or
 * the handler runs that returned (handled reports). -1: could not be
 * counted (the case fails, noted).
 */
static int
effects_count(signoff_state *s, const char *key, bool pump_meanwhile)
{
	if (s->job->value[JF_EFFECTS])
	{
		sbuf		out;
		char	   *p;
		char	   *end;
		long		n;

		sb_init(&out);
		if (run_command(s, JF_EFFECTS, key, pump_meanwhile, &out) != 0)
		{
			sb_free(&out);
			return -1;
		}
		p = trim(out.data ? out.data : (char *) "");
		n = strtol(p, &end, 10);
		if (end == p || *end != '\0' || n < 0 || n > INT_MAX)
		{
			case_fail(s->cr, "the effects command for %s printed \"%.80s\", not a number of effects", key, p);
			sb_free(&out);
			return -1;
		}
		sb_free(&out);
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
		int			i,
					n = 0;

		for (i = 0; i < s->nd; i++)
			if (s->d[i].runs && s->d[i].handled && strcmp(s->d[i].key, key) == 0)
				n++;
		return n;
	}
}

/* ---------------------------------------------------------------------
 * Workers
 * --------------------------------------------------------------------- */

static bool
start_workers(signoff_state *s, int n)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		char		name[16];
		char		log[600];
		char		why[256];
		static run_env env;
		pid_t		pid;
		int			idx;

		if (s->nworkers >= MAX_CASE_WORKERS)
			return false;
		snprintf(name, sizeof(name), "w%d", s->nworkers + 1);
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
static bool
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

/*
 * The case's workers stop: SIGTERM to each group (a worker finishes the
 * message in hand and exits), the socket served meanwhile (every point is
 * answered continue), SIGKILL after the timeout.
 */
static void
stop_workers(signoff_state *s)
{
	int			i;
	double		t0 = now_seconds();

	for (i = 0; i < (int) (sizeof(s->arms) / sizeof(s->arms[0])); i++)
		s->arms[i].on = false;
	for (i = s->nx - 1; i >= 0; i--)
		if (s->x[i]->state == X_HELD || s->x[i]->state == X_GONE)
			answer(s, s->x[i], "continue");
	for (i = 0; i < s->nworkers; i++)
		if (!procs[s->workers[i]].gone)
			kill(-procs[s->workers[i]].pid, SIGTERM);
	while (any_worker_alive(s) && !matrix_interrupted &&
		   now_seconds() - t0 <= s->job->timeout_s)
		pump(s, POLL_MS);
	for (i = 0; i < s->nworkers; i++)
	{
		sproc	   *p = &procs[s->workers[i]];

		if (p->gone)
			continue;
		if (!matrix_interrupted)
			case_note(s->cr, "%s (pid %d) did not end within %g s of SIGTERM: killed with SIGKILL.",
					  p->name, (int) p->pid, s->job->timeout_s);
		kill_group(p);
	}
	/* exchanges that came in at the very end */
	pump(s, 0);
}

/* ---------------------------------------------------------------------
 * Waiting
 * --------------------------------------------------------------------- */

typedef enum
{
	WAIT_OK,
	WAIT_TIMEOUT,
	WAIT_INTERRUPTED,
	WAIT_NO_WORKER
} wres;

typedef bool (*wait_pred) (signoff_state *s, const void *arg);

/*
 * Serve the socket until pred holds; bounded by the timeout, and (with
 * need_worker) by the case's workers: when all of them ended, nothing can
 * make pred true.
 */
static wres
wait_for(signoff_state *s, wait_pred pred, const void *arg, bool need_worker, double limit)
{
	double		t0 = now_seconds();

	for (;;)
	{
		if (pred(s, arg))
			return WAIT_OK;
		if (matrix_interrupted)
			return WAIT_INTERRUPTED;
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
static int	case_first_delivery;

static int
case_points(signoff_state *s)
{
	int			i,
				n = 0;

	for (i = case_first_delivery; i < s->nd; i++)
		n++;
	return n;
}

static int
count_deliveries(signoff_state *s, int ki)
{
	int			i,
				n = 0;

	for (i = case_first_delivery; i < s->nd; i++)
		if (!s->d[i].stray && strcmp(s->d[i].key, s->keys[ki]) == 0)
			n++;
	return n;
}

/* the n-th (1-based) delivery of key ki in this case (its index), or -1 */
static int
nth_delivery(signoff_state *s, int ki, int n)
{
	int			i;

	for (i = case_first_delivery; i < s->nd; i++)
		if (!s->d[i].stray && strcmp(s->d[i].key, s->keys[ki]) == 0 && --n == 0)
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
static int
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
			strcmp(s->x[i]->key, s->keys[ki]) == 0)
			return s->x[i];
	return NULL;
}

static bool
pred_held(signoff_state *s, const void *arg)
{
	const held_arg *a = arg;

	return find_held(s, a->ki, a->point) != NULL;
}

static void
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
static exch *
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
static bool
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
static bool
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

static bool
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

#define MAX_ITEMS 72			/* case 3s: up to 65 deliveries */

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

/* the end of a case: effects (the workers are stopped), records, verdicts */
static void
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
	if (s->record_early[0])
		copy_str(cr->obs_record, CELL, s->record_early);
	else
		for (ki = 0; ki < s->nkeys; ki++)
		{
			char		rec[CELL];

			record_text_of(s->ctx, cr, s->job_type, s->keys[ki], rec, sizeof(rec), NULL, 0);
			list_append(cr->obs_record, CELL, rec);
		}
	for (ki = 0; ki < s->nkeys; ki++)
		for (i = case_first_delivery; i < s->nd; i++)
		{
			char		t[64];

			if (s->d[i].stray || strcmp(s->d[i].key, s->keys[ki]) != 0)
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
static bool
wait_stale_checked(signoff_state *s, int ki)
{
	char		status[32];
	int			attempt = 0;

	if (record_row(s, s->keys[ki], status, sizeof(status), &attempt) && strcmp(status, "claimed") != 0)
	{
		case_fail(s->cr, "the record of %s is %s #%d already, so stale_claims() will never list it: "
				  "was the completion sent before the handler returned?", s->keys[ki], status, attempt);
		return false;
	}
	return stale_wait(s->ctx, s->cr, s->job_type, s->keys[ki], policy_names[s->policy],
					  pump_idle, s);
}

/* ---------------------------------------------------------------------
 * The cases
 * --------------------------------------------------------------------- */

/* 1: one worker, one message: run, completed #1, one effect */
static void
sc_1(signoff_state *s)
{
	if (start_workers(s, 1) && enqueue(s, 0, JF_ENQUEUE))
		settle(s);
	stop_workers(s);
	observe(s, NULL);
}

/*
 * 2: the same message again after it completed: judged completed. A helper
 * that sends the stored result with judged (optional) must send the one
 * the record holds.
 */
static void
sc_2(signoff_state *s)
{
	int			i;

	if (start_workers(s, 1) && enqueue(s, 0, JF_ENQUEUE) && settle(s) &&
		enqueue(s, 0, JF_ENQUEUE) && settle(s) && (i = nth_delivery(s, 0, 2)) >= 0 &&
		s->d[i].has_result)
	{
		PGresult   *res = record_query(s->ctx, s->job_type, s->keys[0]);

		if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 &&
			strcmp(PQgetvalue(res, 0, 2), s->d[i].result) == 0)
			case_note(s->cr, "The redelivery got the stored result back: %s.", s->d[i].result);
		else
			case_fail(s->cr, "the redelivery's result %s is not what the record stores (%s)", s->d[i].result,
					  PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1
					  ? PQgetvalue(res, 0, 2) : case_sql_error(res, s->ctx));
		PQclear(res);
	}
	stop_workers(s);
	observe(s, NULL);
}

/*
 * 3: two workers; the first delivery is held at claimed, and the same
 * message is enqueued again meanwhile: the other worker's claim meets the
 * claim in flight (in_progress). Enqueued only once the first stands at
 * claimed, so that the two points arrive in the order of the claims.
 */
static void
sc_3(signoff_state *s)
{
	exch	   *x;
	int			other;

	arm_point(s, 0, "claimed");
	if (start_workers(s, 2) && enqueue(s, 0, JF_ENQUEUE) &&
		(x = wait_held(s, 0, "claimed")) != NULL)
	{
		long		pid = x->pid;

		if (enqueue(s, 0, JF_ENQUEUE) && (other = wait_nth(s, 0, 2)) >= 0)
			case_note(s->cr, "While pid %ld stood at claimed, the same message went to pid %ld, which was judged %s.",
					  pid, s->d[other].pid, s->d[other].runs ? "run" : s->d[other].verdict);
		answer(s, x, "continue");
		settle(s);
	}
	stop_workers(s);
	observe(s, NULL);
}

/* 4: another key at the same time, two workers: both run, one effect each */
static void
sc_4(signoff_state *s)
{
	if (start_workers(s, 2) && enqueue(s, 0, JF_ENQUEUE) && enqueue(s, 1, JF_ENQUEUE))
		settle(s);
	stop_workers(s);
	observe(s, NULL);
}

/*
 * 3s: the stress variant of 3, a capability of the reference job's worker
 * (quick to start): --stress workers; while the first delivery stands at
 * claimed, the message goes to the others, and every one of them must meet
 * the claim in flight (in_progress).
 */
static void
sc_3s(signoff_state *s)
{
	int			n = s->job->stress;
	exch	   *x;
	int			i;

	arm_point(s, 0, "claimed");
	if (start_workers(s, n) && enqueue(s, 0, JF_ENQUEUE) &&
		(x = wait_held(s, 0, "claimed")) != NULL)
	{
		long		pid = x->pid;
		double		t0 = now_seconds();

		for (i = 1; i < n; i++)
			if (!enqueue(s, 0, JF_ENQUEUE))
				break;
		if (i == n && wait_nth(s, 0, n) >= 0)
		{
			long		pids[MAX_CASE_WORKERS];
			int			npids = 0;
			int			j,
						k;

			for (j = case_first_delivery; j < s->nd; j++)
			{
				for (k = 0; k < npids && pids[k] != s->d[j].pid; k++)
					;
				if (k == npids && npids < MAX_CASE_WORKERS)
					pids[npids++] = s->d[j].pid;
			}
			case_note(s->cr, "%d workers; while pid %ld stood at claimed, the message went %d more times, "
					  "to %d workers, all answered within %.0f ms.",
					  n, pid, n - 1, npids - 1, (now_seconds() - t0) * 1000.0);
		}
		answer(s, x, "continue");
		settle(s);
	}
	stop_workers(s);
	observe(s, NULL);
}

/*
 * 8: the transactional mode (the effect is a row written in the
 * completion's transaction; the reference job's worker in this case): the
 * worker is killed at handled, inside its transaction, after its row and
 * before the completion. Once its server process left the transaction
 * there is no record and no row; the message again runs once, as attempt 1.
 */
static bool
pred_backend_idle(signoff_state *s, const void *arg)
{
	char		pid[24];
	const char *params[1];
	PGresult   *res;
	bool		gone;

	snprintf(pid, sizeof(pid), "%ld", *(const long *) arg);
	params[0] = pid;
	res = db_exec(s->ctx, "SELECT 1 FROM pg_catalog.pg_stat_activity "
				  "WHERE pid OPERATOR(pg_catalog.=) $1::integer AND xact_start IS NOT NULL",
				  1, params);
	gone = PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 0;
	PQclear(res);
	return gone;
}

static void
sc_8(signoff_state *s)
{
	exch	   *x;
	long		backend = 0;
	char		before[CELL] = "";
	char		after[CELL];
	int			rows;
	double		t0;

	if (s->job->reference && (s->ctx->effects_table[0] == '\0' || s->ctx->effects_error[0]))
	{
		case_fail(s->cr, "no table for the effect rows: %s", s->ctx->effects_error);
		goto out;
	}
	arm_point(s, 0, "handled");
	if (!start_workers(s, 1) || !enqueue(s, 0, JF_ENQUEUE) ||
		(x = wait_held(s, 0, "handled")) == NULL)
		goto out;
	backend = x->backend_pid;
	if (x->delivery >= 0)
		copy_str(s->d[x->delivery].mark, sizeof(s->d[x->delivery].mark), "killed in transaction");
	if (!kill_at(s, x, "inside its transaction, after the claim and the effect row, before the completion"))
		goto out;
	t0 = now_seconds();
	if (backend > 0)
	{
		/* the dead client's server process notices, rolls back, and leaves */
		if (wait_for(s, pred_backend_idle, &backend, false, s->job->timeout_s) != WAIT_OK)
		{
			case_fail(s->cr, "server process %ld of the killed worker did not leave its transaction", backend);
			goto out;
		}
	}
	record_text_of(s->ctx, s->cr, s->job_type, s->keys[0], before, sizeof(before), NULL, 0);
	rows = effects_count(s, s->keys[0], true);
	if (backend > 0)
		case_note(s->cr, "Its server process (pid %ld) left the transaction %.0f ms later; then the record was \"%s\" "
				  "and %d effect rows existed.", backend, (now_seconds() - t0) * 1000.0, before, rows);
	else
		case_note(s->cr, "Then the record was \"%s\" and %d effect rows existed (the worker did not name its "
				  "server process, backend_pid: the redelivery's verdict shows whether the transaction rolled back).",
				  before, rows);
	if (rows != 0)
		case_fail(s->cr, "the dead transaction's effect row is visible: the row was committed before the worker died "
				  "at handled, so it is not written in the completion's transaction");
	if (strcmp(before, "none") != 0)
		case_fail(s->cr, "the record was %s after the worker died at handled: the claim (or the completion) committed "
				  "on its own, before the handled point, so the effect is not in the claim's transaction", before);
	if (start_workers(s, 1) && enqueue(s, 0, JF_ENQUEUE))
		settle(s);
out:
	stop_workers(s);
	observe(s, NULL);
	if (before[0])
	{
		record_text_of(s->ctx, s->cr, s->job_type, s->keys[0], after, sizeof(after), NULL, 0);
		snprintf(s->cr->obs_record, CELL, "%.90s, then %.90s", before, after);
	}
	case_note(s->cr, "The effect here is a row in the claim's own transaction, not an %s: the %s column counts effect rows.",
			  s->job->reference ? "email" : "outside effect", s->job->reference ? "emails" : "effects");
}

/*
 * 5, 6: the worker is killed at claimed (before the handler) or at handled
 * (after it, before the completion); after the lease a new worker gets the
 * same message again. 7a, 7b: the same deaths, the message again inside the
 * lease (a second worker is started with the first, so that no worker start
 * stands between the death and the redelivery).
 */
static void
death(signoff_state *s, const char *point, bool after_lease)
{
	exch	   *x;
	bool		at_claimed = strcmp(point, "claimed") == 0;

	arm_point(s, 0, point);
	if (!start_workers(s, after_lease ? 1 : 2) || !enqueue(s, 0, JF_ENQUEUE) ||
		(x = wait_held(s, 0, point)) == NULL ||
		!kill_at(s, x, at_claimed ? "after its claim committed, before the handler"
				 : "after the handler returned, before the completion"))
		goto out;
	if (after_lease && (!wait_stale_checked(s, 0) || !start_workers(s, 1)))
		goto out;
	if (!enqueue(s, 0, JF_ENQUEUE))
		goto out;
	if (!after_lease)
	{
		int			i = wait_nth(s, 0, 2);

		if (i < 0)
			goto out;
		/* the record now, while the lease still runs */
		record_text_of(s->ctx, s->cr, s->job_type, s->keys[0], s->record_early,
					   sizeof(s->record_early), NULL, 0);
		if (!s->d[i].runs && strcmp(s->d[i].verdict, "in_progress") == 0)
			case_note(s->cr, "The message came again inside the lease: pid %ld was judged in_progress, and the attempt is still 1.",
					  s->d[i].pid);
		else if (strstr(s->record_early, "stale"))
			case_fail(s->cr, "the lease had already run out when the message came again: the worker or the queue "
					  "took longer than the lease (%s); give a longer lease in the job file", s->ctx->lease_sql);
	}
	settle(s);
out:
	stop_workers(s);
	observe(s, NULL);
}

static void
sc_5(signoff_state *s)
{
	death(s, "claimed", true);
}

static void
sc_6(signoff_state *s)
{
	death(s, "handled", true);
}

static void
sc_7a(signoff_state *s)
{
	death(s, "claimed", false);
}

static void
sc_7b(signoff_state *s)
{
	death(s, "handled", false);
}

/*
 * 9: a slow (not dead) worker: held at handled past the lease; the same
 * message again to a new worker, which takes over or not per the policy;
 * then the slow one goes on and sends its completion. The protocol has no
 * point after handled, so its outcome is read from the record once the
 * workers stopped: completed with its attempt (accepted), or with a later
 * attempt (a takeover's; the slow one's completion was refused, ID003,
 * because the attempt is the fencing token).
 */
static void
sc_9(signoff_state *s)
{
	exch	   *x = NULL;
	int			a1 = 0;
	char		suffix[64] = "";

	arm_point(s, 0, "handled");
	if (!start_workers(s, 1) || !enqueue(s, 0, JF_ENQUEUE) ||
		(x = wait_held(s, 0, "handled")) == NULL)
		goto out;
	a1 = x->attempt;
	if (x->delivery >= 0)
		copy_str(s->d[x->delivery].mark, sizeof(s->d[x->delivery].mark), "slow");
	case_note(s->cr, "pid %ld: the handler of attempt %d returned; the worker stands at handled (alive, its heartbeat stopped) past the lease.",
			  x->pid, a1);
	if (!wait_stale_checked(s, 0) || !start_workers(s, 1) || !enqueue(s, 0, JF_ENQUEUE) ||
		!settle(s))
		goto out;
	answer(s, x, "continue");
	x = NULL;
	settle(s);
out:
	stop_workers(s);
	if (a1 > 0)
	{
		char		status[32] = "";
		int			attempt = 0;

		if (!record_row(s, s->keys[0], status, sizeof(status), &attempt))
			copy_str(suffix, sizeof(suffix), "late completion no answer");
		else if (strcmp(status, "completed") == 0 && attempt == a1)
			copy_str(suffix, sizeof(suffix), "late completion ok");
		else if (strcmp(status, "completed") == 0 && attempt > a1)
		{
			copy_str(suffix, sizeof(suffix), "late completion ID003");
			case_note(s->cr, "The record is completed #%d by the takeover, so the slow worker's completion with attempt %d "
					  "was refused (ID003: the attempt is the fencing token); the runner reads this from the record, "
					  "as the protocol has no point after handled.", attempt, a1);
		}
		else
		{
			copy_str(suffix, sizeof(suffix), "late completion no answer");
			case_note(s->cr, "After the slow worker went on and the workers stopped, the record is %s #%d.",
					  status, attempt);
		}
	}
	observe(s, suffix);
}

static bool
pred_released(signoff_state *s, const void *arg)
{
	char		status[32];
	int			attempt = 0;

	(void) arg;
	return record_row(s, s->keys[0], status, sizeof(status), &attempt) &&
		strcmp(status, "released") == 0;
}

/* 10: "fail" at claimed: the helper releases; the next delivery runs */
static void
sc_10(signoff_state *s)
{
	exch	   *x;
	int			di;

	arm_point(s, 0, "claimed");
	if (!start_workers(s, 1) || !enqueue(s, 0, JF_ENQUEUE) ||
		(x = wait_held(s, 0, "claimed")) == NULL)
		goto out;
	di = x->delivery;
	if (di >= 0)
		s->d[di].failed = true;
	answer(s, x, "fail");
	if (wait_for(s, pred_released, NULL, true, s->job->timeout_s) == WAIT_OK)
	{
		if (di >= 0)
			copy_str(s->d[di].after, sizeof(s->d[di].after), "released");
		case_note(s->cr, "Answered fail at claimed: the helper released the claim (the record says released).");
	}
	else
	{
		if (di >= 0)
			copy_str(s->d[di].after, sizeof(s->d[di].after), "not released");
		case_fail(s->cr, "answered fail at claimed, but the record of %s was not released within %g s",
				  s->keys[0], s->job->timeout_s);
	}
	if (enqueue(s, 0, JF_ENQUEUE))
		settle(s);
out:
	stop_workers(s);
	observe(s, NULL);
}

/* 11: after completion, the key with other arguments: refused, ID002 */
static void
sc_11(signoff_state *s)
{
	int			i;

	if (!start_workers(s, 1) || !enqueue(s, 0, JF_ENQUEUE) || !settle(s) ||
		!enqueue(s, 0, JF_ENQUEUE_OTHER) || (i = wait_nth(s, 0, 2)) < 0)
		goto out;
	if (!s->d[i].runs)
		case_note(s->cr, "The message with other arguments was judged %s%s%s.", s->d[i].verdict,
				  s->d[i].sqlstate[0] ? " " : "", s->d[i].sqlstate);
	if (settle(s) && enqueue(s, 0, JF_ENQUEUE))
		settle(s);
out:
	stop_workers(s);
	observe(s, NULL);
}

/*
 * 12: a long job: held at claimed (inside the heartbeat) for two leases,
 * watched on the database; stale_claims() must never list it, and the same
 * message again is in_progress. A helper without a heartbeat fails it: a
 * job longer than its lease would be taken for a dead one.
 */
static void
sc_12(signoff_state *s)
{
	exch	   *x;
	int			di;
	int			listed = 0;
	int			polls = 0;
	bool		reached = false;
	double		t0;
	const char *params[2];

	arm_point(s, 0, "claimed");
	if (!start_workers(s, 2) || !enqueue(s, 0, JF_ENQUEUE) ||
		(x = wait_held(s, 0, "claimed")) == NULL)
		goto out;
	di = x->delivery;
	if (!x->heartbeat)
	{
		if (di >= 0)
			copy_str(s->d[di].mark, sizeof(s->d[di].mark), "no heartbeat");
		case_fail(s->cr, "the helper reported heartbeat false at claimed: it does not extend the lease while the handler runs, "
				  "so a job longer than the lease would be treated as dead; give the handler a heartbeat, "
				  "or leave case 12 out (--cases) if every run of the job is much shorter than its lease");
		answer(s, x, "continue");
		settle(s);
		goto out;
	}
	if (di >= 0)
		copy_str(s->d[di].mark, sizeof(s->d[di].mark), "heartbeats");
	params[0] = s->job_type;
	params[1] = s->keys[0];
	t0 = now_seconds();
	progress(s->ctx, "%s case 12: a long job heartbeats past its lease", policy_names[s->policy]);
	for (;;)
	{
		PGresult   *res;
		bool		done;
		int			stale;

		res = db_exec(s->ctx,
					  "SELECT pg_catalog.clock_timestamp() OPERATOR(pg_catalog.>=) "
					  "       (o.claimed_at OPERATOR(pg_catalog.+) (jt.lease OPERATOR(pg_catalog.*) 2)) "
					  "FROM idempotency.operations o "
					  "JOIN idempotency.job_types jt ON jt.job_type OPERATOR(pg_catalog.=) o.job_type "
					  "WHERE o.job_type OPERATOR(pg_catalog.=) $1 "
					  "  AND o.operation_key OPERATOR(pg_catalog.=) $2",
					  2, params);
		if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
		{
			case_fail(s->cr, "cannot watch the claim: %s", case_sql_error(res, s->ctx));
			PQclear(res);
			break;
		}
		polls++;
		done = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
		PQclear(res);
		stale = stale_listed(s->ctx, s->cr, s->job_type, s->keys[0]);
		if (stale < 0)
			break;
		listed += stale;
		if (done)
		{
			reached = true;
			break;
		}
		if (x->state == X_GONE)
		{
			case_fail(s->cr, "the worker at claimed (pid %ld) ended while it was held", x->pid);
			break;
		}
		if (matrix_interrupted || now_seconds() - t0 > s->job->lease_s * 2 + s->job->timeout_s)
		{
			case_fail(s->cr, "the job never reached two leases");
			break;
		}
		pump(s, POLL_MS);
	}
	if (reached && enqueue(s, 0, JF_ENQUEUE) && wait_nth(s, 0, 2) >= 0)
	{
		if (stale_listed(s->ctx, s->cr, s->job_type, s->keys[0]) == 1)
			listed++;
		case_note(s->cr, "pid %ld stood at claimed, its heartbeat running, for two leases (%.1f s); then the same message came again.",
				  x->pid, now_seconds() - t0);
	}
	if (listed)
		case_fail(s->cr, "stale_claims() listed the heartbeating claim %d times", listed);
	else if (reached)
		case_note(s->cr, "stale_claims() never listed it (%d polls).", polls + 1);
	answer(s, x, "continue");
	settle(s);
out:
	stop_workers(s);
	observe(s, NULL);
}

/*
 * 13: the queue lost the message: killed at claimed, and nothing delivers
 * it again. stale_claims() must not list it inside the lease, and must list
 * it (attempt 1, the policy, expired) once the lease ran out.
 */
static void
sc_13(signoff_state *s)
{
	exch	   *x;
	int			early;
	char		suffix[64] = "";
	PGresult   *res;

	arm_point(s, 0, "claimed");
	if (!start_workers(s, 1) || !enqueue(s, 0, JF_ENQUEUE) ||
		(x = wait_held(s, 0, "claimed")) == NULL ||
		!kill_at(s, x, "after its claim; its message is lost, nothing delivers it again"))
		goto out;
	early = stale_listed(s->ctx, s->cr, s->job_type, s->keys[0]);
	if (early == 1)
		case_fail(s->cr, "stale_claims() listed the claim inside its lease");
	else if (early == 0)
		case_note(s->cr, "Inside the lease stale_claims() does not list it.");
	if (!wait_stale_checked(s, 0))
	{
		copy_str(suffix, sizeof(suffix), "not listed");
		goto out;
	}
	res = stale_claim_query(s->ctx, s->job_type, s->keys[0]);
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
	{
		bool		ok = atoi(PQgetvalue(res, 0, 0)) == 1 &&
			strcmp(PQgetvalue(res, 0, 2), policy_names[s->policy]) == 0 &&
			strcmp(PQgetvalue(res, 0, 4), "t") == 0;

		copy_str(suffix, sizeof(suffix), ok ? "listed by stale_claims()" : "listed wrongly");
		if (ok)
			case_note(s->cr, "stale_claims() lists it with attempt 1, claimed_by %s, policy %s, stale for %s.",
					  PQgetvalue(res, 0, 1), policy_names[s->policy], PQgetvalue(res, 0, 3));
		else
			case_fail(s->cr, "stale_claims() row: attempt %s, claimed_by %s, policy %s, expired in the past: %s",
					  PQgetvalue(res, 0, 0), PQgetvalue(res, 0, 1), PQgetvalue(res, 0, 2),
					  PQgetvalue(res, 0, 4));
	}
	else
	{
		copy_str(suffix, sizeof(suffix), "not listed");
		case_fail(s->cr, "stale_claims(): %s", case_sql_error(res, s->ctx));
	}
	PQclear(res);
out:
	stop_workers(s);
	observe(s, suffix);
}

/* ---------------------------------------------------------------------
 * The run
 * --------------------------------------------------------------------- */

static void
print_banner(signoff_state *s)
{
	matrix_ctx *ctx = s->ctx;
	const signoff_job *job = s->job;

	printf("%sSign-off run%s: job type %s on %s, idempotency %s on PostgreSQL %s\n",
		   ctx->color ? "\033[1m" : "", ctx->color ? "\033[0m" : "",
		   job->value[JF_JOB_TYPE], job->value[JF_QUEUE], ctx->ext_version, ctx->server_version);
	printf("job file %s; commands run in %s\n", job->path, job->dir);
	printf("worker: %s\n", job->value[JF_WORKER]);
	printf("enqueue: %s\n", job->value[JF_ENQUEUE]);
	if (job->value[JF_ENQUEUE_OTHER])
		printf("enqueue_other: %s\n", job->value[JF_ENQUEUE_OTHER]);
	if (job->value[JF_EFFECTS])
		printf("effects: the command %s\n", job->value[JF_EFFECTS]);
	else if (job->value[JF_EFFECTS_SQL])
		printf("effects: the query %s\n", job->value[JF_EFFECTS_SQL]);
	else
		printf("effects: the handled reports (handler runs that returned; not proof that an effect landed)\n");
	printf("server %s; lease %s; timeout %g s; runner idempotency-matrix %s; %s\n",
		   ctx->server_desc, ctx->lease_sql, job->timeout_s, MATRIX_VERSION, ctx->started_at);
	printf("job types %s_<policy>, keys signoff-%s-<policy>-<case>-<n>, worker logs in %s\n",
		   ctx->prefix, ctx->run_id, ctx->signoff_dir);
	fflush(stdout);
}

int
signoff_run(matrix_ctx *ctx, const signoff_job *job, const bool *want, int check_as,
			const char *html, const char *json)
{
	static const case_words effect_words = {"effect", "key"};
	static const case_words seed_words = {"email", "order ORD-1002"};
	const case_words *words = job->reference ? &seed_words : &effect_words;
	static signoff_state st;
	signoff_state *s = &st;
	struct sockaddr_un addr;
	const char *tmp = getenv("TMPDIR");
	policy_result *prs;
	int			npr = 0;
	int			p,
				k;
	int			total = 0,
				done = 0;
	double		t0;

	memset(s, 0, sizeof(*s));
	s->ctx = ctx;
	s->job = job;
	s->lfd = -1;
	live_state = s;

	/* the groups' orphans become ours, so that they are reaped and counted */
	prctl(PR_SET_CHILD_SUBREAPER, 1);

	snprintf(ctx->signoff_dir, sizeof(ctx->signoff_dir), "%s/idempotency-signoff.XXXXXX",
			 tmp && *tmp ? tmp : "/tmp");
	if (mkdtemp(ctx->signoff_dir) == NULL)
	{
		fprintf(stderr, "idempotency-matrix: cannot create a directory %s: %s\n",
				ctx->signoff_dir, strerror(errno));
		ctx->signoff_dir[0] = '\0';
		return 2;
	}
	snprintf(s->sock, sizeof(s->sock), "%s/signoff.sock", ctx->signoff_dir);
	snprintf(s->cmd_out, sizeof(s->cmd_out), "%s/command.out", ctx->signoff_dir);
	snprintf(s->cmd_err, sizeof(s->cmd_err), "%s/command.err", ctx->signoff_dir);
	memset(&addr, 0, sizeof(addr));
	addr.sun_family = AF_UNIX;
	if (strlen(s->sock) >= sizeof(addr.sun_path))
	{
		fprintf(stderr, "idempotency-matrix: the socket path %s is too long for a Unix socket: set TMPDIR to a shorter directory\n",
				s->sock);
		return 2;
	}
	copy_str(addr.sun_path, sizeof(addr.sun_path), s->sock);
	s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *) &addr, sizeof(addr)) != 0 ||
		listen(s->lfd, 64) != 0)
	{
		fprintf(stderr, "idempotency-matrix: cannot listen on %s: %s\n", s->sock, strerror(errno));
		return 2;
	}

	if (!job->reference)
		print_banner(s);		/* the reference run printed its own */
	for (p = 0; p < N_POLICIES; p++)
		if (want[p])
			total += signoff_count_cases(ctx->cases, s->job);
	prs = calloc(N_POLICIES, sizeof(policy_result));
	t0 = now_seconds();
	for (p = 0; p < N_POLICIES && !matrix_interrupted; p++)
	{
		policy_result *pr;
		double		tp = now_seconds();
		char		err[600] = "";
		bool		registered = false;

		if (!want[p])
			continue;
		pr = &prs[npr++];
		pr->policy = (policy_t) p;
		pr->checked_as = check_as >= 0 ? (policy_t) check_as : (policy_t) p;
		s->policy = (policy_t) p;
		if (!job->reference)
		{
			/* a job type per policy; the keys name policy and case */
			snprintf(s->job_type, sizeof(s->job_type), "%s_%s", ctx->prefix, policy_names[p]);
			snprintf(s->map, sizeof(s->map), "%s=%s", s->job->value[JF_JOB_TYPE], s->job_type);
			registered = job_type_register(s->ctx, s->job_type, s->policy, err, sizeof(err));
		}
		for (k = 0; k < n_case_table && !matrix_interrupted; k++)
		{
			const case_spec *c = &case_table[k];
			case_result *cr;
			double		tc;
			int			ki;

			if (!signoff_case_wanted(ctx->cases, s->job, c))
				continue;
			cr = &pr->cases[pr->ncases++];
			case_expectations(c, pr->checked_as, words, job->stress, ctx->utf8, cr);
			if (job->reference)
			{
				/* the seed's keys, in a job type per case */
				snprintf(s->job_type, sizeof(s->job_type), "%s_%s_%s", ctx->prefix, policy_names[p], c->id);
				snprintf(s->map, sizeof(s->map), "%s=%s", s->job->value[JF_JOB_TYPE], s->job_type);
				registered = job_type_register(s->ctx, s->job_type, s->policy, err, sizeof(err));
			}
			progress(ctx, "[%d/%d] policy %s, case %s: %s", ++done, total,
					 policy_names[p], cr->id, cr->title);
			tc = now_seconds();
			if (!registered)
			{
				cr->ran = true;
				case_fail(cr, "%s", err);
				case_finish(cr);
				continue;
			}
			if (s->not_armed)
			{
				case_note(cr, "Not run: in an earlier case no point at all reached the runner (see it), and every case would wait as long.");
				case_finish(cr);
				continue;
			}
			/* the case's own keys, workers and deliveries */
			s->cr = cr;
			s->case_id = cr->id;
			s->nkeys = c->nkeys;
			s->nworkers = 0;
			s->record_early[0] = '\0';
			memset(s->arms, 0, sizeof(s->arms));
			for (ki = 0; ki < s->nkeys; ki++)
			{
				if (job->reference)
					snprintf(s->keys[ki], KEYSZ, "ORD-%d", 1001 + ki);
				else
					snprintf(s->keys[ki], KEYSZ, "signoff-%s-%s-%s-%d", ctx->run_id,
							 policy_names[p], cr->id, ki + 1);
				s->enqueued[ki] = 0;
			}
			case_first_delivery = s->nd;
			cr->ran = true;
			steps_of(c->id) (s);
			/* nothing of the case outlives it */
			stop_workers(s);
			for (ki = 0; ki < s->nworkers; ki++)
				forget_proc(s->workers[ki]);
			s->nworkers = 0;
			cr->seconds = now_seconds() - tc;
			case_finish(cr);
			s->cr = NULL;
			s->nkeys = 0;
		}
		pr->seconds = now_seconds() - tp;
		progress_clear(ctx);
		report_policy(ctx, pr);
	}
	ctx->seconds = now_seconds() - t0;
	progress_clear(ctx);
	if (matrix_interrupted)
	{
		free(prs);
		return 130;
	}
	return report_all(ctx, prs, npr, html, json);
}
