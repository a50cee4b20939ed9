/* pickle.c — the writer of pickle.h. Integers use the smallest opcode Python
 * itself would: BININT1, BININT2, BININT (signed 32-bit), else LONG1 with the
 * minimal little-endian two's complement bytes. */
#include <stdlib.h>
#include <string.h>

#include "pickle.h"

enum {
	OP_PROTO = 0x80,
	OP_STOP = '.',
	OP_MARK = '(',
	OP_EMPTY_DICT = '}',
	OP_SETITEMS = 'u',
	OP_EMPTY_LIST = ']',
	OP_APPENDS = 'e',
	OP_TUPLE2 = 0x86,
	OP_SHORT_BINUNICODE = 0x8c,
	OP_BINUNICODE = 'X',
	OP_BININT1 = 'K',
	OP_BININT2 = 'M',
	OP_BININT = 'J',
	OP_LONG1 = 0x8a,
	OP_NEWTRUE = 0x88,
	OP_NEWFALSE = 0x89,
	OP_NONE = 'N',
};

static void put(struct pickle *pk, const void *b, size_t n)
{
	if (pk->failed)
		return;
	if (pk->len + n > pk->cap) {
		size_t cap = pk->cap ? pk->cap : 4096;
		while (cap < pk->len + n)
			cap *= 2;
		unsigned char *p = realloc(pk->p, cap);
		if (!p) {
			pk->failed = true;
			return;
		}
		pk->p = p;
		pk->cap = cap;
	}
	memcpy(pk->p + pk->len, b, n);
	pk->len += n;
}

static void op(struct pickle *pk, unsigned char o)
{
	put(pk, &o, 1);
}

static void le(struct pickle *pk, uint64_t v, int bytes)
{
	unsigned char b[8];
	for (int i = 0; i < bytes; i++)
		b[i] = (unsigned char)(v >> (8 * i));
	put(pk, b, (size_t)bytes);
}

void pk_begin(struct pickle *pk)
{
	op(pk, OP_PROTO);
	op(pk, 4);
}

void pk_end(struct pickle *pk)
{
	op(pk, OP_STOP);
}

void pk_dict_begin(struct pickle *pk)
{
	op(pk, OP_EMPTY_DICT);
	op(pk, OP_MARK);
}

void pk_dict_end(struct pickle *pk)
{
	op(pk, OP_SETITEMS);
}

void pk_list_begin(struct pickle *pk)
{
	op(pk, OP_EMPTY_LIST);
	op(pk, OP_MARK);
}

void pk_list_end(struct pickle *pk)
{
	op(pk, OP_APPENDS);
}

void pk_str(struct pickle *pk, const char *s)
{
	size_t n = strlen(s);
	if (n < 256) {
		op(pk, OP_SHORT_BINUNICODE);
		op(pk, (unsigned char)n);
	} else {
		op(pk, OP_BINUNICODE);
		le(pk, n, 4);
	}
	put(pk, s, n);
}

/* LONG1 of a value given as 9 bytes of two's complement (sign in byte 8). */
static void long1(struct pickle *pk, const unsigned char b[9])
{
	int n = 9;
	/* drop bytes that only repeat the sign of the byte below them */
	while (n > 1 && ((b[n - 1] == 0x00 && !(b[n - 2] & 0x80)) ||
			 (b[n - 1] == 0xff && (b[n - 2] & 0x80))))
		n--;
	op(pk, OP_LONG1);
	op(pk, (unsigned char)n);
	put(pk, b, (size_t)n);
}

void pk_int(struct pickle *pk, int64_t v)
{
	if (v >= 0 && v < 256) {
		op(pk, OP_BININT1);
		op(pk, (unsigned char)v);
	} else if (v >= 0 && v < 65536) {
		op(pk, OP_BININT2);
		le(pk, (uint64_t)v, 2);
	} else if (v >= INT32_MIN && v <= INT32_MAX) {
		op(pk, OP_BININT);
		le(pk, (uint64_t)(uint32_t)(int32_t)v, 4);
	} else {
		unsigned char b[9];
		for (int i = 0; i < 8; i++)
			b[i] = (unsigned char)((uint64_t)v >> (8 * i));
		b[8] = v < 0 ? 0xff : 0x00;
		long1(pk, b);
	}
}

void pk_uint(struct pickle *pk, uint64_t v)
{
	if (v <= INT64_MAX) {
		pk_int(pk, (int64_t)v);
		return;
	}
	unsigned char b[9];
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)(v >> (8 * i));
	b[8] = 0x00;
	long1(pk, b);
}

void pk_bool(struct pickle *pk, bool v)
{
	op(pk, v ? OP_NEWTRUE : OP_NEWFALSE);
}

void pk_none(struct pickle *pk)
{
	op(pk, OP_NONE);
}

void pk_tuple2(struct pickle *pk)
{
	op(pk, OP_TUPLE2);
}

void pk_free(struct pickle *pk)
{
	free(pk->p);
	memset(pk, 0, sizeof(*pk));
}

void pk_kv_str(struct pickle *pk, const char *key, const char *v)
{
	pk_str(pk, key);
	pk_str(pk, v);
}

void pk_kv_uint(struct pickle *pk, const char *key, uint64_t v)
{
	pk_str(pk, key);
	pk_uint(pk, v);
}

void pk_kv_int(struct pickle *pk, const char *key, int64_t v)
{
	pk_str(pk, key);
	pk_int(pk, v);
}
