/* json.c — the reader and writer of json.h: recursive descent over RFC 8259
 * (no extensions), growing arrays as it goes. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "protocol.h" /* vpmm_utf8_len */

struct parser {
	const char *p, *end;
	char *err;
	size_t errlen;
	const char *start;
};

static int fail(struct parser *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct parser *ps, const char *fmt, ...)
{
	if (ps->errlen && ps->err[0] == '\0') {
		int n = snprintf(ps->err, ps->errlen, "byte %zu: ", (size_t)(ps->p - ps->start));
		if (n > 0 && (size_t)n < ps->errlen) {
			va_list ap;
			va_start(ap, fmt);
			vsnprintf(ps->err + n, ps->errlen - (size_t)n, fmt, ap);
			va_end(ap);
		}
	}
	return -1;
}

static void skip_ws(struct parser *ps)
{
	while (ps->p < ps->end &&
	       (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
		ps->p++;
}

static bool literal(struct parser *ps, const char *word)
{
	size_t n = strlen(word);
	if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
		return false;
	ps->p += n;
	return true;
}

static int hex4(struct parser *ps, unsigned *out)
{
	if (ps->end - ps->p < 4)
		return fail(ps, "truncated \\u escape");
	unsigned v = 0;
	for (int i = 0; i < 4; i++) {
		char c = *ps->p++;
		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= (unsigned)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v |= (unsigned)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			v |= (unsigned)(c - 'A' + 10);
		else
			return fail(ps, "bad \\u escape");
	}
	*out = v;
	return 0;
}

static size_t utf8(char *o, unsigned cp)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (char)(0xc0 | (cp >> 6));
		o[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (char)(0xe0 | (cp >> 12));
		o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
		o[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	o[0] = (char)(0xf0 | (cp >> 18));
	o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
	o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
	o[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

/* A string starting at the opening quote; *out is malloc'd. */
static int parse_string(struct parser *ps, char **out)
{
	ps->p++; /* " */
	const char *q = ps->p;
	size_t cap = 0;
	while (q < ps->end && *q != '"') { /* an upper bound of the decoded size */
		if (*q == '\\')
			q++;
		q++;
		cap++;
	}
	char *s = malloc(cap * 4 + 1), *o = s;
	if (!s)
		return fail(ps, "out of memory");
	while (ps->p < ps->end && *ps->p != '"') {
		unsigned char c = (unsigned char)*ps->p++;
		if (c < 0x20) {
			free(s);
			return fail(ps, "control character in a string");
		}
		if (c != '\\') {
			*o++ = (char)c;
			continue;
		}
		if (ps->p >= ps->end)
			break;
		char e = *ps->p++;
		unsigned cp;
		switch (e) {
		case '"': *o++ = '"'; break;
		case '\\': *o++ = '\\'; break;
		case '/': *o++ = '/'; break;
		case 'b': *o++ = '\b'; break;
		case 'f': *o++ = '\f'; break;
		case 'n': *o++ = '\n'; break;
		case 'r': *o++ = '\r'; break;
		case 't': *o++ = '\t'; break;
		case 'u':
			if (hex4(ps, &cp)) {
				free(s);
				return -1;
			}
			if (cp >= 0xd800 && cp < 0xdc00 && ps->end - ps->p >= 6 &&
			    ps->p[0] == '\\' && ps->p[1] == 'u') {
				unsigned lo;
				ps->p += 2;
				if (hex4(ps, &lo)) {
					free(s);
					return -1;
				}
				if (lo >= 0xdc00 && lo < 0xe000)
					cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
				else
					cp = 0xfffd;
			} else if (cp >= 0xd800 && cp < 0xe000) {
				cp = 0xfffd;
			}
			if (cp == 0) { /* it would end the string where it stands */
				free(s);
				return fail(ps, "\\u0000 in a string");
			}
			o += utf8(o, cp);
			break;
		default:
			free(s);
			return fail(ps, "bad escape \\%c", e);
		}
	}
	if (ps->p >= ps->end) {
		free(s);
		return fail(ps, "unterminated string");
	}
	ps->p++; /* " */
	*o = '\0';
	*out = s;
	return 0;
}

static int parse_number(struct parser *ps, struct json *v)
{
	const char *b = ps->p;
	if (ps->p < ps->end && *ps->p == '-')
		ps->p++;
	if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
		return fail(ps, "bad number");
	if (*ps->p == '0')
		ps->p++;
	else
		while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
			ps->p++;
	if (ps->p < ps->end && *ps->p == '.') {
		ps->p++;
		if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
			return fail(ps, "bad number");
		while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
			ps->p++;
	}
	if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
		ps->p++;
		if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-'))
			ps->p++;
		if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
			return fail(ps, "bad number");
		while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
			ps->p++;
	}
	v->type = JSON_NUMBER;
	v->text = strndup(b, (size_t)(ps->p - b));
	return v->text ? 0 : fail(ps, "out of memory");
}

static int parse_value(struct parser *ps, struct json *v, int depth);

static int push(struct parser *ps, struct json *v, size_t *cap, bool keyed)
{
	if (v->n < *cap)
		return 0;
	size_t nc = *cap ? *cap * 2 : 8;
	struct json *items = realloc(v->items, nc * sizeof(*items));
	if (!items)
		return fail(ps, "out of memory");
	v->items = items;
	if (keyed) {
		char **keys = realloc(v->keys, nc * sizeof(*keys));
		if (!keys)
			return fail(ps, "out of memory");
		v->keys = keys;
	}
	*cap = nc;
	return 0;
}

static int parse_container(struct parser *ps, struct json *v, int depth, bool object)
{
	char close = object ? '}' : ']';
	size_t cap = 0;
	v->type = object ? JSON_OBJECT : JSON_ARRAY;
	ps->p++;
	skip_ws(ps);
	if (ps->p < ps->end && *ps->p == close) {
		ps->p++;
		return 0;
	}
	for (;;) {
		if (push(ps, v, &cap, object))
			return -1;
		struct json *item = &v->items[v->n];
		memset(item, 0, sizeof(*item));
		if (object) {
			skip_ws(ps);
			if (ps->p >= ps->end || *ps->p != '"')
				return fail(ps, "expected a key");
			if (parse_string(ps, &v->keys[v->n]))
				return -1;
			v->n++; /* the key is owned from here on */
			skip_ws(ps);
			if (ps->p >= ps->end || *ps->p != ':')
				return fail(ps, "expected ':'");
			ps->p++;
			if (parse_value(ps, item, depth + 1))
				return -1;
		} else {
			v->n++;
			if (parse_value(ps, item, depth + 1))
				return -1;
		}
		skip_ws(ps);
		if (ps->p < ps->end && *ps->p == ',') {
			ps->p++;
			continue;
		}
		if (ps->p < ps->end && *ps->p == close) {
			ps->p++;
			return 0;
		}
		return fail(ps, "expected ',' or '%c'", close);
	}
}

static int parse_value(struct parser *ps, struct json *v, int depth)
{
	if (depth > JSON_MAX_DEPTH)
		return fail(ps, "nested deeper than %d", JSON_MAX_DEPTH);
	skip_ws(ps);
	if (ps->p >= ps->end)
		return fail(ps, "unexpected end");
	switch (*ps->p) {
	case '{':
		return parse_container(ps, v, depth, true);
	case '[':
		return parse_container(ps, v, depth, false);
	case '"':
		v->type = JSON_STRING;
		return parse_string(ps, &v->text);
	case 't':
	case 'f':
		v->type = JSON_BOOL;
		v->boolean = *ps->p == 't';
		if (literal(ps, v->boolean ? "true" : "false"))
			return 0;
		return fail(ps, "bad literal");
	case 'n':
		v->type = JSON_NULL;
		if (literal(ps, "null"))
			return 0;
		return fail(ps, "bad literal");
	default:
		return parse_number(ps, v);
	}
}

int json_parse(const char *text, size_t len, struct json *out, char *err, size_t errlen)
{
	struct parser ps = { .p = text, .end = text + len, .err = err, .errlen = errlen,
			     .start = text };
	memset(out, 0, sizeof(*out));
	if (errlen)
		err[0] = '\0';
	if (parse_value(&ps, out, 0))
		return -1;
	skip_ws(&ps);
	if (ps.p != ps.end)
		return fail(&ps, "trailing characters after the document");
	return 0;
}

void json_free(struct json *v)
{
	if (!v)
		return;
	for (size_t i = 0; i < v->n; i++) {
		json_free(&v->items[i]);
		if (v->keys)
			free(v->keys[i]);
	}
	free(v->items);
	free(v->keys);
	free(v->text);
	memset(v, 0, sizeof(*v));
}

const struct json *json_get(const struct json *obj, const char *key)
{
	if (!obj || obj->type != JSON_OBJECT)
		return NULL;
	for (size_t i = 0; i < obj->n; i++)
		if (strcmp(obj->keys[i], key) == 0)
			return &obj->items[i];
	return NULL;
}

const char *json_str(const struct json *v)
{
	return v && v->type == JSON_STRING ? v->text : NULL;
}

bool json_u64(const struct json *v, uint64_t *out)
{
	if (!v || v->type != JSON_NUMBER || v->text[0] == '-' || strpbrk(v->text, ".eE"))
		return false;
	errno = 0;
	char *end;
	unsigned long long x = strtoull(v->text, &end, 10);
	if (errno || *end)
		return false;
	*out = x;
	return true;
}

bool json_i64(const struct json *v, int64_t *out)
{
	if (!v || v->type != JSON_NUMBER || strpbrk(v->text, ".eE"))
		return false;
	errno = 0;
	char *end;
	long long x = strtoll(v->text, &end, 10);
	if (errno || *end)
		return false;
	*out = x;
	return true;
}

bool json_bool(const struct json *v, bool *out)
{
	if (!v || v->type != JSON_BOOL)
		return false;
	*out = v->boolean;
	return true;
}

/* UTF-8 as it is; a byte that is not part of it (a file or process name
 * need not be UTF-8, and JSON must be) as \u00XX, its Latin-1 reading. */
void json_write_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		size_t n = c >= 0x80 ? vpmm_utf8_len((const unsigned char *)s) : 0;
		if (c == '"' || c == '\\') {
			fprintf(f, "\\%c", c);
		} else if (n) {
			fwrite(s, 1, n, f);
			s += n - 1;
		} else if (c < 0x20 || c >= 0x7f) {
			fprintf(f, "\\u%04x", c);
		} else {
			fputc(c, f);
		}
	}
	fputc('"', f);
}

void json_write(FILE *f, const struct json *v)
{
	switch (v->type) {
	case JSON_NULL:
		fputs("null", f);
		break;
	case JSON_BOOL:
		fputs(v->boolean ? "true" : "false", f);
		break;
	case JSON_NUMBER:
		fputs(v->text, f);
		break;
	case JSON_STRING:
		json_write_string(f, v->text);
		break;
	case JSON_ARRAY:
	case JSON_OBJECT:
		fputc(v->type == JSON_ARRAY ? '[' : '{', f);
		for (size_t i = 0; i < v->n; i++) {
			if (i)
				fputc(',', f);
			if (v->type == JSON_OBJECT) {
				json_write_string(f, v->keys[i]);
				fputc(':', f);
			}
			json_write(f, &v->items[i]);
		}
		fputc(v->type == JSON_ARRAY ? ']' : '}', f);
		break;
	}
}
