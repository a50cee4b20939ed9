/* protocol.h — the wire protocol between libvpmm's socket server
 * (shim/server.c) and vpmm-dump (tools/vpmm-dump.c), and where sockets live.
 * Header only: both sides include it, nothing here allocates or blocks.
 *
 * Framing: a request is one line of printable ASCII or UTF-8 ending in '\n', at most
 * VPMM_REQUEST_MAX bytes with the newline:
 *
 *     vpmm <version> <request> [<argument>]\n        e.g. "vpmm 1 map\n"
 *
 * A reply is one JSON object on one line ending in '\n' (strings are escaped,
 * so the document holds no raw newline). Every reply has "protocol" (the
 * server's version) and "ok"; a failed request has "error" (a sentence).
 * Several requests may follow each other on one connection. A request longer
 * than VPMM_REQUEST_MAX, or one naming a version the server does not speak,
 * gets an error reply and the connection is closed; other malformed requests
 * get an error reply and the connection stays usable.
 *
 * The replies to ipc-open and ipc-pieces carry file descriptors: they come
 * with the reply's first byte (SCM_RIGHTS), in the order of its "pieces".
 *
 * Versions: a server speaks exactly VPMM_PROTOCOL; a change that a reader
 * could misread (a field changing meaning) bumps it. New fields and new
 * requests do not.
 *
 * Includes no header of the project.
 */
#ifndef VPMM_PROTOCOL_H
#define VPMM_PROTOCOL_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

/* The length of the well-formed UTF-8 sequence at s (2 to 4 bytes), or 0:
 * paths are bytes, and both sides pass UTF-8 through as it is and escape
 * what JSON cannot carry. s is NUL-terminated; reads stop at the NUL. */
static inline size_t vpmm_utf8_len(const unsigned char *s)
{
	size_t n = s[0] >= 0xf5 ? 0 : s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
	for (size_t i = 1; i < n; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	/* overlong three- and four-byte forms, surrogates, past U+10FFFF */
	if ((n == 3 && s[0] == 0xe0 && s[1] < 0xa0) || (n == 3 && s[0] == 0xed && s[1] >= 0xa0) ||
	    (n == 4 && s[0] == 0xf0 && s[1] < 0x90) || (n == 4 && s[0] == 0xf4 && s[1] >= 0x90))
		return 0;
	return n;
}

#define VPMM_PROTOCOL 1
#define VPMM_REQUEST_MAX 4096
/* Descriptors passed (SCM_RIGHTS) with one reply, at most: ipc-open and
 * ipc-pieces hand out a handle's file descriptor per piece. */
#define VPMM_IPC_MAX_FDS 128
/* A reply longer than this is refused by the server and by the client. */
#define VPMM_REPLY_MAX ((size_t)256 << 20)

/* The directory of default sockets: "$XDG_RUNTIME_DIR/vpmm" when the variable
 * is set to an absolute path, else "/tmp/vpmm-<uid>". Returns the length
 * (snprintf-like: >= n means it did not fit). */
static inline int vpmm_socket_dir(char *buf, size_t n, const char *xdg_runtime_dir,
				  unsigned long uid)
{
	if (xdg_runtime_dir && xdg_runtime_dir[0] == '/')
		return snprintf(buf, n, "%s/vpmm", xdg_runtime_dir);
	return snprintf(buf, n, "/tmp/vpmm-%lu", uid);
}

/* "<dir>/<pid>.sock" */
static inline int vpmm_socket_path(char *buf, size_t n, const char *dir, long pid)
{
	return snprintf(buf, n, "%s/%ld.sock", dir, pid);
}

#endif
