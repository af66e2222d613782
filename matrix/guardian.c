/*
 * guardian.c
 *		What the run started does not outlive it, even when the runner is
 *		killed with SIGKILL (and so cannot clean up itself).
 *
 * The runner forks a guardian at the start of a run, in a session of its
 * own (a Ctrl-C for the runner's terminal does not reach it), holding the
 * read end of a pipe whose write end only the runner has (close-on-exec,
 * so no worker inherits it). The runner tells it, a line at a time, each
 * process group it starts ("group <pgid>"), each that is gone ("gone
 * <pgid>"), and each directory it made ("dir <path>"); at its own orderly
 * end it says "done", and the guardian exits. If the pipe reaches end of
 * file without "done", the runner died: the guardian sends SIGKILL to
 * every group still listed (a worker that ignores its parent's death is
 * still in its group) and removes the directories, then exits.
 *
 * A worker that leaves its process group (setsid, a daemon) escapes this;
 * the run's job types and records stay in the database (the runner's next
 * cleanup cannot know them; docs/signoff.md says how to remove them).
 */
#include "postgres_fe.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "matrix.h"

#define MAX_GUARDED 512

static int	guard_fd = -1;

static void
tell(const char *fmt,...) MX_PRINTF(1, 2);

static void
tell(const char *fmt,...)
{
	char		line[1200];
	va_list		ap;
	int			n;

	if (guard_fd < 0)
		return;
	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	/* shorter than PIPE_BUF: one write, never torn */
	if (n > 0 && (size_t) n < sizeof(line) && write(guard_fd, line, (size_t) n) != n)
	{
		close(guard_fd);
		guard_fd = -1;
	}
}

/* the guardian's life: listen until "done", or clean up after a dead runner */
static void
guard(int fd)
{
	pid_t		groups[MAX_GUARDED];
	int			ngroups = 0;
	char		dirs[8][1100];
	int			ndirs = 0;
	FILE	   *in = fdopen(fd, "r");
	char		line[1200];
	int			i;

	while (in && fgets(line, sizeof(line), in))
	{
		line[strcspn(line, "\n")] = '\0';
		if (strcmp(line, "done") == 0)
			_exit(0);
		if (strncmp(line, "group ", 6) == 0 && ngroups < MAX_GUARDED)
			groups[ngroups++] = (pid_t) atol(line + 6);
		else if (strncmp(line, "gone ", 5) == 0)
		{
			pid_t		g = (pid_t) atol(line + 5);

			for (i = 0; i < ngroups; i++)
				if (groups[i] == g)
				{
					groups[i] = groups[--ngroups];
					break;
				}
		}
		else if (strncmp(line, "dir ", 4) == 0 && ndirs < 8)
			copy_str(dirs[ndirs++], sizeof(dirs[0]), line + 4);
	}
	/* the runner is gone without "done" */
	for (i = 0; i < ngroups; i++)
		if (groups[i] > 1)
			kill(-groups[i], SIGKILL);
	for (i = 0; i < ndirs; i++)
		remove_tree(dirs[i]);
	_exit(0);
}

/* start the guardian (once per run); false: it could not be (the run goes on without) */
bool
guardian_start(void)
{
	int			p[2];
	pid_t		pid;

	if (guard_fd >= 0)
		return true;
	if (pipe2(p, O_CLOEXEC) != 0)
		return false;
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0)
	{
		close(p[0]);
		close(p[1]);
		return false;
	}
	if (pid == 0)
	{
		int			fd;
		int			maxfd = (int) sysconf(_SC_OPEN_MAX);

		setsid();
		signal(SIGINT, SIG_IGN);
		signal(SIGTERM, SIG_IGN);
		signal(SIGHUP, SIG_IGN);
		close(p[1]);
		if (maxfd < 0 || maxfd > 65536)
			maxfd = 65536;
		for (fd = 3; fd < maxfd; fd++)
			if (fd != p[0])
				close(fd);
		fd = open("/dev/null", O_RDWR);
		if (fd >= 0)
		{
			dup2(fd, 0);
			dup2(fd, 1);
			dup2(fd, 2);
			if (fd > 2)
				close(fd);
		}
		guard(p[0]);
	}
	close(p[0]);
	guard_fd = p[1];
	return true;
}

void
guardian_group(pid_t pgid)
{
	tell("group %d\n", (int) pgid);
}

void
guardian_gone(pid_t pgid)
{
	tell("gone %d\n", (int) pgid);
}

void
guardian_dir(const char *path)
{
	tell("dir %s\n", path);
}

/* the runner's orderly end: the guardian leaves everything as it is */
void
guardian_done(void)
{
	tell("done\n");
	if (guard_fd >= 0)
		close(guard_fd);
	guard_fd = -1;
}
