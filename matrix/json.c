/*
 * json.c
 *		JSON read with libpgcommon's parser: pg_parse_json() and its
 *		semantic actions (common/jsonapi.h), as pg_verifybackup reads a
 *		backup manifest, into a tree of values.
 *
 * Any valid JSON is read: any whitespace, any order of members, nested
 * values, \u escapes (surrogate pairs included) unescaped to UTF-8. What
 * the parser refuses is one sentence in why, saying where (line, column)
 * and what, in the parser's words: json_errdetail() from PostgreSQL 17 on;
 * before it (15, 16) the frontend library has no json_errdetail(), and
 * json_error_words() below says the same for each error the parser
 * returns there. That, the semantic actions' return type (void before 16)
 * and the lexer's constructor and destructor (17 changed them) are the
 * only differences between the majors, all in the block below.
 *
 * A member of an object keeps its name; of two members with the same name
 * json_member() answers the last, as jq and Python do.
 */
#include "postgres_fe.h"

#include <string.h>

#include "common/jsonapi.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"

#include "json.h"

#define MAX_DEPTH 256			/* nesting the runner reads (the parser has none in 15) */

/* ---------------------------------------------------------------------
 * What differs between PostgreSQL 15, 16, 17 and 18
 * --------------------------------------------------------------------- */
#if PG_VERSION_NUM >= 160000
#define SEM_RESULT JsonParseErrorType
#define SEM_DONE return JSON_SUCCESS
#else
#define SEM_RESULT void
#define SEM_DONE return
#endif

#if PG_VERSION_NUM >= 170000
#define LEX_MAKE(buf, json, len) makeJsonLexContextCstringLen((buf), (json), (len), PG_UTF8, true)
#define LEX_FREE(lex) freeJsonLexContext(lex)
#define LEX_ERROR_WORDS(err, lex) json_errdetail((err), (lex))
#else
#define LEX_MAKE(buf, json, len) ((void) (buf), makeJsonLexContextCstringLen((char *) (json), (int) (len), PG_UTF8, true))
#define LEX_FREE(lex) (pfree((lex)->strval->data), pfree((lex)->strval), pfree(lex))
#define LEX_ERROR_WORDS(err, lex) json_error_words((err), (lex))

/*
 * json_errdetail()'s sentences, which 15's and 16's frontend library lacks;
 * %.*s is the token the parser stopped at
 */
static const struct
{
	JsonParseErrorType err;
	const char *words;
}			json_error_table[] =
{
	{JSON_ESCAPING_INVALID, "Escape sequence \"\\%.*s\" is invalid."},
	{JSON_EXPECTED_END, "Expected end of input, but found \"%.*s\"."},
	{JSON_EXPECTED_ARRAY_FIRST, "Expected array element or \"]\", but found \"%.*s\"."},
	{JSON_EXPECTED_ARRAY_NEXT, "Expected \",\" or \"]\", but found \"%.*s\"."},
	{JSON_EXPECTED_COLON, "Expected \":\", but found \"%.*s\"."},
	{JSON_EXPECTED_JSON, "Expected JSON value, but found \"%.*s\"."},
	{JSON_EXPECTED_MORE, "The input string ended unexpectedly."},
	{JSON_EXPECTED_OBJECT_FIRST, "Expected string or \"}\", but found \"%.*s\"."},
	{JSON_EXPECTED_OBJECT_NEXT, "Expected \",\" or \"}\", but found \"%.*s\"."},
	{JSON_EXPECTED_STRING, "Expected string, but found \"%.*s\"."},
	{JSON_INVALID_TOKEN, "Token \"%.*s\" is invalid."},
	{JSON_UNICODE_CODE_POINT_ZERO, "\\u0000 cannot be converted to text."},
	{JSON_UNICODE_ESCAPE_FORMAT, "\"\\u\" must be followed by four hexadecimal digits."},
	{JSON_UNICODE_HIGH_SURROGATE, "Unicode high surrogate must not follow a high surrogate."},
	{JSON_UNICODE_LOW_SURROGATE, "Unicode low surrogate must follow a high surrogate."},
};

static const char *
json_error_words(JsonParseErrorType err, JsonLexContext *lex)
{
	static char buf[300];
	size_t		i;

	if (err == JSON_ESCAPING_REQUIRED)
		snprintf(buf, sizeof(buf), "Character with value 0x%02x must be escaped.",
				 (unsigned char) *lex->token_terminator);
	else
		snprintf(buf, sizeof(buf), "JSON parse error %d.", (int) err);
	for (i = 0; i < lengthof(json_error_table); i++)
		if (json_error_table[i].err == err)
			snprintf(buf, sizeof(buf), json_error_table[i].words,
					 (int) (lex->token_terminator - lex->token_start), lex->token_start);
	return buf;
}
#endif

/* ---------------------------------------------------------------------
 * The semantic actions: a tree of values
 * --------------------------------------------------------------------- */

typedef struct build
{
	JsonLexContext *lex;
	json_value *top;
	json_value *open[MAX_DEPTH];	/* the objects and arrays not closed yet */
	size_t		start[MAX_DEPTH];	/* where each began in the input */
	int			depth;
	char	   *name;			/* the member whose value comes next */
	bool		too_deep;
} build;

static void
add(build *b, json_value *v)
{
	json_value *parent = b->depth > 0 ? b->open[b->depth - 1] : NULL;

	if (parent == NULL)
	{
		b->top = v;
		return;
	}
	if (parent->kind == JSON_KIND_OBJECT)
	{
		v->name = b->name;
		b->name = NULL;
	}
	if (parent->nitems == parent->cap)
	{
		parent->cap = parent->cap ? parent->cap * 2 : 8;
		parent->items = pg_realloc_array(parent->items, json_value *, parent->cap);
	}
	parent->items[parent->nitems++] = v;
}

static void
open_value(build *b, json_kind kind)
{
	json_value *v = pg_malloc0_object(json_value);

	v->kind = kind;
	add(b, v);
	if (b->depth == MAX_DEPTH)
	{
		b->too_deep = true;		/* said after the parse, which goes on */
		return;
	}
	b->open[b->depth] = v;
	b->start[b->depth] = (size_t) (b->lex->token_start - b->lex->input);
	b->depth++;
}

/* an object or an array closed: its text as it stands in the input */
static void
close_value(build *b)
{
	size_t		end = (size_t) (b->lex->prev_token_terminator - b->lex->input);
	json_value *v;

	if (b->depth == 0 || b->too_deep)
		return;
	b->depth--;
	v = b->open[b->depth];
	v->text = pnstrdup(b->lex->input + b->start[b->depth], end - b->start[b->depth]);
}

static SEM_RESULT
on_object_start(void *state)
{
	open_value(state, JSON_KIND_OBJECT);
	SEM_DONE;
}

static SEM_RESULT
on_array_start(void *state)
{
	open_value(state, JSON_KIND_ARRAY);
	SEM_DONE;
}

static SEM_RESULT
on_end(void *state)
{
	close_value(state);
	SEM_DONE;
}

static SEM_RESULT
on_field_start(void *state, char *fname, bool isnull)
{
	build	   *b = state;

	(void) isnull;
	if (b->name)
		pfree(b->name);
	b->name = fname;
	SEM_DONE;
}

static SEM_RESULT
on_scalar(void *state, char *token, JsonTokenType type)
{
	json_value *v = pg_malloc0_object(json_value);

	switch (type)
	{
		case JSON_TOKEN_STRING:
			v->kind = JSON_KIND_STRING;
			break;
		case JSON_TOKEN_NUMBER:
			v->kind = JSON_KIND_NUMBER;
			break;
		case JSON_TOKEN_TRUE:
			v->kind = JSON_KIND_TRUE;
			break;
		case JSON_TOKEN_FALSE:
			v->kind = JSON_KIND_FALSE;
			break;
		default:
			v->kind = JSON_KIND_NULL;
			break;
	}
	v->text = token;
	add(state, v);
	SEM_DONE;
}

/* characters from the start of lex's line to p: the column, from 1 */
static int
column_of(const JsonLexContext *lex, const char *p)
{
	const char *s;
	int			col = 1;

	for (s = lex->line_start; s < p; s++)
		if (((unsigned char) *s & 0xC0) != 0x80)
			col++;
	return col;
}

/*
 * The JSON text json (len bytes, UTF-8) as a tree; NULL when it is not
 * JSON: why says where and what, one sentence without its full stop
 * ("line 1, column 9: Expected \":\", but found \"}\"").
 */
json_value *
json_parse(const char *json, size_t len, char *why, size_t wsz)
{
	JsonLexContext lexbuf;
	JsonLexContext *lex;
	JsonSemAction sem;
	JsonParseErrorType err;
	build		b;

	memset(&b, 0, sizeof(b));
	memset(&sem, 0, sizeof(sem));
	sem.semstate = &b;
	sem.object_start = on_object_start;
	sem.object_end = on_end;
	sem.array_start = on_array_start;
	sem.array_end = on_end;
	sem.object_field_start = on_field_start;
	sem.scalar = on_scalar;
	lex = LEX_MAKE(&lexbuf, json, len);
	b.lex = lex;
	err = pg_parse_json(lex, &sem);
	if (err == JSON_SUCCESS && b.too_deep)
		snprintf(why, wsz, "nested deeper than %d objects and arrays", MAX_DEPTH);
	else if (err != JSON_SUCCESS)
	{
		const char *at = err == JSON_EXPECTED_MORE || lex->token_start == NULL ? json + len :
			err == JSON_ESCAPING_REQUIRED ? lex->token_terminator : lex->token_start;
		const char *words = LEX_ERROR_WORDS(err, lex);
		size_t		n = strlen(words);

		if (n > 0 && words[n - 1] == '.')
			n--;
		snprintf(why, wsz, "line %d, column %d: %.*s", lex->line_number, column_of(lex, at), (int) n, words);
	}
	LEX_FREE(lex);
	if (b.name)
		pfree(b.name);
	if (err != JSON_SUCCESS || b.too_deep)
	{
		json_free(b.top);
		return NULL;
	}
	return b.top;
}

/* an object's member of that name (the last, if several), or NULL */
const json_value *
json_member(const json_value *object, const char *name)
{
	int			i;

	if (object == NULL || object->kind != JSON_KIND_OBJECT)
		return NULL;
	for (i = object->nitems - 1; i >= 0; i--)
		if (strcmp(object->items[i]->name, name) == 0)
			return object->items[i];
	return NULL;
}

/* a member's value if it is a string, else NULL */
const char *
json_string_member(const json_value *object, const char *name)
{
	const json_value *m = json_member(object, name);

	return m && m->kind == JSON_KIND_STRING ? m->text : NULL;
}

void
json_free(json_value *v)
{
	int			i;

	if (v == NULL)
		return;
	for (i = 0; i < v->nitems; i++)
		json_free(v->items[i]);
	if (v->items)
		pfree(v->items);
	if (v->name)
		pfree(v->name);
	if (v->text)
		pfree(v->text);
	pfree(v);
}
