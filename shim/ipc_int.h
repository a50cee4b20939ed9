/* ipc_int.h — what the two sides of cudaIpc* on pool memory share
 * (ipc_export.c, the owner; ipc_import.c, the opener): the handle's wire
 * format and the rule of where an owner's socket is. Not for the shim's
 * other rooms, which see ipc.h. Includes shim.h.
 */
#ifndef VPMM_IPC_INT_H
#define VPMM_IPC_INT_H

#include <stddef.h>
#include <stdint.h>

#include "shim.h"

#define IPC_MAGIC "vpmmIPC1"
#define IPC_TIMEOUT_S 10 /* an owner that does not answer: give up */
/* Most handles under one shared allocation: a 64 TiB allocation of 2 MiB
 * pages; a reply naming more is not believed. */
#define VPMM_IPC_MAX_PIECES ((uint64_t)1 << 25)

/* What travels in CUipcMemHandle's 64 bytes. */
struct ipc_wire {
	char magic[8];
	uint64_t token;  /* the owner process's random: a stale pid is no match */
	uint64_t id;     /* the export, in the owner's table */
	uint64_t base;   /* the owner's address and size: for messages */
	uint64_t size;
	int32_t pid;     /* the owner */
	int32_t device;
	char pad[16];
};
_Static_assert(sizeof(struct ipc_wire) == sizeof(CUipcMemHandle),
	       "the wire format fills CUipcMemHandle exactly");

/* The path the process `pid` of ours serves by the default rule. 0, or
 * -ENAMETOOLONG. */
int vpmm_ipc_socket_path(char *buf, size_t n, long pid);
/* Registers the forked child's handler (once): a child shares nothing of
 * its parent's exports and imports. */
void vpmm_ipc_watch_fork(void);
/* For that handler: the opener's table forgotten. */
void vpmm_ipc_imports_forget(void);

#endif
