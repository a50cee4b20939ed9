/* pickle.h — a minimal Python pickle writer (protocol 4) for vpmm-dump's
 * --torch-snapshot: dicts, lists, 2-tuples, str, int, bool and None, built
 * in order. The opcodes are those both Python's pickle and PyTorch's memory
 * visualizer (MemoryViz.js, which has its own small unpickler) read: PROTO,
 * EMPTY_DICT/EMPTY_LIST + MARK ... SETITEMS/APPENDS, TUPLE2,
 * SHORT_BINUNICODE/BINUNICODE, BININT1/BININT2/BININT/LONG1, NEWTRUE,
 * NEWFALSE, NONE, STOP. No FRAME (optional in protocol 4), no memo.
 */
#ifndef VPMM_PICKLE_H
#define VPMM_PICKLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pickle {
	unsigned char *p;
	size_t len, cap;
	bool failed; /* out of memory: every later call does nothing */
};

void pk_begin(struct pickle *pk);           /* PROTO 4 */
void pk_end(struct pickle *pk);             /* STOP */
void pk_dict_begin(struct pickle *pk);      /* then key, value, key, value... */
void pk_dict_end(struct pickle *pk);
void pk_list_begin(struct pickle *pk);
void pk_list_end(struct pickle *pk);
void pk_str(struct pickle *pk, const char *s);
void pk_int(struct pickle *pk, int64_t v);
void pk_uint(struct pickle *pk, uint64_t v); /* any 64-bit unsigned value */
void pk_bool(struct pickle *pk, bool v);
void pk_none(struct pickle *pk);
void pk_tuple2(struct pickle *pk);           /* the last two values become a tuple */
void pk_free(struct pickle *pk);

/* Shorthands for dict entries. */
void pk_kv_str(struct pickle *pk, const char *key, const char *v);
void pk_kv_uint(struct pickle *pk, const char *key, uint64_t v);
void pk_kv_int(struct pickle *pk, const char *key, int64_t v);

#endif
