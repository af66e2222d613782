/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  Differences between PostgreSQL major versions, in one place.
 *
 * The extension is built and tested on PostgreSQL 15. Code for another
 * major version goes here, behind PG_VERSION_NUM, never in the .c files.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_COMPAT_H
#define IDEMPOTENCY_COMPAT_H

#if PG_VERSION_NUM < 150000
#error "idempotency requires PostgreSQL 15 or later"
#endif

/* InitMaterializedSRF() appeared in PostgreSQL 15 */

#endif							/* IDEMPOTENCY_COMPAT_H */
