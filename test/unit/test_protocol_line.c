/*
 * test_protocol_line.c
 *	  Unit test of the runner's JSON reading, without a server: the
 *	  sign-off protocol's line reader (engine.c's parse_line(), on json.c
 *	  and libpgcommon's parser) and json_string()'s text read back.
 *
 *	  make -C matrix unit    builds it with the runner's objects (but
 *	                         main.o) and runs it; exit 0 when all pass
 *	  test_protocol_line --print-json
 *	                         prints a protocol line and an object the way
 *	                         the runner writes them (json_string()), with
 *	                         quotes, backslashes, control characters and
 *	                         non-ASCII text, for python3 -m json.tool and
 *	                         jq (hook 49)
 *
 * The expectations are written out, field by field and sentence by
 * sentence, so a reader that changes what it accepts or how it says what
 * it refuses fails here and names the line.
 */
#include "postgres_fe.h"

#include "engine.h"

static int	checks;
static int	failures;

static void
check(bool ok, const char *what, const char *got)
{
	checks++;
	if (!ok)
	{
		failures++;
		printf("not ok - %s (got: %s)\n", what, got);
	}
}

static void
check_str(const char *got, const char *want, const char *what)
{
	char		label[600];

	snprintf(label, sizeof(label), "%s: \"%s\"", what, want);
	check(strcmp(got, want) == 0, label, got);
}

/* a line that must be read; x holds its fields */
static void
read_ok(const char *line, exch *x, const char *what)
{
	char		why[300] = "";

	memset(x, 0, sizeof(*x));
	check(parse_line(line, x, why, sizeof(why)), what, why);
}

/* a line that must be refused with exactly this sentence */
static void
refused(const char *line, const char *want, const char *what)
{
	exch		x;
	char		why[300] = "";
	char		label[600];

	memset(&x, 0, sizeof(x));
	snprintf(label, sizeof(label), "%s: refused, \"%s\"", what, want);
	check(!parse_line(line, &x, why, sizeof(why)) && strcmp(why, want) == 0, label, why);
}

static void
claimed_fields(const exch *x, const char *what)
{
	char		label[300];

	check_str(x->point, "claimed", what);
	check_str(x->job_type, "signoff_ab12_hold", what);
	check_str(x->key, "ORD-1", what);
	check_str(x->verdict, "run", what);
	snprintf(label, sizeof(label), "%s: v 1, attempt 1, pid 4242, heartbeat", what);
	check(x->v == 1 && x->attempt == 1 && x->pid == 4242 && x->heartbeat, label, x->point);
}

static void
test_lines(void)
{
	exch		x;

	/* the protocol's own example, then the same in other whitespace and order */
	read_ok("{\"v\":1,\"point\":\"claimed\",\"job_type\":\"signoff_ab12_hold\",\"key\":\"ORD-1\","
			"\"attempt\":1,\"verdict\":\"run\",\"pid\":4242,\"heartbeat\":true}", &x, "compact");
	claimed_fields(&x, "compact");
	read_ok(" \t{ \"heartbeat\" : true ,\r\n\"pid\":\n4242,\t\"verdict\": \"run\",  \"attempt\" :1 ,"
			"\"key\":\"ORD-1\",\"job_type\"  :\"signoff_ab12_hold\", \"point\":\"claimed\",\"v\" : 1 } \r",
			&x, "other whitespace, other key order");
	claimed_fields(&x, "other whitespace, other key order");

	/* fields the runner does not know, nested, are read past */
	read_ok("{\"extra\":{\"a\":[1,{\"b\":null},[]],\"c\":\"}\"},\"v\":1,\"point\":\"claimed\","
			"\"job_type\":\"signoff_ab12_hold\",\"key\":\"ORD-1\",\"attempt\":1,\"verdict\":\"run\","
			"\"pid\":4242,\"heartbeat\":true,\"more\":[[[\"x\"]]]}", &x, "unknown nested fields");
	claimed_fields(&x, "unknown nested fields");

	/* result: a JSON text in a string, or the value itself (its text as sent) */
	read_ok("{\"v\":1,\"point\":\"judged\",\"job_type\":\"t\",\"key\":\"K\",\"attempt\":1,\"verdict\":\"completed\","
			"\"result\":\"{\\\"message_id\\\": \\\"<m1@x>\\\"}\",\"pid\":7,\"heartbeat\":false}", &x, "result in a string");
	check(x.has_result, "result in a string: has_result", x.result);
	check_str(x.result, "{\"message_id\": \"<m1@x>\"}", "result in a string");
	read_ok("{\"v\":1,\"point\":\"judged\",\"job_type\":\"t\",\"key\":\"K\",\"attempt\":1,\"verdict\":\"completed\","
			"\"result\": {\"message_id\":\"<m1@x>\", \"n\": [1, 2.5e3, {\"ok\": true}]} ,\"pid\":7,\"heartbeat\":false}",
			&x, "nested result");
	check(x.has_result, "nested result: has_result", x.result);
	check_str(x.result, "{\"message_id\":\"<m1@x>\", \"n\": [1, 2.5e3, {\"ok\": true}]}", "nested result, as sent");

	/* \u escapes: BMP, a surrogate pair, escaped quotes and controls */
	read_ok("{\"v\":1,\"point\":\"claimed\",\"job_type\":\"t\\u00e9\",\"key\":\"ORD-\\ud83d\\ude00-\\u65e5\\\"\\\\\\/\\t\","
			"\"attempt\":1,\"verdict\":\"run\",\"pid\":7,\"heartbeat\":false}", &x, "\\u escapes");
	check_str(x.job_type, "t\xC3\xA9", "\\u00e9 as UTF-8");
	check_str(x.key, "ORD-\xF0\x9F\x98\x80-\xE6\x97\xA5\"\\/\t", "a surrogate pair as one UTF-8 character");

	/* ended (docs/signoff-protocol.md's example): the ending and how the delivery ended */
	read_ok("{\"v\":1,\"point\":\"ended\",\"job_type\":\"signoff_ab12_retry\",\"key\":\"ORD-1\",\"attempt\":1,"
			"\"pid\":4242,\"ending\":\"PermanentFailure\",\"delivery\":\"the task in state FAILURE, not retried "
			"(Celery)\",\"message\":\"provider answered 422\"}", &x, "ended");
	check_str(x.point, "ended", "ended's point");
	check_str(x.ending, "PermanentFailure", "ended's ending");
	check_str(x.ended_how, "the task in state FAILURE, not retried (Celery)", "ended's delivery");
	check_str(x.message, "provider answered 422", "ended's message");

	/* hello: its fields go to hello.c; a wrapper that is an object is not a name */
	read_ok("{\"v\":1,\"point\":\"hello\",\"pid\":4242,\"helper\":\"pg_idempotency\",\"helper_version\":\"0.3.0\","
			"\"runtime\":\"CPython\",\"runtime_version\":\"3.11.2\",\"queue_library\":null,"
			"\"queue_library_version\":null,\"database\":\"shop\",\"server_port\":5432,"
			"\"system_identifier\":\"7415530377311462125\",\"wrapper\":\"IdempotentTask\"}", &x, "hello");
	check_str(x.hello.helper, "pg_idempotency", "hello's helper");
	check_str(x.hello.database, "shop", "hello's database");
	check_str(x.hello.wrapper, "IdempotentTask", "hello's wrapper");
	check(x.hello.server_port == 5432 && !x.hello.wrapper_bad, "hello's port, a good wrapper", x.hello.wrapper);
	read_ok("{\"v\":1,\"point\":\"hello\",\"pid\":4242,\"wrapper\":{\"name\":\"x\"}}", &x, "hello, wrapper an object");
	check(x.hello.wrapper_bad, "a wrapper that is an object is not a name", x.hello.wrapper);

	/* refused: one sentence, where and what as the parser says it */
	refused("{\"v\":1 \"point\":\"claimed\"}", "not JSON: line 1, column 8: Expected \",\" or \"}\", but found \"\"point\"\"",
			"a missing comma");
	refused("{\"v\":1,\"point\":\"claimed\"} x", "not JSON: line 1, column 27: Token \"x\" is invalid",
			"text after the object");
	refused("{\"v\":1,\"point\":\"claimed\"}}", "not JSON: line 1, column 26: Expected end of input, but found \"}\"",
			"a second closing brace");
	refused("{\"v\":1,\"point\":\"clai", "not JSON: line 1, column 16: Token \"\"clai\" is invalid",
			"a line cut short in a string");
	refused("{\"v\":1,\"point\":", "not JSON: line 1, column 16: The input string ended unexpectedly",
			"a line cut short after a colon");
	refused("{\"v\":1,\"key\":\"\\ude00\"}", "not JSON: line 1, column 14: Unicode low surrogate must follow a high surrogate",
			"a lone low surrogate");
	refused("{\"v\":1,\"key\":\"\\ud83dx\"}", "not JSON: line 1, column 14: Unicode low surrogate must follow a high surrogate",
			"a high surrogate alone");
	refused("{\"v\":1,\"key\":\"a\\qb\"}", "not JSON: line 1, column 17: Escape sequence \"\\q\" is invalid",
			"an escape JSON has not");
	refused("{\"v\":1,\"key\":\"a\\u12G4\"}", "not JSON: line 1, column 14: \"\\u\" must be followed by four hexadecimal digits",
			"a \\u without four hex digits");
	refused("{\"v\":1,\"key\":\"a\tb\"}", "not JSON: line 1, column 16: Character with value 0x09 must be escaped",
			"a raw tab in a string");
	refused("{'v':1}", "not JSON: line 1, column 2: Token \"'\" is invalid", "single quotes");
	refused("{\"v\":01}", "not JSON: line 1, column 6: Token \"01\" is invalid", "a number with a leading zero");
	refused("", "not JSON: line 1, column 1: The input string ended unexpectedly", "an empty line");
	refused("[1,2]", "not a JSON object", "an array");
	refused("{}", "not a JSON object", "an empty object");
	refused("{\"v\":2,\"point\":\"claimed\"}", "protocol version 2, not 1", "another version");
	refused("{\"v\":1,\"point\":\"done\",\"key\":\"K\",\"job_type\":\"t\",\"pid\":1}",
			"no point claimed, judged, handled, ended or hello (\"done\")", "an unknown point");
}

/* what json_string() writes reads back as the same bytes */
static const char *const texts[] = {
	"plain",
	"quote \" and backslash \\ and slash /",
	"\x01\x02\x03\x04\x05\x06\x07\x08\t\n\x0b\x0c\r\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f\x7f",
	"caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80",
	"{\"not\": \"an object\"}\\u0041",
	"",
};

static void
test_round_trip(void)
{
	size_t		i;

	for (i = 0; i < lengthof(texts); i++)
	{
		StringInfoData b;
		char		why[300] = "";
		json_value *v;
		char		label[120];

		initStringInfo(&b);
		json_string(&b, texts[i]);
		v = json_parse(b.data, (size_t) b.len, why, sizeof(why));
		snprintf(label, sizeof(label), "json_string() of text %d reads back the same", (int) i);
		check(v != NULL && v->kind == JSON_KIND_STRING && strcmp(v->text, texts[i]) == 0, label,
			  v ? v->text : why);
		json_free(v);
		pfree(b.data);
	}
}

/* a protocol line and an object as the runner writes them, for json.tool and jq */
static void
print_json(void)
{
	StringInfoData b;
	size_t		i;

	initStringInfo(&b);
	appendStringInfoString(&b, "{\"v\":1,\"point\":\"claimed\",\"job_type\":");
	json_string(&b, texts[1]);
	appendStringInfoString(&b, ",\"key\":");
	json_string(&b, texts[3]);
	appendStringInfoString(&b, ",\"attempt\":1,\"verdict\":\"run\",\"pid\":4242,\"heartbeat\":true,\"texts\":[");
	for (i = 0; i < lengthof(texts); i++)
	{
		if (i)
			appendStringInfoChar(&b, ',');
		json_string(&b, texts[i]);
	}
	appendStringInfoString(&b, "]}\n");
	fputs(b.data, stdout);
	pfree(b.data);
}

int
main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--print-json") == 0)
	{
		print_json();
		return 0;
	}
	test_lines();
	test_round_trip();
	if (failures > 0)
	{
		printf("FAIL: %d of %d checks failed\n", failures, checks);
		return 1;
	}
	printf("ok - the runner's protocol lines and JSON strings, read with libpgcommon's parser: %d checks passed\n",
		   checks);
	return 0;
}
