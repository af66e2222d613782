/*
 * util.c
 *		Strings, escaping and clocks for the replay matrix runner.
 */
#include "postgres_fe.h"

#include <ctype.h>
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cryptohash.h"
#include "common/logging.h"
#include "common/sha2.h"

#include "util.h"

void
html_escape(StringInfo b, const char *s)
{
	for (; *s; s++)
	{
		switch (*s)
		{
			case '&':
				appendStringInfoString(b, "&amp;");
				break;
			case '<':
				appendStringInfoString(b, "&lt;");
				break;
			case '>':
				appendStringInfoString(b, "&gt;");
				break;
			case '"':
				appendStringInfoString(b, "&quot;");
				break;
			case '\'':
				appendStringInfoString(b, "&#39;");
				break;
			default:
				/* XML 1.0 has no other control character (--junit) */
				if ((unsigned char) *s < 0x20 && *s != '\n' && *s != '\t' && *s != '\r')
					appendStringInfoString(b, " ");
				else
					appendStringInfoChar(b, *s);
		}
	}
}

/* a JSON string literal, quotes included */
void
json_string(StringInfo b, const char *s)
{
	appendStringInfoString(b, "\"");
	for (; *s; s++)
	{
		unsigned char c = (unsigned char) *s;

		if (c == '"' || c == '\\')
		{
			appendStringInfoChar(b, '\\');
			appendStringInfoChar(b, *s);
		}
		else if (c == '\n')
			appendStringInfoString(b, "\\n");
		else if (c == '\t')
			appendStringInfoString(b, "\\t");
		else if (c == '\r')
			appendStringInfoString(b, "\\r");
		else if (c < 0x20)
			appendStringInfo(b, "\\u%04x", c);
		else
			appendStringInfoChar(b, *s);
	}
	appendStringInfoString(b, "\"");
}

/*
 * Columns a UTF-8 string takes in a terminal. Every character this program
 * prints is one column wide, so counting characters is enough.
 */
size_t
display_width(const char *s)
{
	size_t		n = 0;

	for (; *s; s++)
		if (((unsigned char) *s & 0xC0) != 0x80)
			n++;
	return n;
}

double
now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

void
sleep_ms(int ms)
{
	struct timespec ts;

	ts.tv_sec = ms / 1000;
	ts.tv_nsec = (long) (ms % 1000) * 1000000L;
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !matrix_interrupted)
		;
}

/* local time with offset ("2025-11-29 09:10:11 +0000"), or UTC with ms */
void
iso_time(char *buf, size_t sz, bool utc_millis)
{
	struct timespec ts;
	struct tm	tm;

	clock_gettime(CLOCK_REALTIME, &ts);
	if (utc_millis)
	{
		char		base[32];

		gmtime_r(&ts.tv_sec, &tm);
		strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
		snprintf(buf, sz, "%s.%03ldZ", base, ts.tv_nsec / 1000000L);
	}
	else
	{
		localtime_r(&ts.tv_sec, &tm);
		strftime(buf, sz, "%Y-%m-%d %H:%M:%S %z", &tm);
	}
}

void
copy_str(char *dst, size_t sz, const char *src)
{
	if (sz == 0)
		return;
	snprintf(dst, sz, "%s", src ? src : "");
}

/* append s to the list in buf ("a, b, c"), within sz bytes */
void
list_append(char *buf, size_t sz, const char *s)
{
	size_t		len = strlen(buf);

	snprintf(buf + len, sz - len, "%s%s", len ? ", " : "", s);
}

volatile sig_atomic_t matrix_interrupted = 0;

static void
on_signal(int sig)
{
	matrix_interrupted = sig;	/* which: the report names it */
}

/* SIGINT, SIGTERM and SIGHUP set matrix_interrupted; SIGPIPE is ignored */
void
catch_interrupts(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
}

/* "2", "1.5", "500ms", "3 s": seconds between 0.1 and 600 */
bool
parse_lease(const char *s, double *out)
{
	char	   *end;
	double		v;

	errno = 0;
	v = strtod(s, &end);
	if (end == s || errno != 0)
		return false;
	while (*end == ' ')
		end++;
	if (strcmp(end, "ms") == 0)
		v /= 1000.0;
	else if (*end != '\0' && strcmp(end, "s") != 0 && strcmp(end, "sec") != 0 &&
			 strcmp(end, "second") != 0 && strcmp(end, "seconds") != 0)
		return false;
	if (!(v >= 0.1 && v <= 600.0))
		return false;
	*out = v;
	return true;
}

/* msg on one line: newlines and tabs as blanks, no trailing blank */
const char *
one_line(const char *msg)
{
	static char buf[512];
	char	   *p;

	copy_str(buf, sizeof(buf), msg);
	for (p = buf; *p; p++)
		if (*p == '\n' || *p == '\t')
			*p = ' ';
	while (p > buf && p[-1] == ' ')
		*--p = '\0';
	return buf;
}

/* s without its leading and trailing blanks (trailing ones cut in place) */
char *
trim(char *s)
{
	char	   *e;

	while (*s && isspace((unsigned char) *s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char) e[-1]))
		*--e = '\0';
	return s;
}

/* s, quoted for /bin/sh: 'it'\''s' */
void
shell_quote(StringInfo b, const char *s)
{
	appendStringInfoString(b, "'");
	for (; *s; s++)
	{
		if (*s == '\'')
			appendStringInfoString(b, "'\\''");
		else
			appendStringInfoChar(b, *s);
	}
	appendStringInfoString(b, "'");
}

static int
remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void) st;
	(void) ftw;
	return flag == FTW_DP ? rmdir(path) : unlink(path);
}

/* path and all below it, not following symbolic links */
void
remove_tree(const char *path)
{
	nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* the digest of a hash context, as hex; false: why in err (not for OOM: NULL ctx) */
static bool
sha256_end(pg_cryptohash_ctx *c, char out[65])
{
	uint8		digest[PG_SHA256_DIGEST_LENGTH];
	int			i;

	if (pg_cryptohash_final(c, digest, sizeof(digest)) < 0)
		return false;
	for (i = 0; i < PG_SHA256_DIGEST_LENGTH; i++)
		snprintf(out + 2 * i, 3, "%02x", digest[i]);
	return true;
}

/* libcrypto refused: the run cannot say what it signs (exit 2, as a run that cannot start) */
static void
sha256_failed(const char *why)
{
	pg_log_error("cannot compute SHA-256: %s", why);
	exit(2);
}

/*
 * A SHA-256 context from libpgcommon (OpenSSL's on Debian), ready; a
 * failure ends the run (exit 2): the frontend's pg_cryptohash_create() returns NULL
 * only when it is out of memory (libcrypto's context included), and
 * pg_cryptohash_init() fails only when libcrypto refuses, which
 * pg_cryptohash_error() names (it exists from PostgreSQL 15 on).
 */
static pg_cryptohash_ctx *
sha256_begin(void)
{
	pg_cryptohash_ctx *c = pg_cryptohash_create(PG_SHA256);

	if (c == NULL)
		sha256_failed("out of memory");
	if (pg_cryptohash_init(c) < 0)
		sha256_failed(pg_cryptohash_error(c));
	return c;
}

/* the sha256 of n bytes, as 64 hex digits */
void
sha256_buffer(const void *data, size_t n, char out[65])
{
	pg_cryptohash_ctx *c = sha256_begin();

	if (pg_cryptohash_update(c, (const uint8 *) data, n) < 0 || !sha256_end(c, out))
		sha256_failed(pg_cryptohash_error(c));
	pg_cryptohash_free(c);
}

/* the sha256 of a file's content; false: it cannot be read (errno) */
bool
sha256_file(const char *path, char out[65])
{
	FILE	   *f = fopen(path, "rb");
	uint8		buf[65536];
	size_t		n;
	pg_cryptohash_ctx *c;

	if (f == NULL)
		return false;
	c = sha256_begin();
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		if (pg_cryptohash_update(c, buf, n) < 0)
			sha256_failed(pg_cryptohash_error(c));
	if (ferror(f))
	{
		int			save = errno;

		fclose(f);
		pg_cryptohash_free(c);
		errno = save;
		return false;
	}
	fclose(f);
	if (!sha256_end(c, out))
		sha256_failed(pg_cryptohash_error(c));
	pg_cryptohash_free(c);
	return true;
}
