/*
 * provider.c
 *		The fake mail provider: it lives outside the database.
 *
 * An email "leaves" when its line is in the mailbox file: one write() with
 * O_APPEND (so concurrent workers never interleave a line), then fsync().
 * Nothing the database does afterwards (a rollback, a dead backend) can take
 * it back, which is what makes cases 5 and 6 really uncertain.
 *
 * Two variants, as in the seed:
 *	- the plain provider has no reference field: a line holds the recipient
 *	  and the subject, nothing a worker could look an operation up by;
 *	- the lookup provider stores ref=<operation key> with each message, and
 *	  provider_lookup() finds it (used by the lookup policy's verify).
 */
#include "postgres_fe.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "matrix.h"

/*
 * Send one confirmation email for order `key`. Returns 0 once the line is on
 * disk, -1 (errno set) if it is not; message_id gets the provider's id.
 */
int
provider_send(const char *mailbox, bool with_ref, const char *key,
			  const char *worker, int attempt, char *message_id, size_t idsz)
{
	char		line[1024];
	char		when[40];
	struct timespec ts;
	int			fd;
	int			n;
	ssize_t		w;

	clock_gettime(CLOCK_REALTIME, &ts);
	snprintf(message_id, idsz, "msg-%ld%09ld-%d",
			 (long) ts.tv_sec, ts.tv_nsec, (int) getpid());
	iso_time(when, sizeof(when), true);
	if (with_ref)
		n = snprintf(line, sizeof(line),
					 "%s\tid=%s\tto=customer-%s@example.invalid\tsubject=Your order %s is confirmed\tref=%s\tworker=%s\tattempt=%d\n",
					 when, message_id, key, key, key, worker, attempt);
	else
		n = snprintf(line, sizeof(line),
					 "%s\tid=%s\tto=customer-%s@example.invalid\tsubject=Your order %s is confirmed\tworker=%s\tattempt=%d\n",
					 when, message_id, key, key, worker, attempt);
	if (n < 0 || (size_t) n >= sizeof(line))
	{
		errno = ENAMETOOLONG;
		return -1;
	}

	fd = open(mailbox, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return -1;
	w = write(fd, line, (size_t) n);
	if (w != n || fsync(fd) != 0)
	{
		int			save = errno;

		close(fd);
		errno = w < 0 ? save : (save ? save : EIO);
		return -1;
	}
	return close(fd);
}

/* lines of the mailbox, and how many contain needle (all if NULL); -1 error */
static int
scan(const char *mailbox, const char *needle, int *matches)
{
	FILE	   *f = fopen(mailbox, "r");
	char	   *line = NULL;
	size_t		cap = 0;
	int			lines = 0;

	*matches = 0;
	if (f == NULL)
		return errno == ENOENT ? 0 : -1;
	while (getline(&line, &cap, f) > 0)
	{
		lines++;
		if (needle == NULL || strstr(line, needle) != NULL)
			(*matches)++;
	}
	free(line);
	fclose(f);
	return lines;
}

/*
 * The lookup provider's query: has a message with reference `key` left?
 * 1 found, 0 not found, -1 the mailbox cannot be read.
 */
int
provider_lookup(const char *mailbox, const char *key)
{
	char		needle[300];
	int			matches;

	snprintf(needle, sizeof(needle), "\tref=%s\t", key);
	if (scan(mailbox, needle, &matches) < 0)
		return -1;
	return matches > 0 ? 1 : 0;
}

/* emails in the mailbox, all of them (key NULL) or for one order; -1 error */
int
provider_count(const char *mailbox, const char *key)
{
	char		needle[300];
	int			matches;

	if (key)
		snprintf(needle, sizeof(needle), "\tsubject=Your order %s is confirmed\t", key);
	if (scan(mailbox, key ? needle : NULL, &matches) < 0)
		return -1;
	return matches;
}
