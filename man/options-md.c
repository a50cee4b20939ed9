/* options-md.c — writes the VPMM_* settings of the options table
 * (allocator/options.c, through vpmm_options_table()) as a Markdown
 * definition list, which man/md2man.py puts into libvpmm(7): the manual's
 * list of settings comes from the table and nowhere else.
 *
 *   options-md OUT.md
 *   options-md --check-readme README.md
 *
 * The second form checks README.md's table of settings against the same
 * table (a test: the README's table is written by hand, and drifted once).
 * Calls only vpmm_options_table(). Exit status 0, or 1 with a line on
 * stderr if OUT cannot be written or the README's rows differ.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"

/* Text of the table as Markdown that shows it as it is: the characters
 * md2man.py reads as markup are escaped. */
static void put_text(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (strchr("\\`*[]<>|_", *s))
			fputc('\\', f);
		fputc(*s, f);
	}
}

/* One row of README.md's table of settings. */
static void put_row(FILE *f, const struct vpmm_option_info *o)
{
	fprintf(f, "| `%s` | `%s` | ", o->name, o->def);
	for (const char *s = o->desc; *s; s++) {
		if (*s == '|')
			fputc('\\', f);
		fputc(*s, f);
	}
	fputs(" |\n", f);
}

/* README.md's rows of the table (the lines starting "| `VPMM_"), in order,
 * against the table's: 0 when they are the same, else 1 with the first
 * difference and the rows to paste on stderr. */
static int check_readme(const char *path, const struct vpmm_option_info *t, size_t n)
{
	FILE *f = fopen(path, "r"), *mem;
	char line[4096], *want = NULL;
	size_t i = 0, wlen = 0;
	int bad = 0;

	if (!f) {
		perror(path);
		return 1;
	}
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, "| `VPMM_", 8) != 0)
			continue;
		mem = open_memstream(&want, &wlen);
		if (i < n)
			put_row(mem, &t[i]);
		fclose(mem);
		if (!bad && strcmp(line, want) != 0) {
			fprintf(stderr, "%s: settings row %zu is\n  %s"
					"but the options table (allocator/options.c) says\n  %s",
				path, i + 1, line, i < n ? want : "(no more settings)\n");
			bad = 1;
		}
		free(want);
		want = NULL;
		i++;
	}
	fclose(f);
	if (!bad && i != n) {
		fprintf(stderr, "%s: %zu settings rows, the options table has %zu\n", path, i, n);
		bad = 1;
	}
	if (bad) {
		fputs("The rows, from the table:\n", stderr);
		for (size_t k = 0; k < n; k++)
			put_row(stderr, &t[k]);
	}
	return bad;
}

int main(int argc, char **argv)
{
	size_t n;
	const struct vpmm_option_info *t = vpmm_options_table(&n);
	FILE *f;

	if (argc == 3 && strcmp(argv[1], "--check-readme") == 0)
		return check_readme(argv[2], t, n);
	if (argc != 2) {
		fprintf(stderr, "usage: options-md OUT.md | options-md --check-readme README.md\n");
		return 1;
	}
	f = fopen(argv[1], "w");
	if (!f) {
		perror(argv[1]);
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		fprintf(f, "`%s` (%s; default: ", t[i].name, t[i].type);
		put_text(f, t[i].def);
		fputs(")\n: ", f);
		put_text(f, t[i].desc);
		fputs("\n\n", f);
	}
	if (fclose(f) != 0) {
		perror(argv[1]);
		return 1;
	}
	return 0;
}
