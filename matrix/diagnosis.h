/*
 * diagnosis.h
 *		What a failing case says the job did wrong, in one sentence
 *		(diagnosis.c).
 */
#ifndef IDEMPOTENCY_MATRIX_DIAGNOSIS_H
#define IDEMPOTENCY_MATRIX_DIAGNOSIS_H

#include "engine.h"

void		diagnose_policy(const signoff_state *s, policy_result *pr);
void		key_diff(const char *a, const char *b, char *out, size_t sz);
bool		diagnose_case(const signoff_state *s, const policy_result *pr, int c,
						  char *out, size_t sz);

#endif							/* IDEMPOTENCY_MATRIX_DIAGNOSIS_H */
