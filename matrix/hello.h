/*
 * hello.h
 *		What a worker's helper says about itself (the sign-off protocol's
 *		optional point "hello") and about a claim that failed (the point
 *		"judged" with the verdict "error"): hello.c.
 *
 * Depends on util.h and case_table.h only; engine.c feeds it the lines,
 * report.c prints what it recorded.
 */
#ifndef IDEMPOTENCY_MATRIX_HELLO_H
#define IDEMPOTENCY_MATRIX_HELLO_H

#include "util.h"

/* the fields of one hello line (absent: "") */
typedef struct hello_info
{
	char		helper[48];		/* pg_idempotency, pg-idempotency */
	char		helper_version[32];
	char		runtime[32];	/* CPython, ruby, node */
	char		runtime_version[48];
	char		queue[32];		/* celery, sidekiq, sqs-consumer; "": none */
	char		queue_version[32];
	char		database[128];	/* current_database(); "": unknown */
	char		system_identifier[32];	/* pg_control_system(); "": unknown */
	long		server_port;	/* inet_server_port(); 0: unknown (a socket) */
	char		wrapper[48];	/* plain, plain_batch, IdempotentTask, ...; "": not reported */
	bool		wrapper_bad;	/* a wrapper that is not a name (hello.c) */
} hello_info;

struct exch;
struct signoff_state;

bool		hello_field(hello_info *h, const char *name, const char *sval,
						bool is_str, bool is_null, double num);
void		hello_record(struct signoff_state *s, long pid, const hello_info *h);
void		claim_error_seen(struct signoff_state *s, const struct exch *x);
bool		run_stopped(const struct signoff_state *s);
int			hello_workers(void);
void		hello_text(StringInfo b);
void		hello_json(StringInfo b);
void		hello_wrappers(StringInfo b);

#endif							/* IDEMPOTENCY_MATRIX_HELLO_H */
