/*
 * util.h
 *		The runner's strings, escaping, clocks and interruption, and
 *		SHA-256 (util.c).
 *
 * Depends on nothing else of the runner: every other file may use it.
 */
#ifndef IDEMPOTENCY_MATRIX_UTIL_H
#define IDEMPOTENCY_MATRIX_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <signal.h>

#include "lib/stringinfo.h"

#if defined(__GNUC__)
#define MX_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define MX_PRINTF(f, a)
#endif

/* set by SIGINT, SIGTERM and SIGHUP: the run stops and cleans up */
extern volatile sig_atomic_t matrix_interrupted;
void		catch_interrupts(void);

void		html_escape(StringInfo b, const char *s);	/* and XML: controls as blanks */
void		json_string(StringInfo b, const char *s);
size_t		display_width(const char *s);
double		now_seconds(void);
void		sleep_ms(int ms);
void		iso_time(char *buf, size_t sz, bool utc_millis);
void		copy_str(char *dst, size_t sz, const char *src);
void		list_append(char *buf, size_t sz, const char *s);
const char *one_line(const char *msg);
char	   *trim(char *s);
bool		parse_lease(const char *s, double *out);
void		shell_quote(StringInfo b, const char *s);
void		remove_tree(const char *path);

/* util.c: SHA-256 through libpgcommon's pg_cryptohash (sha256sum's digests) */
void		sha256_buffer(const void *data, size_t n, char out[65]);
bool		sha256_file(const char *path, char out[65]);

#endif							/* IDEMPOTENCY_MATRIX_UTIL_H */
