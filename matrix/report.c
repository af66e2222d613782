/*
 * report.c
 *		The matrix in the terminal, as a self-contained HTML page, and as JSON.
 *
 * One table per policy, in the seed's shape: the case and how the message
 * arrives, then what was observed (emails, record afterwards, verdicts),
 * then the seed's "expected" words, with a mark per row. A cell that
 * differs from its expectation shows "observed ≠ expected". Then the policy
 * summary (emails in cases 5 and 6) and one total line.
 *
 * A sign-off run (ctx->job) has the same tables, with "effects" in place of
 * "emails", headed by its job file's settings, and a line to sign.
 */
#include "postgres_fe.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/logging.h"
#include "matrix.h"
#include "hello.h"

#define C_RESET	"\033[0m"
#define C_BOLD	"\033[1m"
#define C_DIM	"\033[2m"
#define C_RED	"\033[31m"
#define C_GREEN	"\033[32m"

enum
{
	COL_MARK, COL_CASE, COL_TITLE, COL_EMAILS, COL_RECORD, COL_VERDICTS,
	COL_EXPECTED, N_COLS
};


/* a count, or null where none was taken (-1) */
static void
json_count(StringInfo b, int n)
{
	if (n >= 0)
		appendStringInfo(b, "%d", n);
	else
		appendStringInfoString(b, "null");
}

/* what the observed column counts: the seed's emails, or the job's effects */
const char *
effect_word(const matrix_ctx *ctx)
{
	return ctx->job ? "effects" : "emails";
}

static const char *
ne(const matrix_ctx *ctx)
{
	return ctx->utf8 ? " \xE2\x89\xA0 " : " != ";	/* ≠ */
}

static const char *
mark(const matrix_ctx *ctx, bool pass)
{
	if (ctx->utf8)
		return pass ? "\xE2\x9C\x93" : "\xE2\x9C\x97";	/* ✓ ✗ */
	return pass ? "ok" : "FAIL";
}

/* the text of each cell of one row; cells[i] must be freed by the caller */
static void
row_cells(const matrix_ctx *ctx, const case_result *cr, StringInfo cells)
{
	int			i;

	for (i = 0; i < N_COLS; i++)
		initStringInfo(&cells[i]);
	appendStringInfoString(&cells[COL_MARK], mark(ctx, cr->pass));
	appendStringInfoString(&cells[COL_CASE], cr->id);
	appendStringInfoString(&cells[COL_TITLE], cr->title);
	if (!cr->ran)
	{
		appendStringInfoString(&cells[COL_EMAILS], "-");
		appendStringInfoString(&cells[COL_RECORD], "not run");
		appendStringInfoString(&cells[COL_VERDICTS], "-");
	}
	else
	{
		if (cr->obs_emails < 0)
			appendStringInfoString(&cells[COL_EMAILS], "?");
		else
			appendStringInfo(&cells[COL_EMAILS], "%d", cr->obs_emails);
		if (!cr->emails_ok)
			appendStringInfo(&cells[COL_EMAILS], "%s%d", ne(ctx), cr->exp_emails);
		appendStringInfoString(&cells[COL_RECORD], cr->obs_record[0] ? cr->obs_record : "?");
		if (!cr->record_ok)
			appendStringInfo(&cells[COL_RECORD], "%s%s", ne(ctx), cr->exp_record);
		appendStringInfoString(&cells[COL_VERDICTS], cr->obs_verdicts[0] ? cr->obs_verdicts : "?");
		if (!cr->verdicts_ok)
			appendStringInfo(&cells[COL_VERDICTS], "%s%s", ne(ctx), cr->exp_verdicts);
	}
	appendStringInfoString(&cells[COL_EXPECTED], cr->expected_text);
}

static bool
cell_bad(const case_result *cr, int col)
{
	switch (col)
	{
		case COL_MARK:
			return !cr->pass;
		case COL_EMAILS:
			return cr->ran && !cr->emails_ok;
		case COL_RECORD:
			return !cr->ran || !cr->record_ok;
		case COL_VERDICTS:
			return cr->ran && !cr->verdicts_ok;
		default:
			return false;
	}
}

static void
pad(FILE *f, const char *s, size_t width)
{
	size_t		w = display_width(s);

	fputs(s, f);
	for (; w < width; w++)
		fputc(' ', f);
}

static void
pad_sb(StringInfo b, const char *s, size_t width)
{
	size_t		w = display_width(s);

	appendStringInfoString(b, s);
	for (; w < width; w++)
		appendStringInfoString(b, " ");
}

static const char *
rtrim(StringInfo b)
{
	while (b->len > 0 && b->data[b->len - 1] == ' ')
		b->data[--b->len] = '\0';
	return b->data;
}

/* print one policy's matrix to stdout, as soon as the policy is done */
void
report_policy(matrix_ctx *ctx, const policy_result *pr)
{
	static const char *const head1[N_COLS] =
	{"", "case", "attempt", "observed", "", "", "expected"};
	const char *const head2[N_COLS] =
	{"", "", "", effect_word(ctx), "record afterwards", "verdicts", ""};
	size_t		width[N_COLS];
	int			i,
				c;
	int			passed = 0;

	for (c = 0; c < N_COLS; c++)
		width[c] = display_width(head2[c]);
	width[COL_CASE] = 4;
	width[COL_TITLE] = display_width(head1[COL_TITLE]);
	for (i = 0; i < pr->ncases; i++)
	{
		StringInfoData cells[N_COLS];

		row_cells(ctx, &pr->cases[i], cells);
		for (c = 0; c < N_COLS; c++)
		{
			size_t		w = display_width(cells[c].data);

			if (w > width[c])
				width[c] = w;
			pfree(cells[c].data);
		}
		if (pr->cases[i].pass)
			passed++;
	}

	printf("\n%sPolicy %s%s: %s", ctx->color ? C_BOLD : "", policy_names[pr->policy],
		   ctx->color ? C_RESET : "", (ctx->job ? policy_blurbs_job : policy_blurbs)[pr->policy]);
	if (pr->checked_as != pr->policy)
		printf("  [checked against %s's expectations]", policy_names[pr->checked_as]);
	/* a sign-off run has one job type per policy, the reference one per case */
	printf("\n%sjob type%s %s_%s%s, lease %s, %d of %d cases hold, %.1f s%s\n\n",
		   ctx->color ? C_DIM : "", ctx->job ? "" : "s", ctx->prefix, policy_names[pr->policy],
		   ctx->job ? "" : "_<case>", ctx->lease_sql, passed, pr->ncases, pr->seconds,
		   ctx->color ? C_RESET : "");

	/* two header lines: "observed" spans emails, record and verdicts */
	{
		StringInfoData l1,
					l2;

		initStringInfo(&l1);
		initStringInfo(&l2);
		for (c = 0; c < N_COLS; c++)
		{
			if (c == COL_EMAILS)
			{
				pad_sb(&l1, head1[c], width[COL_EMAILS] + width[COL_RECORD] + width[COL_VERDICTS] + 4);
				c = COL_VERDICTS;
			}
			else
				pad_sb(&l1, head1[c], width[c]);
			if (c < N_COLS - 1)
				appendStringInfoString(&l1, "  ");
		}
		for (c = 0; c < N_COLS; c++)
		{
			pad_sb(&l2, head2[c], width[c]);
			if (c < N_COLS - 1)
				appendStringInfoString(&l2, "  ");
		}
		printf("%s%s\n%s%s\n", ctx->color ? C_BOLD : "", rtrim(&l1), rtrim(&l2),
			   ctx->color ? C_RESET : "");
		pfree(l1.data);
		pfree(l2.data);
	}

	for (i = 0; i < pr->ncases; i++)
	{
		const case_result *cr = &pr->cases[i];
		StringInfoData cells[N_COLS];

		row_cells(ctx, cr, cells);
		for (c = 0; c < N_COLS; c++)
		{
			bool		colour = ctx->color && (c == COL_MARK || cell_bad(cr, c));

			if (colour)
				fputs(cell_bad(cr, c) ? C_RED : C_GREEN, stdout);
			pad(stdout, cells[c].data, c < N_COLS - 1 ? width[c] : 0);
			if (colour)
				fputs(C_RESET, stdout);
			if (c < N_COLS - 1)
				fputs("  ", stdout);
			pfree(cells[c].data);
		}
		fputs("\n", stdout);
	}

	/* how the job ended the operation, where a case that holds names it (16) */
	for (i = 0; i < pr->ncases; i++)
		if (pr->cases[i].pass && pr->cases[i].ending[0])
			printf("  case %s (%s): the job %s\n", pr->cases[i].id, policy_names[pr->policy], pr->cases[i].ending);

	/* why a row failed: its notes, right below the table */
	for (i = 0; i < pr->ncases; i++)
	{
		const case_result *cr = &pr->cases[i];

		if (cr->pass)
			continue;
		printf("%s  case %s (%s):%s\n", ctx->color ? C_RED : "", cr->id,
			   policy_names[pr->policy], ctx->color ? C_RESET : "");
		printf("    expected: %s %d; record %s; verdicts %s\n",
			   effect_word(ctx), cr->exp_emails, cr->exp_record, cr->exp_verdicts);
		if (cr->notes.len)
		{
			const char *p = cr->notes.data;

			while (*p)
			{
				size_t		len = strcspn(p, "\n");

				printf("    %.*s\n", (int) len, p);
				p += len;
				if (*p)
					p++;
			}
		}
	}
	fflush(stdout);
}

static bool
find_case(const policy_result *pr, const char *id, const case_result **out)
{
	int			i;

	for (i = 0; i < pr->ncases; i++)
		if (strcmp(pr->cases[i].id, id) == 0)
		{
			*out = &pr->cases[i];
			return true;
		}
	return false;
}

static void
expected_56(policy_t p, int *e5, int *e6)
{
	static const int five[N_POLICIES] = {0, 1, 0, 1};
	static const int six[N_POLICIES] = {1, 2, 1, 1};

	*e5 = five[p];
	*e6 = six[p];
}

static void
emails_cell(const case_result *cr, char *buf, size_t sz)
{
	if (cr == NULL || !cr->ran || cr->obs_emails < 0)
		snprintf(buf, sz, "-");
	else
		snprintf(buf, sz, "%d", cr->obs_emails);
}

/* the policy summary and the total line; returns the counts */
void
report_summary(matrix_ctx *ctx, const policy_result *prs, int npr,
			   int *passed, int *failed)
{
	int			i,
				j;

	*passed = 0;
	*failed = 0;
	for (i = 0; i < npr; i++)
		for (j = 0; j < prs[i].ncases; j++)
		{
			if (prs[i].cases[j].pass)
				(*passed)++;
			else
				(*failed)++;
		}

	if (ctx->job)
	{
		const char *e = ctx->job->value[JF_EFFECT_NAME] ? ctx->job->value[JF_EFFECT_NAME] : "effect";

		printf("\n%sPolicy summary%s: effects (%s) in the uncertain cases (5: killed after the claim, before the %s; "
			   "6: killed after the %s)\n\n",
			   ctx->color ? C_BOLD : "", ctx->color ? C_RESET : "", e, e, e);
	}
	else
		printf("\n%sPolicy summary%s: emails in the uncertain cases "
			   "(5: died after the claim, before the email; 6: died after the email)\n\n",
			   ctx->color ? C_BOLD : "", ctx->color ? C_RESET : "");
	printf("%s%-8s  %6s  %6s  %s%s\n", ctx->color ? C_BOLD : "",
		   "policy", "case 5", "case 6", "expected", ctx->color ? C_RESET : "");
	for (i = 0; i < npr; i++)
	{
		const case_result *c5 = NULL;
		const case_result *c6 = NULL;
		char		o5[16],
					o6[16],
					exp[16];
		int			e5,
					e6;
		bool		ok;

		find_case(&prs[i], "5", &c5);
		find_case(&prs[i], "6", &c6);
		expected_56(prs[i].checked_as, &e5, &e6);
		emails_cell(c5, o5, sizeof(o5));
		emails_cell(c6, o6, sizeof(o6));
		snprintf(exp, sizeof(exp), "%d and %d", e5, e6);
		ok = (c5 == NULL || (c5->ran && c5->obs_emails == e5)) &&
			(c6 == NULL || (c6->ran && c6->obs_emails == e6));
		printf("%-8s  %6s  %6s  %-9s  %s%s%s\n", policy_names[prs[i].policy], o5, o6, exp,
			   ctx->color ? (ok ? C_GREEN : C_RED) : "",
			   (c5 || c6) ? mark(ctx, ok) : "(cases 5 and 6 not run)",
			   ctx->color ? C_RESET : "");
	}
	printf("\nlease %s, %.1f s in all\n", ctx->lease_sql, ctx->seconds);
	if (ctx->job)
	{
		/* which helpers ran, as the workers said at the point hello (hello.c) */
		StringInfoData hb;

		initStringInfo(&hb);
		hello_text(&hb);
		printf("helpers: %s\n", hb.data);
		pfree(hb.data);
	}
	if (ctx->job)
		printf("\nThis report shows what the runner observed of job type %s on %s with the settings above; "
			   "it is evidence that the chosen policy is followed for this job, not that the queue became exactly-once.\n"
			   "Policy chosen: ______________  Signed off by: ______________________  Date: ____________\n\n",
			   ctx->job->value[JF_JOB_TYPE], ctx->job->value[JF_QUEUE]);
	if (ctx->interrupted[0])
		printf("%sINTERRUPTED%s %s.\n\n", ctx->color ? C_RED : "", ctx->color ? C_RESET : "", ctx->interrupted);
	/* the last line: the total, alone */
	printf("%d passed, %d failed\n", *passed, *failed);
	fflush(stdout);
}

/* ---------------------------------------------------------------------
 * HTML
 * --------------------------------------------------------------------- */

static const char html_style[] =
	":root{--fg:#1b1f24;--bg:#fff;--muted:#59636e;--line:#d1d9e0;--head:#f6f8fa;"
	"--ok:#116329;--okbg:#dafbe1;--bad:#a40e26;--badbg:#ffebe9;--focus:#0969da}\n"
	"@media (prefers-color-scheme: dark){:root{--fg:#e6edf3;--bg:#0d1117;--muted:#9198a1;"
	"--line:#3d444d;--head:#151b23;--ok:#3fb950;--okbg:#12261e;--bad:#ff7b72;--badbg:#2d1214;--focus:#4493f8}}\n"
	"*{box-sizing:border-box}\n"
	"body{margin:0 auto;max-width:90rem;padding:1.5rem;color:var(--fg);background:var(--bg);"
	"font:15px/1.5 system-ui,-apple-system,\"Segoe UI\",Roboto,\"DejaVu Sans\",sans-serif}\n"
	"h1{font-size:1.5rem;margin:0 0 .25rem}h2{font-size:1.2rem;margin:2rem 0 .25rem}"
	"h3{font-size:1rem;margin:1rem 0 .25rem}\n"
	"p,dl,ul{margin:.5rem 0}.muted{color:var(--muted)}\n"
	".status{display:inline-block;padding:.2rem .6rem;border-radius:.3rem;font-weight:600}\n"
	".status.ok{color:var(--ok);background:var(--okbg)}.status.bad{color:var(--bad);background:var(--badbg)}\n"
	"dl.settings{display:grid;grid-template-columns:max-content 1fr;gap:.1rem 1rem}\n"
	"dl.settings dt{color:var(--muted)}dl.settings dd{margin:0;overflow-wrap:anywhere}\n"
	".matrix{overflow-x:auto;border:1px solid var(--line);border-radius:.4rem;margin:.5rem 0}\n"
	".matrix:focus{outline:3px solid var(--focus);outline-offset:2px}\n"
	".matrix:focus:not(:focus-visible){outline:none}\n"
	".matrix:focus-visible{outline:3px solid var(--focus);outline-offset:2px}\n"
	"table{border-collapse:collapse;white-space:nowrap;font-variant-numeric:tabular-nums;min-width:100%}\n"
	"caption{text-align:left;padding:.4rem .6rem;color:var(--muted)}\n"
	"th,td{padding:.3rem .6rem;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}\n"
	"thead th{background:var(--head);font-weight:600}\n"
	"thead tr:first-child th[colspan]{text-align:center;border-bottom:1px solid var(--line)}\n"
	"td.num{text-align:right}\n"
	"td.mark{font-weight:700}tr.ok td.mark{color:var(--ok)}tr.bad td.mark{color:var(--bad)}\n"
	"tr.bad td.mark,td.bad{background:var(--badbg);color:var(--bad)}\n"
	".exp{display:block;font-size:.85em}\n"
	"table.summary{min-width:0}\n"
	".notes{font-size:.9rem}.notes dt{font-weight:600;margin-top:.4rem}.notes dd{margin:0 0 0 1.5rem}\n"
	".notes .failed{color:var(--bad);font-weight:600}\n"
	".total{font-size:1.1rem;font-weight:700}\n"
	".signoff{margin-top:2rem;border-top:1px solid var(--line);padding-top:1rem}\n"
	".signoff p{margin:1.2rem 0}\n"
	"@media print{\n"
	" @page{size:A4 landscape;margin:12mm}\n"
	" :root{--fg:#000;--bg:#fff;--muted:#333;--line:#999;--head:#eee;--ok:#000;--okbg:#fff;--bad:#000;--badbg:#fff}\n"
	" body{max-width:none;padding:0;font:9pt/1.35 \"DejaVu Serif\",Georgia,serif}\n"
	" .hint{display:none}\n"
	" .matrix{overflow:visible;border:none}\n"
	" table{white-space:normal;font-size:8pt;width:100%}\n"
	" thead{display:table-header-group}tr{break-inside:avoid}\n"
	" h2{break-after:avoid;margin-top:1rem}section.policy{break-inside:auto}\n"
	" td.bad,tr.bad td.mark{font-weight:700;text-decoration:underline}\n"
	" .matrix:focus,.matrix:focus-visible{outline:none}\n"
	" td.mark{white-space:nowrap}\n"
	" .signoff{break-inside:avoid}\n"
	"}\n";

/*
 * Left/Right scroll a focused matrix (so does the browser itself on most
 * platforms; doing it here makes the step and Home/End the same everywhere).
 */
static const char html_script[] =
	"document.querySelectorAll('.matrix').forEach(function (el) {\n"
	"  el.addEventListener('keydown', function (e) {\n"
	"    if (e.altKey || e.ctrlKey || e.metaKey) return;\n"
	"    var step = Math.max(40, Math.round(el.clientWidth / 4));\n"
	"    if (e.key === 'ArrowRight') el.scrollLeft += step;\n"
	"    else if (e.key === 'ArrowLeft') el.scrollLeft -= step;\n"
	"    else if (e.key === 'Home') el.scrollLeft = 0;\n"
	"    else if (e.key === 'End') el.scrollLeft = el.scrollWidth;\n"
	"    else return;\n"
	"    e.preventDefault();\n"
	"  });\n"
	"});\n";

static void
html_cell(StringInfo h, const matrix_ctx *ctx, const case_result *cr, int col,
		  const char *obs, const char *exp, bool num)
{
	bool		bad = cell_bad(cr, col);

	appendStringInfo(h, "<td%s%s>", bad ? " class=\"bad\"" : (num ? " class=\"num\"" : ""), "");
	html_escape(h, obs);
	if (bad && cr->ran)
	{
		appendStringInfoString(h, "<span class=\"exp\">expected: ");
		html_escape(h, exp);
		appendStringInfoString(h, "</span>");
	}
	appendStringInfoString(h, "</td>");
	(void) ctx;
}

static void
html_policy(StringInfo h, const matrix_ctx *ctx, const policy_result *pr)
{
	int			i;
	int			passed = 0;

	for (i = 0; i < pr->ncases; i++)
		if (pr->cases[i].pass)
			passed++;
	appendStringInfo(h, "<section class=\"policy\" id=\"policy-%s\">\n<h2>Policy %s: ",
			  policy_names[pr->policy], policy_names[pr->policy]);
	html_escape(h, (ctx->job ? policy_blurbs_job : policy_blurbs)[pr->policy]);
	appendStringInfo(h, "</h2>\n<p class=\"muted\">%d of %d cases hold; job type%s <code>",
			  passed, pr->ncases, ctx->job ? "" : "s");
	html_escape(h, ctx->prefix);
	appendStringInfo(h, "_%s%s</code>, lease %s, %.1f s.",
			  policy_names[pr->policy], ctx->job ? "" : "_&lt;case&gt;", ctx->lease_sql, pr->seconds);
	if (pr->checked_as != pr->policy)
		appendStringInfo(h, " <strong>Checked against the expectations of %s.</strong>",
				  policy_names[pr->checked_as]);
	appendStringInfoString(h, "</p>\n");
	appendStringInfo(h, "<div class=\"matrix\" role=\"region\" tabindex=\"0\" "
			  "aria-label=\"Replay matrix, policy %s (scrolls horizontally with Left and Right)\">\n",
			  policy_names[pr->policy]);
	appendStringInfo(h, "<table>\n<caption>Policy %s: what each delivery left behind</caption>\n",
			  policy_names[pr->policy]);
	appendStringInfoString(h, "<thead>\n<tr><th scope=\"col\" rowspan=\"2\"><span class=\"sr\">result</span></th>"
			"<th scope=\"col\" rowspan=\"2\">case</th><th scope=\"col\" rowspan=\"2\">attempt</th>"
			"<th scope=\"colgroup\" colspan=\"3\">observed</th>"
			"<th scope=\"col\" rowspan=\"2\">expected</th></tr>\n"
			"<tr><th scope=\"col\">");
	appendStringInfoString(h, effect_word(ctx));
	appendStringInfoString(h, "</th><th scope=\"col\">record afterwards</th>"
			"<th scope=\"col\">verdicts</th></tr>\n</thead>\n<tbody>\n");
	for (i = 0; i < pr->ncases; i++)
	{
		const case_result *cr = &pr->cases[i];
		char		obs_e[16],
					exp_e[16];

		if (!cr->ran || cr->obs_emails < 0)
			snprintf(obs_e, sizeof(obs_e), "%s", cr->ran ? "?" : "-");
		else
			snprintf(obs_e, sizeof(obs_e), "%d", cr->obs_emails);
		snprintf(exp_e, sizeof(exp_e), "%d", cr->exp_emails);
		appendStringInfo(h, "<tr class=\"%s\" id=\"%s-%s\"><td class=\"mark\" title=\"%s\">%s %s</td>"
				  "<th scope=\"row\">%s</th><td>",
				  cr->pass ? "ok" : "bad", policy_names[pr->policy], cr->id,
				  cr->pass ? "holds" : "fails",
				  cr->pass ? "&#10003;" : "&#10007;", cr->pass ? "pass" : "FAIL", cr->id);
		html_escape(h, cr->title);
		appendStringInfoString(h, "</td>");
		html_cell(h, ctx, cr, COL_EMAILS, obs_e, exp_e, true);
		html_cell(h, ctx, cr, COL_RECORD, cr->ran ? cr->obs_record : "not run", cr->exp_record, false);
		html_cell(h, ctx, cr, COL_VERDICTS, cr->ran ? cr->obs_verdicts : "-", cr->exp_verdicts, false);
		appendStringInfoString(h, "<td>");
		html_escape(h, cr->expected_text);
		appendStringInfoString(h, "</td></tr>\n");
	}
	appendStringInfoString(h, "</tbody>\n</table>\n</div>\n");

	/* the evidence behind each row */
	appendStringInfo(h, "<h3>What each case checked (%s)</h3>\n<dl class=\"notes\">\n",
			  policy_names[pr->policy]);
	for (i = 0; i < pr->ncases; i++)
	{
		const case_result *cr = &pr->cases[i];
		const char *p = cr->notes.data;

		appendStringInfo(h, "<dt>%s %s</dt>\n", cr->id, cr->pass ? "" : "<span class=\"failed\">(fails)</span>");
		appendStringInfo(h, "<dd>expected: %s %d; record %s; verdicts ",
				  effect_word(ctx), cr->exp_emails, cr->exp_record);
		html_escape(h, cr->exp_verdicts);
		appendStringInfoString(h, "</dd>\n");
		while (*p)
		{
			size_t		len = strcspn(p, "\n");
			char	   *line = pnstrdup(p, len);

			appendStringInfo(h, "<dd%s>", strncmp(line, "FAILED", 6) == 0 ? " class=\"failed\"" : "");
			html_escape(h, line);
			appendStringInfoString(h, "</dd>\n");
			pg_free(line);
			p += len;
			if (*p)
				p++;
		}
	}
	appendStringInfoString(h, "</dl>\n</section>\n");
}

static int
write_file(const char *path, const StringInfoData *b)
{
	FILE	   *f = fopen(path, "w");

	if (f == NULL)
	{
		pg_log_error("cannot write %s: %s", path, strerror(errno));
		return -1;
	}
	if (fwrite(b->data, 1, b->len, f) != (size_t) b->len || fclose(f) != 0)
	{
		pg_log_error("cannot write %s: %s", path, strerror(errno));
		return -1;
	}
	return 0;
}

static void
counts(const policy_result *prs, int npr, int *passed, int *failed)
{
	int			i,
				j;

	*passed = *failed = 0;
	for (i = 0; i < npr; i++)
		for (j = 0; j < prs[i].ncases; j++)
			(*(prs[i].cases[j].pass ? passed : failed))++;
}

/* settings as label/value pairs, the same in HTML and JSON */
typedef struct setting
{
	const char *key;
	const char *label;
	char		value[1100];
} setting;

#define MAX_SETTINGS 32

static int
settings_list(const matrix_ctx *ctx, const policy_result *prs, int npr,
			  setting *s)
{
	int			n = 0;
	int			i;
	char		pols[64] = "";

	for (i = 0; i < npr; i++)
	{
		strcat(pols, i ? ", " : "");
		strcat(pols, policy_names[prs[i].policy]);
	}
#define SET(k, l, ...) do { s[n].key = k; s[n].label = l; \
		snprintf(s[n].value, sizeof(s[n].value), __VA_ARGS__); n++; } while (0)
	if (ctx->interrupted[0])
		SET("interrupted", "interrupted", "%s", ctx->interrupted);
	if (ctx->job)
	{
		const signoff_job *job = ctx->job;

		SET("date", "date", "%s", ctx->started_at);
		SET("job_type", "job type", "%s", job->value[JF_JOB_TYPE]);
		SET("queue", "queue", "%s", job->value[JF_QUEUE]);
		SET("worker", "worker command", "%s", job->value[JF_WORKER]);
		SET("enqueue", "enqueue command", "%s", job->value[JF_ENQUEUE]);
		if (job->value[JF_ENQUEUE_OTHER])
			SET("enqueue_other", "enqueue, other arguments", "%s", job->value[JF_ENQUEUE_OTHER]);
		if (job->value[JF_EFFECTS])
			SET("effects", "effects counted by", "the command %s", job->value[JF_EFFECTS]);
		else if (job->value[JF_EFFECTS_SQL])
			SET("effects", "effects counted by", "the query %s", job->value[JF_EFFECTS_SQL]);
		else
			SET("effects", "effects counted by",
				"the handled reports: handler runs that returned, not proof that an effect landed");
		SET("policies", "policies", "%s", pols);
		SET("lease", "lease", "%s", ctx->lease_sql);
		SET("timeout", "timeout", "%g s", job->timeout_s);
		SET("cases", "cases", "%s", ctx->cases ? ctx->cases : "all (1-7, 9-13)");
		if (ctx->cleanup_said[0])
			SET("cleanup", "cleanup", "%s", ctx->cleanup_said);
		SET("job_file", "job file", "%s", job->path);
		SET("job_file_sha256", "job file sha256", "%s", job->prov.job_sha256);
		if (job->value[JF_CODE])
			SET("code_signed", "code signed", "%s: %d files, sha256 %s", job->value[JF_CODE],
				job->prov.nfiles, job->prov.code_sha256);
		else
			SET("code_signed", "code signed", "not named (code = in the job file)");
		if (job->prov.git_commit[0])
			SET("git", "git", "commit %s%s", job->prov.git_commit,
				job->prov.git_dirty == 1 ? ", with uncommitted changes to the job file or the code" :
				job->prov.git_dirty == 0 ? ", clean" : "");
		else
			SET("git", "git", "not a git work tree");
		SET("directory", "commands run in", "%s", job->dir);
		SET("extension_version", "extension", "idempotency %s (%s edition)", ctx->ext_version, ctx->ext_edition);
		SET("server_version", "PostgreSQL", "%s", ctx->server_version_full);
		SET("server", "server", "%s", ctx->server_desc);
		SET("isolation", "default isolation", "%s", ctx->isolation);
		SET("job_type_prefix", "the run's job types", "%s_<policy> (removed afterwards%s)",
			ctx->prefix, ctx->keep ? ": no, --keep" : "");
		SET("keys", "operation keys", "signoff-%s-<policy>-<case>-<n>", ctx->run_id);
		SET("runner", "runner", "idempotency-matrix %s", MATRIX_VERSION);
		{
			/* what the workers' helpers said at the point hello (hello.c) */
			StringInfoData hb;

			initStringInfo(&hb);
			hello_text(&hb);
			SET("helpers", "helpers", "%s", hb.data);
			pfree(hb.data);
		}
		SET("run_time", "run time", "%.1f s", ctx->seconds);
		return n;
	}
	SET("date", "date", "%s", ctx->started_at);
	SET("extension_version", "extension", "idempotency %s (%s edition)", ctx->ext_version, ctx->ext_edition);
	SET("server_version", "PostgreSQL", "%s", ctx->server_version_full);
	SET("server", "server", "%s", ctx->server_desc);
	SET("isolation", "default isolation", "%s", ctx->isolation);
	SET("lease", "lease", "%s", ctx->lease_sql);
	SET("policies", "policies", "%s", pols);
	SET("cases", "cases", "%s", ctx->cases ? ctx->cases : "all (1-13)");
	SET("stress_workers", "stress workers (case 3s)", "%d", ctx->stress);
	SET("job_type_prefix", "job types", "%s_<policy>_<case> (removed afterwards%s)",
		ctx->prefix, ctx->keep ? ": no, --keep" : "");
	SET("mail_provider", "mail provider",
		"append-only file per case, one fsync'd line per email; lookup policy: with ref=<operation key>");
	SET("runner", "runner", "idempotency-matrix %s", MATRIX_VERSION);
	SET("run_time", "run time", "%.1f s", ctx->seconds);
	if (ctx->check_as_note[0])
		SET("check_as", "expectations", "%s", ctx->check_as_note);
#undef SET
	return n;
}

int
report_html(matrix_ctx *ctx, const char *path, const policy_result *prs, int npr)
{
	StringInfoData h;
	int			i;
	int			passed,
				failed;
	setting		set[MAX_SETTINGS];
	int			nset = settings_list(ctx, prs, npr, set);
	int			rc;

	counts(prs, npr, &passed, &failed);
	initStringInfo(&h);
	appendStringInfoString(&h, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
			"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
	appendStringInfoString(&h, "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
			"style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\n");
	if (ctx->job)
	{
		appendStringInfoString(&h, "<title>Sign-off: ");
		html_escape(&h, ctx->job->value[JF_JOB_TYPE]);
		appendStringInfoString(&h, " on ");
		html_escape(&h, ctx->job->value[JF_QUEUE]);
		appendStringInfo(&h, ", idempotency %s (%s edition), %d passed, %d failed</title>\n",
				  ctx->ext_version, ctx->ext_edition, passed, failed);
	}
	else
		appendStringInfo(&h, "<title>Replay matrix: idempotency %s (%s edition), %d passed, %d failed</title>\n",
				  ctx->ext_version, ctx->ext_edition, passed, failed);
	appendStringInfo(&h, "<style>\n%s.sr{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0)}\n</style>\n</head>\n<body>\n",
			  html_style);
	if (ctx->job)
	{
		appendStringInfoString(&h, "<header>\n<h1>Sign-off: job type ");
		html_escape(&h, ctx->job->value[JF_JOB_TYPE]);
		appendStringInfoString(&h, " on ");
		html_escape(&h, ctx->job->value[JF_QUEUE]);
		appendStringInfoString(&h, "</h1>\n");
	}
	else
		appendStringInfoString(&h, "<header>\n<h1>Replay matrix: send_confirmation for ORD-1001</h1>\n");
	appendStringInfo(&h, "<p><span class=\"status %s\">%s</span></p>\n",
			  failed || ctx->interrupted[0] ? "bad" : "ok",
			  failed ? "Some cases do not hold: see the rows marked FAIL." :
			  ctx->interrupted[0] ? "Every case that finished holds; the run was interrupted." : "Every case holds.");
	if (ctx->interrupted[0])
	{
		appendStringInfoString(&h, "<p><strong>INTERRUPTED</strong> ");
		html_escape(&h, ctx->interrupted);
		appendStringInfoString(&h, ".</p>\n");
	}
	if (ctx->job)
		appendStringInfoString(&h, "<p>Each row is one replay test of this job, through its queue and its worker processes: "
				"how the message arrives, then what was observed afterwards (the job's effects, counted as the "
				"settings say once the case's workers had stopped; the record in <code>idempotency.operations</code> "
				"as status and attempt; and the verdicts the helper reported, in the order they came), then what must be true. "
				"Deaths are SIGKILLs to the worker's process group at the named point of the helper. "
				"A cell that differs from its expectation shows the expected value under it.</p>\n");
	else
		appendStringInfoString(&h, "<p>Each row is one replay test: how the message arrives, then what was observed "
				"afterwards (emails the fake provider holds, the record in <code>idempotency.operations</code> "
				"as status and attempt, and the verdict each worker got), then what must be true. "
				"Every delivery is a separate process with its own connection; deaths are SIGKILLs at the named point. "
				"A cell that differs from its expectation shows the expected value under it.</p>\n");
	appendStringInfoString(&h, "</header>\n<section>\n<h2>Settings</h2>\n<dl class=\"settings\">\n");
	for (i = 0; i < nset; i++)
	{
		appendStringInfoString(&h, "<dt>");
		html_escape(&h, set[i].label);
		appendStringInfo(&h, "</dt><dd id=\"setting-%s\">", set[i].key);
		html_escape(&h, set[i].value);
		appendStringInfoString(&h, "</dd>\n");
	}
	appendStringInfoString(&h, "</dl>\n</section>\n");
	appendStringInfoString(&h, "<p class=\"hint muted\">If a matrix is wider than the window, scroll it horizontally. "
			"Keyboard: focus the matrix (Tab) and use Left/Right; Home/End jump to its edges.</p>\n");
	for (i = 0; i < npr; i++)
		html_policy(&h, ctx, &prs[i]);

	appendStringInfoString(&h, ctx->job
			? "<section>\n<h2>Policy summary</h2>\n<p>Effects in the uncertain cases: "
			"5 (the worker was killed after the claim, before the handler) and 6 (after the handler, before completion).</p>\n"
			: "<section>\n<h2>Policy summary</h2>\n<p>Emails in the uncertain cases: "
			"5 (the worker died after the claim, before the email) and 6 (after the email, before completion).</p>\n");
	appendStringInfoString(&h, "<table class=\"summary\">\n<thead><tr><th scope=\"col\">policy</th><th scope=\"col\">case 5</th>"
			"<th scope=\"col\">case 6</th><th scope=\"col\">expected</th><th scope=\"col\">result</th></tr></thead>\n<tbody>\n");
	for (i = 0; i < npr; i++)
	{
		const case_result *c5 = NULL;
		const case_result *c6 = NULL;
		char		o5[16],
					o6[16];
		int			e5,
					e6;
		bool		ok;

		find_case(&prs[i], "5", &c5);
		find_case(&prs[i], "6", &c6);
		expected_56(prs[i].checked_as, &e5, &e6);
		emails_cell(c5, o5, sizeof(o5));
		emails_cell(c6, o6, sizeof(o6));
		ok = (c5 == NULL || (c5->ran && c5->obs_emails == e5)) &&
			(c6 == NULL || (c6->ran && c6->obs_emails == e6));
		appendStringInfo(&h, "<tr class=\"%s\"><th scope=\"row\">%s</th><td class=\"num\">%s</td><td class=\"num\">%s</td>"
				  "<td>%d and %d</td><td class=\"mark\">%s</td></tr>\n",
				  ok ? "ok" : "bad", policy_names[prs[i].policy], o5, o6, e5, e6,
				  ok ? "&#10003; pass" : "&#10007; FAIL");
	}
	appendStringInfoString(&h, "</tbody>\n</table>\n</section>\n");
	appendStringInfo(&h, "<p class=\"total\" id=\"total\">%d passed, %d failed</p>\n", passed, failed);
	if (ctx->job)
	{
		appendStringInfoString(&h, "<section class=\"signoff\">\n<h2>Sign-off</h2>\n<p>This report shows what the runner observed of job type <code>");
		html_escape(&h, ctx->job->value[JF_JOB_TYPE]);
		appendStringInfoString(&h, "</code> on ");
		html_escape(&h, ctx->job->value[JF_QUEUE]);
		appendStringInfoString(&h, ", with its worker and enqueue commands and the settings above, on the server above. "
				"It is evidence that the chosen policy is followed for this job, not that the queue became exactly-once.</p>\n");
	}
	else
		appendStringInfoString(&h, "<section class=\"signoff\">\n<h2>Sign-off</h2>\n"
				"<p>This report shows what the runner observed on the server above, with the settings above. "
				"It is evidence that the chosen policy is followed for this job, not that a queue became exactly-once.</p>\n");
	appendStringInfoString(&h, "<p>Policy chosen: ______________________ &nbsp; Signed off by: ______________________ &nbsp; Date: ____________</p>\n"
			"</section>\n");
	appendStringInfo(&h, "<script>\n%s</script>\n</body>\n</html>\n", html_script);
	rc = write_file(path, &h);
	pfree(h.data);
	return rc;
}

/* ---------------------------------------------------------------------
 * JSON
 * --------------------------------------------------------------------- */

int
report_json(matrix_ctx *ctx, const char *path, const policy_result *prs, int npr)
{
	StringInfoData j;
	int			i,
				k;
	int			passed,
				failed;
	setting		set[MAX_SETTINGS];
	int			nset = settings_list(ctx, prs, npr, set);
	int			rc;

	counts(prs, npr, &passed, &failed);
	initStringInfo(&j);
	appendStringInfo(&j, "{\n  \"format\": \"%s\",\n  \"interrupted\": %s,\n  \"settings\": {",
			  ctx->job ? "idempotency-signoff/2" : "idempotency-matrix/1",
			  ctx->interrupted[0] ? "true" : "false");
	for (i = 0; i < nset; i++)
	{
		appendStringInfo(&j, "%s\n    ", i ? "," : "");
		json_string(&j, set[i].key);
		appendStringInfoString(&j, ": ");
		json_string(&j, set[i].value);
	}
	if (ctx->job)
	{
		/* the job file's settings, as given (null where absent) */
		const signoff_job *job = ctx->job;
		int			f;

		appendStringInfoString(&j, "\n  },\n  \"signoff\": {\n    \"job_file\": ");
		json_string(&j, job->path);
		for (f = 0; f < N_JOB_FIELDS; f++)
		{
			appendStringInfo(&j, ",\n    \"%s\": ", job_field_names[f]);
			if (job->value[f])
				json_string(&j, job->value[f]);
			else
				appendStringInfoString(&j, "null");
		}
		appendStringInfoString(&j, ",\n    \"directory\": ");
		json_string(&j, job->dir);
		appendStringInfoString(&j, ",\n    \"job_file_path\": ");
		json_string(&j, job->prov.job_file);
		appendStringInfo(&j, ",\n    \"job_file_sha256\": \"%s\"", job->prov.job_sha256);
		if (job->value[JF_CODE])
			appendStringInfo(&j, ",\n    \"code_sha256\": \"%s\"", job->prov.code_sha256);
		else
			appendStringInfoString(&j, ",\n    \"code_sha256\": null");
		appendStringInfoString(&j, ",\n    \"code_files\": [");
		for (f = 0; f < job->prov.nfiles; f++)
		{
			appendStringInfoString(&j, f ? ",\n      {\"path\": " : "\n      {\"path\": ");
			json_string(&j, job->prov.files[f].path);
			appendStringInfo(&j, ", \"sha256\": \"%s\"}", job->prov.files[f].sha256);
		}
		appendStringInfoString(&j, job->prov.nfiles ? "\n    ]" : "]");
		if (job->prov.git_commit[0])
		{
			appendStringInfoString(&j, ",\n    \"git_commit\": ");
			json_string(&j, job->prov.git_commit);
			appendStringInfo(&j, ",\n    \"git_dirty\": %s", job->prov.git_dirty == 1 ? "true" :
					  job->prov.git_dirty == 0 ? "false" : "null");
		}
		else
			appendStringInfoString(&j, ",\n    \"git_commit\": null,\n    \"git_dirty\": null");
		appendStringInfo(&j, ",\n    \"effects_source\": \"%s\",\n    \"lease_seconds\": %g,\n    \"timeout_seconds\": %g,\n    \"run\": ",
				  job->effects_source, job->lease_s, job->timeout_s);
		json_string(&j, ctx->run_id);
		appendStringInfoString(&j, ",\n    \"helpers\": ");
		hello_json(&j);
		appendStringInfo(&j, ",\n    \"helper_workers\": %d,\n    \"worker_processes\": %d", hello_workers(),
				  ctx->worker_processes);
		appendStringInfoString(&j, ",\n    \"signed_off_by\": null,\n    \"date\": null");
	}
	appendStringInfo(&j, "\n  },\n  \"lease_seconds\": %g,\n  \"policies\": [", ctx->lease_s);
	for (i = 0; i < npr; i++)
	{
		const policy_result *pr = &prs[i];

		appendStringInfo(&j, "%s\n    {\"policy\": \"%s\", \"checked_as\": \"%s\", \"seconds\": %.2f, \"cases\": [",
				  i ? "," : "", policy_names[pr->policy], policy_names[pr->checked_as], pr->seconds);
		for (k = 0; k < pr->ncases; k++)
		{
			const case_result *cr = &pr->cases[k];
			const char *p = cr->notes.data;
			bool		first = true;

			appendStringInfo(&j, "%s\n      {\"case\": ", k ? "," : "");
			json_string(&j, cr->id);
			appendStringInfoString(&j, ", \"attempt\": ");
			json_string(&j, cr->title);
			appendStringInfoString(&j, ", \"expected_text\": ");
			json_string(&j, cr->expected_text);
			appendStringInfo(&j, ",\n       \"expected\": {\"%s\": %d, \"record\": ", effect_word(ctx), cr->exp_emails);
			json_string(&j, cr->exp_record);
			appendStringInfoString(&j, ", \"verdicts\": ");
			json_string(&j, cr->exp_verdicts);
			appendStringInfo(&j, "},\n       \"observed\": {\"%s\": ", effect_word(ctx));
			if (cr->ran && cr->obs_emails >= 0)
				appendStringInfo(&j, "%d", cr->obs_emails);
			else
				appendStringInfoString(&j, "null");
			appendStringInfoString(&j, ", \"record\": ");
			json_string(&j, cr->obs_record);
			appendStringInfoString(&j, ", \"verdicts\": ");
			json_string(&j, cr->obs_verdicts);
			if (ctx->job && !ctx->job->reference)
			{
				/* a sign-off's judged points: the case's end, the drain */
				appendStringInfoString(&j, ", \"effects_at_end\": ");
				json_count(&j, cr->at_end);
				appendStringInfoString(&j, ", \"effects_after_drain\": ");
				json_count(&j, cr->after_drain);
				appendStringInfo(&j, ", \"late_deliveries\": %d", cr->late);
			}
			if (ctx->job)
			{
				/* how the job ended the operation, where the case names it (16) */
				appendStringInfoString(&j, ", \"ending\": ");
				if (cr->ending[0])
					json_string(&j, cr->ending);
				else
					appendStringInfoString(&j, "null");
			}
			appendStringInfo(&j, "},\n       \"ran\": %s, \"%s_ok\": %s, \"record_ok\": %s, \"verdicts_ok\": %s, "
					  "\"checks_ok\": %s, \"pass\": %s, \"seconds\": %.3f,\n       \"notes\": [",
					  cr->ran ? "true" : "false", effect_word(ctx), cr->emails_ok ? "true" : "false",
					  cr->record_ok ? "true" : "false", cr->verdicts_ok ? "true" : "false",
					  cr->checks_ok ? "true" : "false", cr->pass ? "true" : "false", cr->seconds);
			while (*p)
			{
				size_t		len = strcspn(p, "\n");
				char	   *line = pnstrdup(p, len);

				appendStringInfoString(&j, first ? "" : ", ");
				json_string(&j, line);
				pg_free(line);
				first = false;
				p += len;
				if (*p)
					p++;
			}
			appendStringInfoString(&j, "]}");
		}
		appendStringInfoString(&j, "\n    ]}");
	}
	appendStringInfoString(&j, "\n  ],\n  \"summary\": [");
	for (i = 0; i < npr; i++)
	{
		const case_result *c5 = NULL;
		const case_result *c6 = NULL;
		int			e5,
					e6;

		find_case(&prs[i], "5", &c5);
		find_case(&prs[i], "6", &c6);
		expected_56(prs[i].checked_as, &e5, &e6);
		appendStringInfo(&j, "%s\n    {\"policy\": \"%s\", \"case5_%s\": ", i ? "," : "",
				  policy_names[prs[i].policy], effect_word(ctx));
		if (c5 && c5->ran && c5->obs_emails >= 0)
			appendStringInfo(&j, "%d", c5->obs_emails);
		else
			appendStringInfoString(&j, "null");
		appendStringInfo(&j, ", \"case6_%s\": ", effect_word(ctx));
		if (c6 && c6->ran && c6->obs_emails >= 0)
			appendStringInfo(&j, "%d", c6->obs_emails);
		else
			appendStringInfoString(&j, "null");
		appendStringInfo(&j, ", \"expected_case5\": %d, \"expected_case6\": %d}", e5, e6);
	}
	appendStringInfo(&j, "\n  ],\n  \"passed\": %d,\n  \"failed\": %d,\n  \"ok\": %s\n}\n",
			  passed, failed, failed == 0 && passed > 0 ? "true" : "false");
	rc = write_file(path, &j);
	pfree(j.data);
	return rc;
}

/* write all of buf to fd, in as few write() calls as the kernel allows */
static void
write_all(int fd, const char *buf, size_t len)
{
	while (len > 0)
	{
		ssize_t		n = write(fd, buf, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return;
		buf += n;
		len -= (size_t) n;
	}
}

/*
 * A progress line on stderr. The whole line is one write(): a log that
 * merges stdout and stderr (e.g. through tee) may put another line between
 * two progress lines, but never inside one.
 */
void
progress(matrix_ctx *ctx, const char *fmt,...)
{
	char		line[1024];
	size_t		len;
	size_t		avail;
	va_list		ap;
	int			n;

	if (!ctx->progress)
		return;
	len = (size_t) snprintf(line, sizeof(line), "%s... ", ctx->progress_tty ? "\r\033[K" : "");
	avail = sizeof(line) - len - 1;	/* one byte kept for the newline */
	va_start(ap, fmt);
	n = vsnprintf(line + len, avail, fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	if ((size_t) n >= avail)
		n = (int) avail - 1;	/* truncated */
	len += (size_t) n;
	if (!ctx->progress_tty)
		line[len++] = '\n';
	write_all(STDERR_FILENO, line, len);
}

void
progress_clear(matrix_ctx *ctx)
{
	if (ctx->progress && ctx->progress_tty)
		fputs("\r\033[K", stderr);
}

/*
 * --junit FILE: the cases as JUnit XML, for a CI system to show: a
 * testsuite per policy, a testcase per case, a failure with the cells that
 * differ and the notes. A sign-off's testsuites carry the properties
 * "helpers" (the report's helpers line, hello.c) and "wrapper" (what made
 * the claims: "plain", "idempotentBatch", ...; "not reported").
 */
int
report_junit(matrix_ctx *ctx, const char *path, const policy_result *prs, int npr)
{
	StringInfoData x;
	int			i,
				k;
	int			passed,
				failed;
	int			rc;
	const char *what = ctx->job ? "sign-off" : "replay matrix";
	StringInfoData helpers,
				wrappers;

	initStringInfo(&helpers);
	initStringInfo(&wrappers);
	if (ctx->job)
	{
		/* who ran the cases, as the workers said at the point hello */
		hello_text(&helpers);
		hello_wrappers(&wrappers);
	}
	counts(prs, npr, &passed, &failed);
	initStringInfo(&x);
	appendStringInfoString(&x, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"");
	html_escape(&x, what);
	if (ctx->job)
	{
		appendStringInfoString(&x, ": ");
		html_escape(&x, ctx->job->value[JF_JOB_TYPE]);
		appendStringInfoString(&x, " on ");
		html_escape(&x, ctx->job->value[JF_QUEUE]);
	}
	appendStringInfo(&x, "\" tests=\"%d\" failures=\"%d\" time=\"%.3f\">\n", passed + failed, failed, ctx->seconds);
	for (i = 0; i < npr; i++)
	{
		const policy_result *pr = &prs[i];
		int			f = 0;

		for (k = 0; k < pr->ncases; k++)
			f += !pr->cases[k].pass;
		appendStringInfo(&x, "  <testsuite name=\"policy %s\" tests=\"%d\" failures=\"%d\" time=\"%.3f\">\n",
				  policy_names[pr->policy], pr->ncases, f, pr->seconds);
		if (ctx->job || ctx->interrupted[0])
		{
			appendStringInfoString(&x, "    <properties>\n");
			if (ctx->job)
			{
				appendStringInfoString(&x, "      <property name=\"helpers\" value=\"");
				html_escape(&x, helpers.data);
				appendStringInfoString(&x, "\"/>\n      <property name=\"wrapper\" value=\"");
				html_escape(&x, wrappers.data[0] ? wrappers.data : "not reported");
				appendStringInfoString(&x, "\"/>\n");
			}
			if (ctx->interrupted[0])
			{
				/* the run was stopped: these are the cases that finished */
				appendStringInfoString(&x, "      <property name=\"interrupted\" value=\"");
				html_escape(&x, ctx->interrupted);
				appendStringInfoString(&x, "\"/>\n");
			}
			appendStringInfoString(&x, "    </properties>\n");
		}
		for (k = 0; k < pr->ncases; k++)
		{
			const case_result *cr = &pr->cases[k];

			appendStringInfo(&x, "    <testcase classname=\"%s.%s\" name=\"case %s: ", ctx->job ? "signoff" : "matrix",
					  policy_names[pr->policy], cr->id);
			html_escape(&x, cr->title);
			appendStringInfo(&x, "\" time=\"%.3f\"", cr->seconds);
			if (cr->pass)
			{
				appendStringInfoString(&x, "/>\n");
				continue;
			}
			appendStringInfoString(&x, ">\n      <failure message=\"");
			if (!cr->ran)
				appendStringInfoString(&x, "not run");
			else
			{
				appendStringInfo(&x, "%s %d", effect_word(ctx), cr->obs_emails);
				if (!cr->emails_ok)
					appendStringInfo(&x, " (expected %d)", cr->exp_emails);
				appendStringInfoString(&x, "; record ");
				html_escape(&x, cr->obs_record);
				if (!cr->record_ok)
				{
					appendStringInfoString(&x, " (expected ");
					html_escape(&x, cr->exp_record);
					appendStringInfoString(&x, ")");
				}
				appendStringInfoString(&x, "; verdicts ");
				html_escape(&x, cr->obs_verdicts);
				if (!cr->verdicts_ok)
				{
					appendStringInfoString(&x, " (expected ");
					html_escape(&x, cr->exp_verdicts);
					appendStringInfoString(&x, ")");
				}
			}
			appendStringInfoString(&x, "\">");
			html_escape(&x, cr->notes.data);
			appendStringInfoString(&x, "</failure>\n    </testcase>\n");
		}
		appendStringInfoString(&x, "  </testsuite>\n");
	}
	appendStringInfoString(&x, "</testsuites>\n");
	rc = write_file(path, &x);
	pfree(x.data);
	pfree(helpers.data);
	pfree(wrappers.data);
	return rc;
}

/*
 * The summary, the --html and --json reports, and the results freed: exit
 * status 0 (every case held), 1 (some failed) or 2 (a report not written)
 */
int
report_all(matrix_ctx *ctx, policy_result *prs, int npr, const char *html,
		   const char *json)
{
	int			passed = 0,
				failed = 0;
	int			rc;
	int			p,
				k;

	report_summary(ctx, prs, npr, &passed, &failed);
	rc = failed == 0 && passed > 0 ? 0 : 1;
	if (html && report_html(ctx, html, prs, npr) != 0)
		rc = 2;
	if (json && report_json(ctx, json, prs, npr) != 0)
		rc = 2;
	if (ctx->junit && report_junit(ctx, ctx->junit, prs, npr) != 0)
		rc = 2;
	for (p = 0; p < npr; p++)
		for (k = 0; k < prs[p].ncases; k++)
			pfree(prs[p].cases[k].notes.data);
	pg_free(prs);
	return rc;
}
