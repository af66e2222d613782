/*
 * effect.h
 *		The run's own effect endpoints (a job file's `effect = http` or
 *		`effect = smtp`): a provider that counts each key's effects itself
 *		and fails as a case tells it (effect.c).
 *
 * Depends only on util.h.
 */
#ifndef IDEMPOTENCY_MATRIX_EFFECT_H
#define IDEMPOTENCY_MATRIX_EFFECT_H

#include "util.h"

typedef enum effect_kind
{
	EFFECT_NONE,				/* the job file counts its effects itself */
	EFFECT_HTTP,
	EFFECT_SMTP
} effect_kind;

/* how the endpoint answers a key's next requests */
typedef enum effect_fault
{
	FAULT_NONE,					/* accepted: 200 / 250 */
	FAULT_TRANSIENT,			/* refused for now: 503 / 451; no effect */
	FAULT_PERMANENT,			/* refused for good: 422 / 550; no effect */
	FAULT_HANG,					/* accepted, and no answer: the effect happened */
	FAULT_SLOW					/* accepted, answered after a delay */
} effect_fault;

/* what the endpoint saw of one key */
typedef struct effect_stats
{
	int			effects;		/* requests accepted (the effect happened) */
	int			requests;		/* every request that named the key (not lookups) */
	int			refusals;		/* answered 503/451 or 422/550 */
	int			lookups;		/* GET (http): the job looked the key up */
	int			open;			/* hung or slow requests still open */
	double		open_for;		/* the oldest open one: seconds since it came; 0 none */
	double		closed_after;	/* a hung request the client gave up: seconds it waited; -1 none */
	int			keyed;			/* HTTP: requests whose Idempotency-Key header named the key */
	int			bare;			/* HTTP: later requests of the key without that header */
} effect_stats;

extern const char *const effect_kind_names[];

bool		effect_start(effect_kind kind, char *addr, size_t asz, char *why, size_t wsz);
void		effect_stop(void);
bool		effect_key(const char *key, const char *alias);
bool		effect_set_fault(const char *key, effect_fault fault, int times, int delay_ms);
bool		effect_listen(bool on);
bool		effect_stats_of(const char *key, effect_stats *st);
int			effect_release(void);
int			effect_answer(const char *key);
int			effect_unmatched(char *first, size_t sz);

#endif							/* IDEMPOTENCY_MATRIX_EFFECT_H */
