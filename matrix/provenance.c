/*
 * provenance.c
 *		What a sign-off report says was signed: the job file and the job's
 *		code, by sha256, and the git commit they came from; and
 *		--verify REPORT, which tells whether they are still the same.
 *
 * The job file's `code` names the code (paths or globs, relative to the
 * directory the commands run in; a directory stands for the files under
 * it, but not under .git, node_modules, __pycache__ or .venv). Each file's
 * sha256 is recorded, and the code's: the sha256 of the lines
 * "<sha256>  <path>\n" in the order of the paths (sha256sum's format, so
 * `sha256sum FILES | sha256sum` agrees). Where the directory is in a git
 * work tree, the commit (HEAD) and whether the job file or the code
 * differ from it (dirty). A deploy pipeline runs --verify before it ships:
 * exit 0 unchanged, 1 changed (each change named), 2 not a report it can
 * read. (Anchors: SLSA and in-toto provenance, whose subjects are digests.)
 */
#include "postgres_fe.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/logging.h"
#include "matrix.h"
#include "json.h"

static int
path_cmp(const void *a, const void *b)
{
	return strcmp(((const code_file *) a)->path, ((const code_file *) b)->path);
}

static bool
add_file(provenance *pv, const char *dir, const char *abs)
{
	size_t		dl = strlen(dir);
	const char *rel = strncmp(abs, dir, dl) == 0 && abs[dl] == '/' ? abs + dl + 1 : abs;
	int			i;

	for (i = 0; i < pv->nfiles; i++)
		if (strcmp(pv->files[i].path, rel) == 0)
			return true;
	if (pv->nfiles == pv->cap)
	{
		pv->cap = pv->cap ? pv->cap * 2 : 64;
		pv->files = pg_realloc_array(pv->files, code_file, pv->cap);
	}
	copy_str(pv->files[pv->nfiles].path, sizeof(pv->files[0].path), rel);
	if (!sha256_file(abs, pv->files[pv->nfiles].sha256))
		return false;
	pv->nfiles++;
	return true;
}

/* nftw() has no argument: the walk's provenance and directory */
static provenance *walk_pv;
static const char *walk_dir;
static bool walk_ok;

static int
walk_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	const char *base = path + ftw->base;

	if (flag == FTW_D && ftw->level > 0 &&
		(strcmp(base, ".git") == 0 || strcmp(base, "node_modules") == 0 ||
		 strcmp(base, "__pycache__") == 0 || strcmp(base, ".venv") == 0))
		return FTW_SKIP_SUBTREE;
	if (flag == FTW_F && S_ISREG(st->st_mode) && !add_file(walk_pv, walk_dir, path))
		walk_ok = false;
	return FTW_CONTINUE;
}

/*
 * `cmd` (an argv) run in dir: its first line of output in out; false if it
 * did not exit 0.
 */
static bool
capture(const char *dir, char *const argv[], char *out, size_t sz)
{
	int			fd[2];
	pid_t		pid;
	int			status;
	ssize_t		n;
	size_t		got = 0;

	out[0] = '\0';
	if (pipe(fd) != 0)
		return false;
	fflush(stdout);
	pid = fork();
	if (pid < 0)
	{
		close(fd[0]);
		close(fd[1]);
		return false;
	}
	if (pid == 0)
	{
		int			null = open("/dev/null", O_WRONLY);

		dup2(fd[1], 1);
		if (null >= 0)
			dup2(null, 2);
		close(fd[0]);
		if (chdir(dir) != 0)
			_exit(127);
		execvp(argv[0], argv);
		_exit(127);
	}
	close(fd[1]);
	while (got + 1 < sz && (n = read(fd[0], out + got, sz - 1 - got)) > 0)
		got += (size_t) n;
	out[got] = '\0';
	/* the rest, unread, so that the child is not stuck on a full pipe */
	{
		char		sink[4096];

		while (read(fd[0], sink, sizeof(sink)) > 0)
			;
	}
	close(fd[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/*
 * The job file's and the code's digests, and git's word on them. code:
 * the job file's `code` (NULL: none). false: err says why (a file that
 * cannot be read, a pattern that matches nothing).
 */
bool
provenance_collect(const char *job_file, const char *dir, const char *code,
				   provenance *pv, char *err, size_t esz)
{
	char	   *spec;
	char	   *tok;
	char	   *cursor;
	StringInfoData list;
	int			i;

	memset(pv, 0, sizeof(*pv));
	pv->git_dirty = -1;
	if (realpath(job_file, pv->job_file) == NULL || !sha256_file(pv->job_file, pv->job_sha256))
	{
		snprintf(err, esz, "cannot read the job file %s: %s", job_file, strerror(errno));
		return false;
	}
	copy_str(pv->dir, sizeof(pv->dir), dir);
	if (code)
	{
		spec = pg_strdup(code);
		cursor = spec;
		/* commas and blanks alike, as every list of a job file */
		while ((tok = job_list_next(&cursor)) != NULL)
		{
			char		pattern[PATH_MAX + 8];
			glob_t		g;
			size_t		k;

			snprintf(pattern, sizeof(pattern), "%s%s%s", tok[0] == '/' ? "" : dir, tok[0] == '/' ? "" : "/", tok);
			if (glob(pattern, GLOB_BRACE, NULL, &g) != 0 || g.gl_pathc == 0)
			{
				snprintf(err, esz, "code: \"%s\" matches no file in %s", tok, dir);
				globfree(&g);
				pg_free(spec);
				return false;
			}
			for (k = 0; k < g.gl_pathc; k++)
			{
				struct stat st;

				walk_pv = pv;
				walk_dir = dir;
				walk_ok = true;
				if (stat(g.gl_pathv[k], &st) == 0 && S_ISDIR(st.st_mode))
					nftw(g.gl_pathv[k], walk_one, 16, FTW_PHYS | FTW_ACTIONRETVAL);
				else if (!add_file(pv, dir, g.gl_pathv[k]))
					walk_ok = false;
				if (!walk_ok)
				{
					snprintf(err, esz, "code: cannot read a file of \"%s\": %s", tok, strerror(errno));
					globfree(&g);
					pg_free(spec);
					return false;
				}
			}
			globfree(&g);
		}
		pg_free(spec);
		qsort(pv->files, (size_t) pv->nfiles, sizeof(code_file), path_cmp);
		initStringInfo(&list);
		for (i = 0; i < pv->nfiles; i++)
			appendStringInfo(&list, "%s  %s\n", pv->files[i].sha256, pv->files[i].path);
		sha256_buffer(list.data ? list.data : "", list.len, pv->code_sha256);
		pfree(list.data);
	}

	/* git: the commit, and whether the job file or the code differ from it */
	{
		char	   *head[] = {"git", "rev-parse", "HEAD", NULL};
		char		out[4096];

		if (capture(dir, head, out, sizeof(out)))
		{
			char	  **argv = pg_malloc0_array(char *, pv->nfiles + 8);
			int			n = 0;

			copy_str(pv->git_commit, sizeof(pv->git_commit), trim(out));
			argv[n++] = "git";
			argv[n++] = "status";
			argv[n++] = "--porcelain";
			argv[n++] = "--untracked-files=all";
			argv[n++] = "--";
			argv[n++] = pv->job_file;
			for (i = 0; i < pv->nfiles && i < 4000; i++)
				argv[n++] = pv->files[i].path;
			argv[n] = NULL;
			if (capture(dir, argv, out, sizeof(out)))
				pv->git_dirty = out[0] != '\0';
			pg_free(argv);
		}
	}
	return true;
}

void
provenance_free(provenance *pv)
{
	pg_free(pv->files);
	pv->files = NULL;
	pv->nfiles = pv->cap = 0;
}

/* ---------------------------------------------------------------------
 * --verify REPORT
 * --------------------------------------------------------------------- */

/*
 * --verify REPORT: exit 0 when the job file and the code the report names
 * are unchanged, 1 when not (each change a line on stdout), 2 when the
 * report cannot be read or names no job file. The report is read with
 * libpgcommon's JSON parser (json.c), so it may have passed through jq or
 * any other JSON tool: the signoff object's job_file_path,
 * job_file_sha256, directory, code and code_files (path, sha256).
 */
int
provenance_verify(const char *report)
{
	FILE	   *f = fopen(report, "r");
	StringInfoData text;
	char		buf[65536];
	size_t		n;
	json_value *doc;
	const json_value *signoff;
	const json_value *files;
	char		perr[300];
	char		job_file[PATH_MAX] = "";
	char		job_sha[65] = "";
	char		dir[PATH_MAX] = "";
	char		code[4096] = "";
	bool		has_code = false;
	provenance	was;
	provenance	now;
	char		err[PATH_MAX + 200];
	int			changes = 0;
	int			i,
				j;

	if (f == NULL)
	{
		pg_log_error("--verify: cannot read %s: %s", report, strerror(errno));
		return 2;
	}
	initStringInfo(&text);
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		appendBinaryStringInfo(&text, buf, (int) n);
	if (ferror(f))
	{
		pg_log_error("--verify: cannot read %s: %s", report, strerror(errno));
		fclose(f);
		pfree(text.data);
		return 2;
	}
	fclose(f);
	doc = json_parse(text.data, (size_t) text.len, perr, sizeof(perr));
	pfree(text.data);
	if (doc == NULL)
	{
		pg_log_error("--verify: %s is not JSON (%s)", report, perr);
		return 2;
	}
	memset(&was, 0, sizeof(was));
	signoff = json_member(doc, "signoff");
	copy_str(job_file, sizeof(job_file), json_string_member(signoff, "job_file_path"));
	copy_str(job_sha, sizeof(job_sha), json_string_member(signoff, "job_file_sha256"));
	copy_str(dir, sizeof(dir), json_string_member(signoff, "directory"));
	if (json_string_member(signoff, "code"))
	{
		copy_str(code, sizeof(code), json_string_member(signoff, "code"));
		has_code = true;
	}
	files = json_member(signoff, "code_files");
	for (i = 0; files && files->kind == JSON_KIND_ARRAY && i < files->nitems; i++)
	{
		const char *path = json_string_member(files->items[i], "path");
		const char *sha = json_string_member(files->items[i], "sha256");

		if (path == NULL || sha == NULL)
			continue;
		if (was.nfiles == was.cap)
		{
			was.cap = was.cap ? was.cap * 2 : 64;
			was.files = pg_realloc_array(was.files, code_file, was.cap);
		}
		copy_str(was.files[was.nfiles].path, sizeof(was.files[0].path), path);
		copy_str(was.files[was.nfiles].sha256, sizeof(was.files[0].sha256), sha);
		was.nfiles++;
	}
	json_free(doc);
	if (job_file[0] == '\0' || job_sha[0] == '\0' || dir[0] == '\0')
	{
		pg_log_error("--verify: %s is not a sign-off report of idempotency-matrix 0.4 or later "
				"(no job_file_path, job_file_sha256 or directory)", report);
		provenance_free(&was);
		return 2;
	}
	if (!provenance_collect(job_file, dir, has_code ? code : NULL, &now, err, sizeof(err)))
	{
		/* a job file or a code path that is gone: a change, named */
		printf("changed: %s\n", err);
		provenance_free(&was);
		return 1;
	}
	if (strcmp(now.job_sha256, job_sha) != 0)
	{
		printf("changed: the job file %s (sha256 %.12s..., signed %.12s...)\n", job_file, now.job_sha256, job_sha);
		changes++;
	}
	for (i = 0; i < was.nfiles; i++)
	{
		for (j = 0; j < now.nfiles && strcmp(now.files[j].path, was.files[i].path) != 0; j++)
			;
		if (j == now.nfiles)
		{
			printf("removed: %s\n", was.files[i].path);
			changes++;
		}
		else if (strcmp(now.files[j].sha256, was.files[i].sha256) != 0)
		{
			printf("changed: %s (sha256 %.12s..., signed %.12s...)\n", was.files[i].path,
				   now.files[j].sha256, was.files[i].sha256);
			changes++;
		}
	}
	for (j = 0; j < now.nfiles; j++)
	{
		for (i = 0; i < was.nfiles && strcmp(now.files[j].path, was.files[i].path) != 0; i++)
			;
		if (i == was.nfiles)
		{
			printf("added: %s\n", now.files[j].path);
			changes++;
		}
	}
	if (changes == 0)
		printf("unchanged: the job file %s (sha256 %.12s...) and %d code files%s%s%s, as signed in %s\n",
			   job_file, job_sha, now.nfiles, has_code ? " (sha256 " : "",
			   has_code ? now.code_sha256 : "", has_code ? ")" : "", report);
	provenance_free(&was);
	provenance_free(&now);
	return changes ? 1 : 0;
}
