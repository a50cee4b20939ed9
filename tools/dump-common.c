/* dump-common.c — what every part of vpmm-dump uses: the interrupt flag,
 * error messages, names made printable for a terminal, sizes in the
 * region map's notation, and numbers read from a reply. Calls json.h only.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dump.h"
#include "json.h"

const char *prog = "vpmm-dump";
volatile sig_atomic_t interrupted;
bool text_output;

/* Control characters become '?': names and strings come from other
 * processes (as root, any user's), and must not drive the terminal. */
void printable(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			*s = '?';
}

void errf(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	printable(msg);
	fprintf(stderr, "%s: %s\n", prog, msg);
}

/* Whether everything written to stdout got there (/dev/full, a closed
 * descriptor): EXIT_OK, or EXIT_FAIL saying why. */
int output_status(void)
{
	if (fflush(stdout) == 0 && !ferror(stdout))
		return EXIT_OK;
	errf("writing the output: %s", strerror(errno ? errno : EIO));
	return EXIT_FAIL;
}

/* ---- sizes ------------------------------------------------------------------ */

/* The region map's size notation: the largest K/M/G/T... unit that divides it. */
const char *exact(char *buf, size_t n, uint64_t v)
{
	static const char suffix[] = "KMGTPE";
	int i = -1;
	while (v >= 1024 && v % 1024 == 0 && i < 5) {
		v /= 1024;
		i++;
	}
	if (i < 0)
		snprintf(buf, n, "%" PRIu64, v);
	else
		snprintf(buf, n, "%" PRIu64 "%c", v, suffix[i]);
	return buf;
}
/* Every string and key of a reply made printable, for text output. */
void printable_json(struct json *v)
{
	if (v->type == JSON_STRING && v->text)
		printable(v->text);
	for (size_t i = 0; (v->type == JSON_ARRAY || v->type == JSON_OBJECT) && i < v->n; i++) {
		if (v->type == JSON_OBJECT && v->keys[i])
			printable(v->keys[i]);
		printable_json(&v->items[i]);
	}
}


uint64_t u64_of(const struct json *obj, const char *key)
{
	uint64_t v = 0;
	json_u64(json_get(obj, key), &v);
	return v;
}
