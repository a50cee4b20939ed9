/* options-md.c — writes the VPMM_* settings of the options table
 * (allocator/options.c, through vpmm_options_table()) as a Markdown
 * definition list, which man/md2man.py puts into libvpmm(7): the manual's
 * list of settings comes from the table and nowhere else.
 *
 *   options-md OUT.md
 *
 * Calls only vpmm_options_table(). Exit status 0, or 1 with a line on
 * stderr if OUT cannot be written.
 */
#include <stdio.h>
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

int main(int argc, char **argv)
{
	size_t n;
	const struct vpmm_option_info *t = vpmm_options_table(&n);
	FILE *f;

	if (argc != 2) {
		fprintf(stderr, "usage: options-md OUT.md\n");
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
