/* driver_host_int.h — what the files of the host driver share (driver_host.h
 * is its API): the driver object and the bookkeeping it holds, and the
 * internal calls between its files. Included only by allocator/driver_host*.c.
 *
 * The files, each calling only those listed after it:
 *   driver_host_control.c  the test controls (driver_host.h's vpmm_host_*)
 *   driver_host.c          creation, the table of operations, contexts, destroy
 *   driver_host_mem.c      reservations, handles, mappings, access, capacity
 *   driver_host_stream.c   events and stream queues
 *   driver_host_base.c     sorted arrays; the entry of every operation
 * (the host driver's files call no other allocator/ file).
 *
 * One mutex guards everything. Lookups are binary searches over sorted
 * arrays; insertions and removals move the tail of an array, which for the
 * few thousand entries the pool keeps is a short memmove.
 */
#ifndef VPMM_DRIVER_HOST_INT_H
#define VPMM_DRIVER_HOST_INT_H

#include <pthread.h>
#include <stdint.h>

#include "driver_host.h"

/* Number of special streams: (CUstream)0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD. */
#define HOST_SPECIAL_STREAMS 3

struct host_handle {
	CUmemGenericAllocationHandle id;
	size_t size;
	int fd;          /* memfd; -1 when unbacked */
	bool released;   /* the creator's reference is gone */
	bool imported;   /* import_fd: another's memory, not counted in capacity */
	size_t maps;     /* mappings that still use it */
};

struct host_range { /* a reservation */
	uintptr_t va;
	size_t size;
};

struct host_map {
	uintptr_t va;
	size_t size;
	struct host_handle *h;
	uint64_t access; /* devices granted by set_access, bit d = device d */
};

struct host_stream;
struct host_event;

/* One recording of an event. A stream_wait waits for the record that was the
 * event's latest when the wait was issued (as CUDA does), so records outlive
 * re-recording and destruction of their event: they are reference counted by
 * the event (while it is the latest record) and by every queue entry. */
struct host_record {
	unsigned long refs;
	bool done;
	struct host_event *event;   /* NULL once re-recorded or destroyed */
	struct host_stream *stream; /* where its RECORD entry is queued */
};

struct host_event {
	struct host_record *rec; /* latest record; NULL if never recorded */
};

enum host_entry_kind { ENTRY_RECORD, ENTRY_WAIT };

struct host_entry {
	enum host_entry_kind kind;
	struct host_record *rec;
	const void *event; /* for ENTRY_WAIT: the event waited on (compared only) */
};

struct host_stream {
	struct host_entry *q; /* FIFO: [head, len) */
	size_t head, len, cap;
	unsigned long waits;
	bool capturing;
	bool busy; /* on the stack of stream_run_until */
	struct host_stream *next_draining; /* destroyed, its queue not yet run */
};

struct host_driver {
	vpmm_driver base; /* first: a vpmm_driver * is a struct host_driver * */
	pthread_mutex_t lock;
	size_t gran;
	size_t capacity;
	bool unbacked;
	uintptr_t next_va; /* unbacked */
	CUmemGenericAllocationHandle next_id;
	size_t handle_bytes;
	size_t tenant; /* held by another process (vpmm_host_set_tenant) */

	struct host_handle **handles; /* sorted by id (ids only grow: appended) */
	size_t nhandles, caphandles;
	struct host_range *res; /* sorted by va */
	size_t nres, capres;
	struct host_map *maps; /* sorted by va, never overlapping */
	size_t nmaps, capmaps;
	void **events; /* struct host_event *, sorted by address */
	size_t nevents, capevents;
	void **streams; /* struct host_stream *, sorted by address */
	size_t nstreams, capstreams;
	/* Destroyed with work still queued: the device runs it (complete_all,
	 * a sync on one of its events), then the stream is freed. */
	struct host_stream *draining;
	struct host_stream *special[HOST_SPECIAL_STREAMS];
	/* The context: its id, and whether it is destroyed and not yet made
	 * again (vpmm_host_ctx_reset). Streams and events of an ended context
	 * stay here, their handles refused and every use counted, so that no
	 * address of theirs is handed out again. */
	unsigned long long ctx_id;
	bool ctx_destroyed;
	void **dead; /* struct host_stream * and struct host_event *, sorted */
	size_t ndead, capdead;
	unsigned long dead_calls;

	/* Called at the start of every operation, before the lock (so that
	 * it may use the controls below): the device's own timing
	 * (host_device.c). Atomic. */
	vpmm_host_hook hook;
	void *hook_arg;

	unsigned long calls[VPMM_OP_COUNT];
	bool gate[VPMM_OP_COUNT]; /* closed: calls of the op wait (test control) */
	pthread_cond_t gate_open;
	struct {
		unsigned long nth;
		CUresult result;
	} fault[VPMM_OP_COUNT];
};


static inline struct host_driver *host_of(vpmm_driver *d)
{
	return (struct host_driver *)d;
}

/* What neither the tenant nor a handle holds. Lock held. */
static inline size_t host_free(const struct host_driver *h)
{
	size_t used = h->handle_bytes + h->tenant;
	return used < h->capacity ? h->capacity - used : 0;
}

static inline bool host_aligned(uintptr_t x, size_t gran)
{
	return (x & (gran - 1)) == 0;
}

/* ---- driver_host_base.c ---- */

/* `p` (an array of `*cap` elements of `elem` bytes) with room for `need`;
 * NULL (and `p` untouched) when memory is short. */
void *vpi_host_grow(void *p, size_t *cap, size_t need, size_t elem);
/* Sorted pointer arrays (events, streams): whether `p` is in `arr` and, in
 * *pos (may be NULL), the index of the first pointer >= p. */
bool vpi_host_ptr_find(void *const *arr, size_t n, const void *p, size_t *pos);
/* Inserts `p` in order; false when memory is short. */
bool vpi_host_ptr_insert(void ***arr, size_t *n, size_t *cap, void *p);
void vpi_host_ptr_remove(void **arr, size_t *n, size_t i);

/* Runs the hook (before the lock). */
void vpi_host_hook_call(struct host_driver *h, enum vpmm_op op);
/* Counts the call, waits (lock dropped) while a test holds the op's gate
 * closed, and fires an armed fault into *r (true). Lock held. */
bool vpi_host_injected(struct host_driver *h, enum vpmm_op op, CUresult *r);

/* The start of every operation: the hook, the lock, then the call counted,
 * gated and perhaps failed (to `out`, which unlocks and returns r_). */
#define ENTER(h, op)                                                          \
	CUresult r_ = CUDA_SUCCESS;                                           \
	vpi_host_hook_call((h), (op));                                        \
	pthread_mutex_lock(&(h)->lock);                                       \
	if (vpi_host_injected((h), (op), &r_))                                \
		goto out

/* ---- driver_host_stream.c ---- */

/* Puts the event and stream operations into the table. */
void vpi_host_stream_ops(vpmm_driver *base);
/* The stream object behind `s`; the special streams are made on first use.
 * Lock held. */
CUresult vpi_host_stream_find(struct host_driver *h, CUstream s,
			      struct host_stream **out);
/* Runs `s` up to its first blocked wait, adding the entries passed to
 * *moved; returns how many events completed. Lock held. */
unsigned vpi_host_stream_run(struct host_stream *s, size_t *moved);
/* Whether `handle` is a stream or event of an ended context; if so, the
 * use is counted (vpmm_host_dead_calls). Lock held. */
bool vpi_host_dead_use(struct host_driver *h, const void *handle);
/* The context ends: its streams and events die with their work, the
 * default streams start empty. Lock held. */
void vpi_host_stream_reset(struct host_driver *h);
/* Frees the destroyed streams whose queues ran empty. Lock held. */
void vpi_host_stream_drained(struct host_driver *h);
/* Frees every stream and event (destroy). */
void vpi_host_stream_fini(struct host_driver *h);

/* ---- driver_host_mem.c ---- */

/* Puts the memory operations into the table. */
void vpi_host_mem_ops(vpmm_driver *base);
/* Index of the first mapping whose va is > va. Lock held. */
size_t vpi_host_map_upper(const struct host_driver *h, uintptr_t va);
/* Unmaps every reservation and closes every handle (destroy). */
void vpi_host_mem_fini(struct host_driver *h);

/* ---- driver_host.c ---- */

/* The host driver behind `d`, or NULL for another driver (the controls then
 * do nothing rather than scribble over a foreign object). */
struct host_driver *vpi_host_checked(vpmm_driver *d);

#endif
