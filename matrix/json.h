/*
 * json.h
 *		JSON read with libpgcommon's parser (common/jsonapi.h): json.c.
 *
 * Every JSON the runner reads goes through json_parse(): the workers'
 * protocol lines (engine.c) and the report --verify reads (provenance.c).
 * Depends on nothing else of the runner.
 */
#ifndef IDEMPOTENCY_MATRIX_JSON_H
#define IDEMPOTENCY_MATRIX_JSON_H

#include <stdbool.h>
#include <stddef.h>

typedef enum json_kind
{
	JSON_KIND_NULL,
	JSON_KIND_FALSE,
	JSON_KIND_TRUE,
	JSON_KIND_NUMBER,
	JSON_KIND_STRING,
	JSON_KIND_OBJECT,
	JSON_KIND_ARRAY
} json_kind;

/* a value, and in an object its member's name */
typedef struct json_value
{
	json_kind	kind;
	char	   *name;			/* a member's name; NULL in an array, at the top */

	/*
	 * a string's value (unescaped, UTF-8), a number's token as written; an
	 * object's or an array's JSON text as it stands in the input
	 */
	char	   *text;
	struct json_value **items;	/* an object's members, an array's elements */
	int			nitems;
	int			cap;
} json_value;

json_value *json_parse(const char *json, size_t len, char *why, size_t wsz);
const json_value *json_member(const json_value *object, const char *name);
const char *json_string_member(const json_value *object, const char *name);
void		json_free(json_value *v);

#endif							/* IDEMPOTENCY_MATRIX_JSON_H */
