/* json.h — a small strict JSON reader for vpmm-dump: parses a whole document
 * into a tree, keeps numbers as their text (so 64-bit addresses survive),
 * and writes a tree back out compactly. Depth and size are bounded by the
 * caller's input; nesting deeper than JSON_MAX_DEPTH is an error.
 */
#ifndef VPMM_JSON_H
#define VPMM_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define JSON_MAX_DEPTH 64

enum json_type { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT };

struct json {
	enum json_type type;
	bool boolean;
	char *text;          /* STRING: decoded (NUL-terminated); NUMBER: as written */
	size_t n;            /* ARRAY / OBJECT: number of items */
	struct json *items;  /* ARRAY / OBJECT: the values */
	char **keys;         /* OBJECT: the keys, parallel to items */
};

/* 0, or -1 with a sentence in err. *out is freed with json_free either way. */
int json_parse(const char *text, size_t len, struct json *out, char *err, size_t errlen);
void json_free(struct json *v);

/* The value of `key` in an object, or NULL. */
const struct json *json_get(const struct json *obj, const char *key);
/* The string of a STRING value, or NULL. */
const char *json_str(const struct json *v);
/* A non-negative integer NUMBER that fits; false otherwise. */
bool json_u64(const struct json *v, uint64_t *out);
/* An integer NUMBER that fits; false otherwise. */
bool json_i64(const struct json *v, int64_t *out);
/* A BOOL value; false (and *out untouched) otherwise. */
bool json_bool(const struct json *v, bool *out);

/* Compact JSON; strings escaped so the output is one line. */
void json_write(FILE *f, const struct json *v);
void json_write_string(FILE *f, const char *s);

#endif
