/*
 * effect.c
 *		The run's own effect endpoints: an HTTP and an SMTP provider that a
 *		job file asks for with `effect = http` or `effect = smtp`.
 *
 * A real provider is where the most common defects of a job hide: the
 * error it swallows, the call it makes without a timeout, the refusal it
 * retries for ever. The run cannot make a user's provider fail on cue, so
 * it offers one of its own. The endpoint counts the effects itself (a
 * request belongs to the key that appears in it: a header such as
 * Idempotency-Key, the path, the query or the body; the longest of the
 * run's keys and their operation keys that appears wins) and answers each
 * key as the case set it: accepted, refused for now (HTTP 503, SMTP 451),
 * refused for good (422, 550), accepted with no answer at all, or accepted
 * and answered late. A GET (HTTP) looks the key up: 200 with the count
 * when it has an effect, 404 when not, so a job's lookup policy has a
 * provider to ask.
 *
 * It is a process of its own (forked before any worker starts, killed when
 * the runner ends, and by the kernel when the runner dies: PDEATHSIG), so
 * that it answers while the runner waits on the database or a command. The
 * runner talks to it over a socket pair, a line each way (effect_* below);
 * nothing else reaches it but 127.0.0.1.
 */
#include "postgres_fe.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "effect.h"
#include "util.h"

const char *const effect_kind_names[] = {"none", "http", "smtp"};

#define MAX_CONNS 128
#define MAX_REQUEST (256 * 1024)
#define NAME_SZ 200

/* the runner's side */
static pid_t server_pid = -1;
static int	ctl_fd = -1;

/* ---------------------------------------------------------------------
 * The server (the child)
 * --------------------------------------------------------------------- */

typedef struct ekey
{
	char		name[NAME_SZ];	/* the run's key */
	char		alias[NAME_SZ];	/* the operation key, if it does not contain it */
	effect_fault fault;
	int			times;			/* requests the fault applies to; -1: all */
	int			delay_ms;		/* FAULT_SLOW */
	int			effects;
	int			requests;
	int			refusals;
	int			lookups;
	double		closed_after;
	int			keyed;			/* HTTP requests whose Idempotency-Key header named the key */
	int			bare;			/* later ones that named it elsewhere, without that header */
} ekey;

typedef struct econn
{
	int			fd;
	bool		smtp;
	StringInfoData in;
	bool		in_data;		/* SMTP: between DATA and the dot */
	StringInfoData envelope;		/* SMTP: MAIL and RCPT lines, for the key */
	int			key;			/* its request's key, or -1 */
	bool		open;			/* accepted, not answered: hung or slow */
	bool		hung;
	double		since;			/* when the open request came */
	double		answer_at;		/* slow: when to answer; 0 none */
	char		reply[300];
} econn;

static ekey *keys;
static int	nkeys,
			capkeys;
static econn conns[MAX_CONNS];
static int	nconns;
static int	unmatched;
static char unmatched_first[200];
static int	lfd = -1;
static bool smtp_kind;
static struct sockaddr_in laddr;

static int
key_index(const char *name, bool add)
{
	int			i;

	for (i = 0; i < nkeys; i++)
		if (strcmp(keys[i].name, name) == 0)
			return i;
	if (!add)
		return -1;
	if (nkeys == capkeys)
	{
		capkeys = capkeys ? capkeys * 2 : 64;
		keys = pg_realloc_array(keys, ekey, capkeys);
	}
	memset(&keys[nkeys], 0, sizeof(ekey));
	copy_str(keys[nkeys].name, NAME_SZ, name);
	keys[nkeys].closed_after = -1;
	return nkeys++;
}

/* the key a request names: the longest name or alias found in it */
static int
match_key(const char *text)
{
	int			best = -1;
	size_t		best_len = 0;
	int			i;

	for (i = 0; i < nkeys; i++)
	{
		size_t		n = strlen(keys[i].name);
		size_t		a = strlen(keys[i].alias);

		if (n > best_len && strstr(text, keys[i].name))
			best = i, best_len = n;
		if (a > best_len && strstr(text, keys[i].alias))
			best = i, best_len = a;
	}
	return best;
}

static void
send_all(int fd, const char *s, size_t n)
{
	while (n > 0)
	{
		ssize_t		w = send(fd, s, n, MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		s += w;
		n -= (size_t) w;
	}
}

static void
conn_close(int i)
{
	econn	   *c = &conns[i];

	/* an open request the client closed: it gave up waiting (its timeout) */
	if (c->open && c->key >= 0 && keys[c->key].closed_after < 0)
		keys[c->key].closed_after = now_seconds() - c->since;
	close(c->fd);
	pfree(c->in.data);
	pfree(c->envelope.data);
	conns[i] = conns[--nconns];
}

static void
listen_on(void)
{
	int			one = 1;

	if (lfd >= 0)
		return;
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (lfd < 0)
		return;
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(lfd, (struct sockaddr *) &laddr, sizeof(laddr)) != 0 || listen(lfd, 64) != 0)
	{
		close(lfd);
		lfd = -1;
	}
}

/*
 * A request of key k (or of none, -1) arrived: what to do with it. Returns
 * the reply; "" for none (hung, or slow: answered later, from c->reply).
 */
static const char *
decide(econn *c, int k, const char *ok, const char *transient, const char *permanent)
{
	ekey	   *e = k >= 0 ? &keys[k] : NULL;
	effect_fault f = FAULT_NONE;

	c->key = k;
	if (e == NULL)
	{
		unmatched++;
		return ok;
	}
	e->requests++;
	if (e->fault != FAULT_NONE && e->times != 0)
	{
		f = e->fault;
		if (e->times > 0)
			e->times--;
	}
	switch (f)
	{
		case FAULT_TRANSIENT:
			e->refusals++;
			return transient;
		case FAULT_PERMANENT:
			e->refusals++;
			return permanent;
		case FAULT_HANG:
			e->effects++;
			c->open = c->hung = true;
			c->since = now_seconds();
			return "";
		case FAULT_SLOW:
			e->effects++;
			c->open = true;
			c->since = now_seconds();
			c->answer_at = c->since + e->delay_ms / 1000.0;
			copy_str(c->reply, sizeof(c->reply), ok);
			return "";
		case FAULT_NONE:
			break;
	}
	e->effects++;
	return ok;
}

static void
note_unmatched(const char *text)
{
	if (unmatched_first[0] == '\0')
	{
		size_t		n = strcspn(text, "\r\n");

		snprintf(unmatched_first, sizeof(unmatched_first), "%.*s", (int) (n > 150 ? 150 : n), text);
	}
}

static char http_ok[300],
			http_503[300],
			http_422[300];

static void
http_answer(char *out, size_t sz, const char *status, const char *body)
{
	snprintf(out, sz, "HTTP/1.1 %s\r\nContent-Type: application/json\r\nConnection: close\r\n"
			 "Content-Length: %zu\r\n\r\n%s", status, strlen(body), body);
}

/* an HTTP request, once complete; false: not complete yet */
static bool
http_request(econn *c)
{
	char	   *text = c->in.data;
	char	   *hdr_end = strstr(text, "\r\n\r\n");
	const char *cl;
	size_t		head,
				body = 0;
	char		method[16] = "";
	char		reply[400];
	const char *r;
	int			k;

	if (hdr_end == NULL)
		return false;
	head = (size_t) (hdr_end - text) + 4;
	cl = strcasestr(text, "\r\ncontent-length:");
	if (cl && cl < hdr_end)
		body = strtoul(cl + 17, NULL, 10);
	else if ((cl = strcasestr(text, "\r\ntransfer-encoding:")) && cl < hdr_end &&
			 strcasestr(cl, "chunked") && strcasestr(cl, "chunked") < hdr_end)
	{
		if (strstr(hdr_end + 4, "0\r\n\r\n") == NULL)
			return false;
		body = (size_t) c->in.len - head;
	}
	if ((size_t) c->in.len < head + body)
		return false;
	sscanf(text, "%15s", method);
	k = match_key(text);
	if (k >= 0 && strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
	{
		/* the Idempotency-Key header: did it name the key? (a retry without it cannot be deduplicated) */
		const char *h = strcasestr(text, "\r\nidempotency-key:");
		char		value[NAME_SZ] = "";

		if (h && h < hdr_end)
		{
			h += 18;
			h += strspn(h, " \t");
			snprintf(value, sizeof(value), "%.*s", (int) strcspn(h, "\r\n"), h);
		}
		if (value[0] && (strstr(value, keys[k].name) || (keys[k].alias[0] && strstr(value, keys[k].alias))))
			keys[k].keyed++;
		else if (keys[k].keyed > 0)
			keys[k].bare++;
	}
	if (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0)
	{
		/* a lookup: is there an effect of the key? */
		int			n = k >= 0 ? keys[k].effects : 0;
		char		body[40];

		if (k >= 0)
			keys[k].lookups++;
		snprintf(body, sizeof(body), "{\"effects\":%d}", n);
		http_answer(reply, sizeof(reply), n > 0 ? "200 OK" : "404 Not Found", body);
		send_all(c->fd, reply, strlen(reply));
		return true;
	}
	if (k < 0)
		note_unmatched(text);
	if (http_ok[0] == '\0')
	{
		http_answer(http_ok, sizeof(http_ok), "200 OK", "{\"status\":\"accepted\"}");
		http_answer(http_503, sizeof(http_503), "503 Service Unavailable", "{\"error\":\"try again shortly\"}");
		http_answer(http_422, sizeof(http_422), "422 Unprocessable Entity", "{\"error\":\"refused for good\"}");
	}
	r = decide(c, k, http_ok, http_503, http_422);
	if (*r)
		send_all(c->fd, r, strlen(r));
	return true;
}

/* SMTP: the lines that arrived; false: close the connection */
static bool
smtp_lines(econn *c)
{
	for (;;)
	{
		char	   *text = c->in.data;
		char	   *eol = strstr(text, "\n");
		size_t		n;
		char		line[1024];

		if (c->open)
			return true;		/* no answer yet to the message in hand */
		if (c->in_data)
		{
			char	   *dot = strstr(text, "\r\n.\r\n");
			const char *r;
			int			k;

			if (dot == NULL && strncmp(text, ".\r\n", 3) != 0)
				return true;
			if (dot)
				dot[2] = '\0';
			else
				text[0] = '\0';
			appendStringInfoString(&c->envelope, "\n");
			appendStringInfoString(&c->envelope, text);
			k = match_key(c->envelope.data);
			if (k < 0)
				note_unmatched(c->envelope.data);
			r = decide(c, k, "250 2.0.0 accepted\r\n", "451 4.3.0 try again later\r\n",
					   "550 5.7.1 refused for good\r\n");
			if (*r)
				send_all(c->fd, r, strlen(r));
			c->in_data = false;
			resetStringInfo(&c->envelope);
			n = dot ? (size_t) (dot - text) + 5 : 3;
			memmove(c->in.data, c->in.data + n, c->in.len - n);
			c->in.len -= n;
			c->in.data[c->in.len] = '\0';
			continue;
		}
		if (eol == NULL)
			return c->in.len < 4096;
		n = (size_t) (eol - text) + 1;
		snprintf(line, sizeof(line), "%.*s", (int) (n > 1000 ? 1000 : n), text);
		memmove(c->in.data, c->in.data + n, c->in.len - n);
		c->in.len -= n;
		c->in.data[c->in.len] = '\0';
		trim(line);
		if (strncasecmp(line, "EHLO", 4) == 0)
			send_all(c->fd, "250-idempotency-matrix\r\n250 8BITMIME\r\n", 38);
		else if (strncasecmp(line, "HELO", 4) == 0 || strncasecmp(line, "NOOP", 4) == 0)
			send_all(c->fd, "250 ok\r\n", 8);
		else if (strncasecmp(line, "MAIL", 4) == 0 || strncasecmp(line, "RCPT", 4) == 0)
		{
			appendStringInfoString(&c->envelope, line);
			appendStringInfoString(&c->envelope, "\n");
			send_all(c->fd, "250 ok\r\n", 8);
		}
		else if (strncasecmp(line, "RSET", 4) == 0)
		{
			resetStringInfo(&c->envelope);
			send_all(c->fd, "250 ok\r\n", 8);
		}
		else if (strncasecmp(line, "DATA", 4) == 0)
		{
			c->in_data = true;
			send_all(c->fd, "354 end with <CRLF>.<CRLF>\r\n", 28);
		}
		else if (strncasecmp(line, "QUIT", 4) == 0)
		{
			send_all(c->fd, "221 bye\r\n", 9);
			return false;
		}
		else
			send_all(c->fd, "502 5.5.2 not implemented\r\n", 27);
	}
}

/* one line from the runner; the answer written back */
static void
control(const char *line, int fd)
{
	char		cmd[16] = "",
				a[NAME_SZ] = "",
				b[NAME_SZ] = "";
	int			x = 0,
				y = 0;
	char		out[400];
	int			k,
				i;

	sscanf(line, "%15s %199s %199s %d %d", cmd, a, b, &x, &y);
	snprintf(out, sizeof(out), "ok\n");
	if (strcmp(cmd, "key") == 0)
	{
		k = key_index(a, true);
		if (b[0] && strcmp(b, "-") != 0 && strstr(b, a) == NULL)
			copy_str(keys[k].alias, NAME_SZ, b);
	}
	else if (strcmp(cmd, "fault") == 0)
	{
		k = key_index(a, true);
		keys[k].fault = (effect_fault) atoi(b);
		keys[k].times = x;
		keys[k].delay_ms = y;
	}
	else if (strcmp(cmd, "listen") == 0)
	{
		if (strcmp(a, "on") == 0)
			listen_on();
		else if (lfd >= 0)
		{
			close(lfd);
			lfd = -1;
		}
	}
	else if (strcmp(cmd, "count") == 0)
	{
		int			open = 0;
		double		oldest = 0,
					now = now_seconds();

		k = key_index(a, false);
		for (i = 0; k >= 0 && i < nconns; i++)
			if (conns[i].open && conns[i].key == k)
			{
				open++;
				if (now - conns[i].since > oldest)
					oldest = now - conns[i].since;
			}
		if (k < 0)
			snprintf(out, sizeof(out), "ok 0 0 0 0 0 0 -1 0 0\n");
		else
			snprintf(out, sizeof(out), "ok %d %d %d %d %d %.3f %.3f %d %d\n", keys[k].effects, keys[k].requests,
					 keys[k].refusals, keys[k].lookups, open, oldest, keys[k].closed_after, keys[k].keyed,
					 keys[k].bare);
	}
	else if (strcmp(cmd, "release") == 0)
	{
		int			n = 0;

		for (i = nconns - 1; i >= 0; i--)
			if (conns[i].hung)
			{
				/* the run let it go: not the client's own timeout */
				conns[i].hung = conns[i].open = false;
				conn_close(i);
				n++;
			}
		snprintf(out, sizeof(out), "ok %d\n", n);
	}
	else if (strcmp(cmd, "answer") == 0)
	{
		/* a slow request of the key: answered now */
		int			n = 0;

		k = key_index(a, false);
		for (i = 0; k >= 0 && i < nconns; i++)
			if (conns[i].key == k && conns[i].answer_at > 0)
			{
				conns[i].answer_at = now_seconds();
				n++;
			}
		snprintf(out, sizeof(out), "ok %d\n", n);
	}
	else if (strcmp(cmd, "unmatched") == 0)
		snprintf(out, sizeof(out), "ok %d %s\n", unmatched, unmatched_first);
	else
		snprintf(out, sizeof(out), "error unknown command\n");
	send_all(fd, out, strlen(out));
}

static void
serve(int ctl)
{
	StringInfoData cin;

	initStringInfo(&cin);
	for (;;)
	{
		struct pollfd pfd[MAX_CONNS + 2];
		int			n = 0,
					i,
					ms = 1000;
		double		now = now_seconds();

		pfd[n].fd = ctl;
		pfd[n++].events = POLLIN;
		if (lfd >= 0 && nconns < MAX_CONNS)
		{
			pfd[n].fd = lfd;
			pfd[n++].events = POLLIN;
		}
		for (i = 0; i < nconns; i++)
		{
			pfd[n].fd = conns[i].fd;
			pfd[n++].events = POLLIN;
			if (conns[i].answer_at > 0)
			{
				int			due = (int) ((conns[i].answer_at - now) * 1000) + 1;

				if (due < ms)
					ms = due < 0 ? 0 : due;
			}
		}
		if (poll(pfd, (nfds_t) n, ms) < 0 && errno != EINTR)
			_exit(3);
		now = now_seconds();

		/* slow answers that are due */
		for (i = nconns - 1; i >= 0; i--)
			if (conns[i].answer_at > 0 && now >= conns[i].answer_at)
			{
				conns[i].answer_at = 0;
				conns[i].open = false;
				send_all(conns[i].fd, conns[i].reply, strlen(conns[i].reply));
				if (!conns[i].smtp)
					conn_close(i);
			}

		/* the runner */
		if (pfd[0].revents)
		{
			char		buf[1024];
			ssize_t		r = read(ctl, buf, sizeof(buf));
			char	   *nl;

			if (r <= 0)
				_exit(0);		/* the runner is gone */
			appendBinaryStringInfo(&cin, buf, (size_t) r);
			while ((nl = strchr(cin.data, '\n')) != NULL)
			{
				size_t		len = (size_t) (nl - cin.data) + 1;

				*nl = '\0';
				control(cin.data, ctl);
				memmove(cin.data, cin.data + len, cin.len - len);
				cin.len -= len;
				cin.data[cin.len] = '\0';
			}
		}

		/* a new connection */
		if (lfd >= 0 && n > 1 && pfd[1].fd == lfd && (pfd[1].revents & POLLIN))
		{
			int			fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

			if (fd >= 0)
			{
				econn	   *c = &conns[nconns++];

				memset(c, 0, sizeof(*c));
				c->fd = fd;
				c->smtp = smtp_kind;
				c->key = -1;
				initStringInfo(&c->in);
				initStringInfo(&c->envelope);
				resetStringInfo(&c->in);
				resetStringInfo(&c->envelope);
				if (c->smtp)
					send_all(fd, "220 idempotency-matrix ESMTP\r\n", 30);
			}
		}

		/* what the connections sent (from the end: a close moves the last one) */
		for (i = nconns - 1; i >= 0; i--)
		{
			econn	   *c = &conns[i];
			int			j;
			char		buf[8192];
			ssize_t		r;

			for (j = 0; j < n; j++)
				if (pfd[j].fd == c->fd)
					break;
			if (j == n || pfd[j].revents == 0 || j == 0 || (lfd >= 0 && pfd[j].fd == lfd))
				continue;
			r = recv(c->fd, buf, sizeof(buf), 0);
			if (r <= 0)
			{
				conn_close(i);
				continue;
			}
			if (c->open && !c->smtp)
				continue;		/* an HTTP request waiting for its answer: more is noise */
			appendBinaryStringInfo(&c->in, buf, (size_t) r);
			if (c->in.len > MAX_REQUEST)
			{
				conn_close(i);
				continue;
			}
			if (c->smtp)
			{
				if (!smtp_lines(c))
					conn_close(i);
			}
			else if (http_request(c) && !c->open)
				conn_close(i);
		}
	}
}

/* ---------------------------------------------------------------------
 * The runner's side
 * --------------------------------------------------------------------- */

/*
 * Start the endpoint of the kind on 127.0.0.1 (a port the kernel picks);
 * addr gets what the workers are given: "http://127.0.0.1:PORT" or
 * "127.0.0.1:PORT". False: why says why.
 */
bool
effect_start(effect_kind kind, char *addr, size_t asz, char *why, size_t wsz)
{
	int			sv[2];
	socklen_t	len = sizeof(laddr);
	pid_t		parent = getpid();

	memset(&laddr, 0, sizeof(laddr));
	laddr.sin_family = AF_INET;
	laddr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	laddr.sin_port = 0;
	listen_on();
	if (lfd < 0 || getsockname(lfd, (struct sockaddr *) &laddr, &len) != 0)
	{
		snprintf(why, wsz, "cannot listen on 127.0.0.1: %s", strerror(errno));
		return false;
	}
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
	{
		snprintf(why, wsz, "socketpair: %s", strerror(errno));
		return false;
	}
	smtp_kind = kind == EFFECT_SMTP;
	fflush(stdout);
	fflush(stderr);
	server_pid = fork();
	if (server_pid < 0)
	{
		snprintf(why, wsz, "fork: %s", strerror(errno));
		return false;
	}
	if (server_pid == 0)
	{
		int			fd;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(0);
		signal(SIGINT, SIG_IGN);	/* the runner ends it, after Ctrl-C too */
		signal(SIGTERM, SIG_DFL);
		signal(SIGPIPE, SIG_IGN);
		/* nothing of the runner's: its database connection, its socket */
		for (fd = 3; fd < 1024; fd++)
			if (fd != sv[1] && fd != lfd)
				close(fd);
		serve(sv[1]);
		_exit(0);
	}
	close(sv[1]);
	close(lfd);					/* the child's now */
	lfd = -1;
	ctl_fd = sv[0];
	if (kind == EFFECT_HTTP)
		snprintf(addr, asz, "http://127.0.0.1:%d", ntohs(laddr.sin_port));
	else
		snprintf(addr, asz, "127.0.0.1:%d", ntohs(laddr.sin_port));
	return true;
}

void
effect_stop(void)
{
	if (server_pid > 0)
	{
		kill(server_pid, SIGKILL);
		waitpid(server_pid, NULL, 0);
		server_pid = -1;
	}
	if (ctl_fd >= 0)
		close(ctl_fd);
	ctl_fd = -1;
}

/* one line to the endpoint, its answer into out; false: it is gone */
static bool
ask(const char *line, char *out, size_t sz)
{
	size_t		n = 0;
	double		t0 = now_seconds();

	if (ctl_fd < 0)
		return false;
	send_all(ctl_fd, line, strlen(line));
	while (n + 1 < sz)
	{
		struct pollfd p = {ctl_fd, POLLIN, 0};
		ssize_t		r;

		if (poll(&p, 1, 1000) <= 0)
		{
			if (now_seconds() - t0 > 10)
				return false;
			continue;
		}
		r = read(ctl_fd, out + n, 1);
		if (r <= 0)
			return false;
		if (out[n] == '\n')
			break;
		n++;
	}
	out[n] = '\0';
	return strncmp(out, "ok", 2) == 0;
}

/* the run's key, and the operation key the worker claims it under */
bool
effect_key(const char *key, const char *alias)
{
	char		line[2 * NAME_SZ + 16];
	char		out[64];

	snprintf(line, sizeof(line), "key %s %s\n", key, alias && *alias ? alias : "-");
	return ask(line, out, sizeof(out));
}

/* the key's next `times` requests (-1: all) get the fault */
bool
effect_set_fault(const char *key, effect_fault fault, int times, int delay_ms)
{
	char		line[NAME_SZ + 64];
	char		out[64];

	snprintf(line, sizeof(line), "fault %s %d %d %d\n", key, (int) fault, times, delay_ms);
	return ask(line, out, sizeof(out));
}

/* on: connections are accepted; off: refused (nothing listens on the port) */
bool
effect_listen(bool on)
{
	char		out[64];

	return ask(on ? "listen on\n" : "listen off\n", out, sizeof(out));
}

bool
effect_stats_of(const char *key, effect_stats *st)
{
	char		line[NAME_SZ + 16];
	char		out[200];

	memset(st, 0, sizeof(*st));
	st->closed_after = -1;
	snprintf(line, sizeof(line), "count %s\n", key);
	if (!ask(line, out, sizeof(out)))
		return false;
	return sscanf(out, "ok %d %d %d %d %d %lf %lf %d %d", &st->effects, &st->requests, &st->refusals,
				  &st->lookups, &st->open, &st->open_for, &st->closed_after, &st->keyed, &st->bare) == 9;
}

/* the key's slow requests answered now (accepted); how many */
int
effect_answer(const char *key)
{
	char		line[NAME_SZ + 16];
	char		out[64];

	snprintf(line, sizeof(line), "answer %s\n", key);
	if (!ask(line, out, sizeof(out)))
		return -1;
	return atoi(out + 3);
}

/* let every hung request go (the endpoint closes them); how many */
int
effect_release(void)
{
	char		out[64];

	if (!ask("release\n", out, sizeof(out)))
		return -1;
	return atoi(out + 3);
}

/* requests that named none of the run's keys; the first one's first line */
int
effect_unmatched(char *first, size_t sz)
{
	char		out[300];
	char	   *p;

	first[0] = '\0';
	if (!ask("unmatched\n", out, sizeof(out)))
		return -1;
	p = strchr(out + 3, ' ');
	if (p)
		copy_str(first, sz, p + 1);
	return atoi(out + 3);
}
