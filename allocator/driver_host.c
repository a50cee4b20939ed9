/* driver_host.c — the host driver: a GPU imitated on host memory (or on
 * nothing at all, in unbacked mode), for tests and replay without a GPU.
 *
 * Owns: the bookkeeping of reservations, physical handles, mappings, events
 * and stream queues of one driver object; the validation the real driver does
 * on VMM calls; fault injection and call counts. No global state: a test may
 * make as many drivers as it likes.
 *
 * One mutex guards everything. Lookups are binary searches over sorted
 * arrays; insertions and removals move the tail of an array, which for the
 * few thousand entries the pool keeps is a short memmove.
 *
 * Misuse of the VMM calls is answered with CUDA_ERROR_INVALID_VALUE (what
 * libcuda documents for every bad range, size or handle); misuse of events
 * and streams with CUDA_ERROR_INVALID_HANDLE.
 */
#include "driver_host.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HOST_DEFAULT_GRANULARITY ((size_t)2 << 20)
#define HOST_DEFAULT_CAPACITY ((size_t)1 << 40)
/* Unbacked VAs start high so that they never look like small integers or
 * host pointers a test might confuse them with. */
#define HOST_UNBACKED_BASE ((uintptr_t)1 << 44)
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
	struct host_stream *special[HOST_SPECIAL_STREAMS];

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

static struct host_driver *host_of(vpmm_driver *d)
{
	return (struct host_driver *)d;
}

/* ---- small helpers ---------------------------------------------------------- */

/* What neither the tenant nor a handle holds. Lock held. */
static size_t host_free(const struct host_driver *h)
{
	size_t used = h->handle_bytes + h->tenant;
	return used < h->capacity ? h->capacity - used : 0;
}

/* `p` (an array of `*cap` elements of `elem` bytes) with room for `need`;
 * NULL (and `p` untouched) when memory is short. */
static void *grow(void *p, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap && p)
		return p;
	size_t ncap = *cap ? *cap : 16;
	while (ncap < need)
		ncap *= 2;
	void *n = realloc(p, ncap * elem);
	if (n)
		*cap = ncap;
	return n;
}

static bool aligned(uintptr_t x, size_t gran)
{
	return (x & (gran - 1)) == 0;
}

/* Index of the first pointer >= p in a sorted pointer array. */
static size_t ptr_lower(void *const *arr, size_t n, const void *p)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if ((uintptr_t)arr[mid] < (uintptr_t)p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static bool ptr_find(void *const *arr, size_t n, const void *p, size_t *pos)
{
	size_t i = ptr_lower(arr, n, p);
	if (pos)
		*pos = i;
	return i < n && arr[i] == p;
}

static bool ptr_insert(void ***arr, size_t *n, size_t *cap, void *p)
{
	void **grown = grow(*arr, cap, *n + 1, sizeof **arr);
	if (!grown)
		return false;
	*arr = grown;
	size_t i = ptr_lower(*arr, *n, p);
	memmove(*arr + i + 1, *arr + i, (*n - i) * sizeof **arr);
	(*arr)[i] = p;
	(*n)++;
	return true;
}

static void ptr_remove(void **arr, size_t *n, size_t i)
{
	memmove(arr + i, arr + i + 1, (*n - i - 1) * sizeof *arr);
	(*n)--;
}

/* Index of the first mapping whose va is > va. */
static size_t map_upper(const struct host_driver *h, uintptr_t va)
{
	size_t lo = 0, hi = h->nmaps;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (h->maps[mid].va <= va)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Index of the first reservation whose va is > va. */
static size_t res_upper(const struct host_driver *h, uintptr_t va)
{
	size_t lo = 0, hi = h->nres;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (h->res[mid].va <= va)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The live (unreleased) handle `id`, or NULL; *pos gets its index. */
static struct host_handle *handle_find(const struct host_driver *h,
				       CUmemGenericAllocationHandle id,
				       size_t *pos)
{
	size_t lo = 0, hi = h->nhandles;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (h->handles[mid]->id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == h->nhandles || h->handles[lo]->id != id)
		return NULL;
	if (pos)
		*pos = lo;
	return h->handles[lo];
}

static void handle_free(struct host_handle *hd)
{
	if (hd->fd >= 0)
		close(hd->fd);
	free(hd);
}

/* A new handle (no fd yet), with room made for it in h->handles; NULL when
 * out of memory. The caller gives it an id and appends it. */
static struct host_handle *handle_alloc(struct host_driver *h)
{
	struct host_handle **handles = grow(h->handles, &h->caphandles,
					    h->nhandles + 1, sizeof *h->handles);
	if (!handles)
		return NULL;
	h->handles = handles;
	struct host_handle *hd = calloc(1, sizeof *hd);
	if (hd)
		hd->fd = -1;
	return hd;
}

/* Frees the handle once nothing holds it: released and mapped nowhere. */
static void handle_settle(struct host_driver *h, struct host_handle *hd)
{
	if (!hd->released || hd->maps)
		return;
	size_t pos;
	if (handle_find(h, hd->id, &pos) == hd)
		ptr_remove((void **)h->handles, &h->nhandles, pos);
	if (!hd->imported)
		h->handle_bytes -= hd->size;
	handle_free(hd);
}

/* A PROT_NONE placeholder over [va, va+size): what a reservation looks like
 * where nothing is mapped. */
static bool placeholder(uintptr_t va, size_t size)
{
	void *p = mmap((void *)va, size, PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
		       -1, 0);
	return p != MAP_FAILED;
}

/* Counts the call, waits (lock dropped) while a test holds the op's gate
 * closed, and fires an armed fault. Called with the lock held. Counting first
 * lets a test see that a call has reached the gate. */
static bool injected(struct host_driver *h, enum vpmm_op op, CUresult *r)
{
	h->calls[op]++;
	while (h->gate[op])
		pthread_cond_wait(&h->gate_open, &h->lock);
	if (h->fault[op].nth && --h->fault[op].nth == 0) {
		*r = h->fault[op].result;
		return true;
	}
	return false;
}

static void hook_call(struct host_driver *h, enum vpmm_op op)
{
	vpmm_host_hook fn = __atomic_load_n(&h->hook, __ATOMIC_ACQUIRE);
	if (fn)
		fn(h->hook_arg, op);
}

#define ENTER(h, op)                                                          \
	CUresult r_ = CUDA_SUCCESS;                                           \
	hook_call((h), (op));                                                 \
	pthread_mutex_lock(&(h)->lock);                                       \
	if (injected((h), (op), &r_))                                         \
		goto out

/* ---- streams and events ------------------------------------------------------ */

static void rec_put(struct host_record *rec)
{
	if (rec && --rec->refs == 0)
		free(rec);
}

static struct host_event *event_find(struct host_driver *h, CUevent ev)
{
	return ptr_find(h->events, h->nevents, ev, NULL) ? (struct host_event *)ev
							: NULL;
}

/* The stream object behind `s`; the special streams are made on first use. */
static CUresult stream_find(struct host_driver *h, CUstream s,
			    struct host_stream **out)
{
	uintptr_t v = (uintptr_t)s;
	if (v < HOST_SPECIAL_STREAMS) {
		if (!h->special[v]) {
			h->special[v] = calloc(1, sizeof *h->special[v]);
			if (!h->special[v])
				return CUDA_ERROR_OUT_OF_MEMORY;
		}
		*out = h->special[v];
		return CUDA_SUCCESS;
	}
	if (!ptr_find(h->streams, h->nstreams, s, NULL))
		return CUDA_ERROR_INVALID_HANDLE;
	*out = (struct host_stream *)s;
	return CUDA_SUCCESS;
}

/* Room for one more entry at the tail of the queue. */
static bool queue_reserve(struct host_stream *s)
{
	if (s->len < s->cap)
		return true;
	if (s->head > 0) {
		memmove(s->q, s->q + s->head, (s->len - s->head) * sizeof *s->q);
		s->len -= s->head;
		s->head = 0;
		return true;
	}
	struct host_entry *q = grow(s->q, &s->cap, s->len + 1, sizeof *s->q);
	if (!q)
		return false;
	s->q = q;
	return true;
}

static void queue_push(struct host_stream *s, enum host_entry_kind kind,
		       struct host_record *rec, const void *event)
{
	s->q[s->len++] = (struct host_entry){ kind, rec, event };
}

static bool entry_blocked(const struct host_entry *e)
{
	return e->kind == ENTRY_WAIT && !e->rec->done;
}

/* Pops the front entry (which must not be blocked); returns 1 if it
 * completed an event. */
static unsigned entry_pop(struct host_stream *s)
{
	struct host_entry e = s->q[s->head++];
	if (s->head == s->len)
		s->head = s->len = 0;
	unsigned completed = 0;
	if (e.kind == ENTRY_RECORD) {
		e.rec->done = true;
		completed = e.rec->event != NULL;
	}
	rec_put(e.rec);
	return completed;
}

/* Runs `s` up to its first blocked wait. */
static unsigned stream_run(struct host_stream *s, size_t *moved)
{
	unsigned completed = 0;
	while (s->head < s->len && !entry_blocked(&s->q[s->head])) {
		completed += entry_pop(s);
		(*moved)++;
	}
	return completed;
}

/* Runs `s` until `target` (queued on s) is done, first running whatever other
 * streams a wait on the way depends on — as a CPU waiting for the device
 * would see it. A wait always refers to a record queued before it, so the
 * dependencies form no cycle and each stream is entered at most once; `busy`
 * turns a broken queue into an error instead of endless recursion. */
static CUresult stream_run_until(struct host_stream *s,
				 const struct host_record *target)
{
	if (s->busy)
		return CUDA_ERROR_ILLEGAL_STATE;
	s->busy = true;
	CUresult r = CUDA_SUCCESS;
	while (!target->done) {
		if (s->head == s->len) {
			r = CUDA_ERROR_ILLEGAL_STATE;
			break;
		}
		struct host_entry *e = &s->q[s->head];
		if (entry_blocked(e)) {
			r = stream_run_until(e->rec->stream, e->rec);
			if (r != CUDA_SUCCESS)
				break;
		}
		entry_pop(s);
	}
	s->busy = false;
	return r;
}

static void stream_free(struct host_stream *s)
{
	if (!s)
		return;
	for (size_t i = s->head; i < s->len; i++)
		rec_put(s->q[i].rec);
	free(s->q);
	free(s);
}

/* ---- driver operations --------------------------------------------------------- */

static CUresult host_granularity(vpmm_driver *d, int device, size_t *out)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_GRANULARITY);
	/* device < 0 means "the current device"; the host has one memory for
	 * all devices, so every device answers the same. */
	if (!out)
		r_ = CUDA_ERROR_INVALID_VALUE;
	else
		*out = h->gran;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_va_reserve(vpmm_driver *d, size_t size, CUdeviceptr *out)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_VA_RESERVE);
	uintptr_t va;
	if (!out || size == 0 || !aligned(size, h->gran)) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	struct host_range *res = grow(h->res, &h->capres, h->nres + 1,
				      sizeof *h->res);
	if (!res) {
		r_ = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	h->res = res;
	if (h->unbacked) {
		va = (h->next_va + h->gran - 1) & ~(uintptr_t)(h->gran - 1);
		if (va < h->next_va || va + size < va) {
			r_ = CUDA_ERROR_OUT_OF_MEMORY;
			goto out;
		}
		h->next_va = va + size;
	} else {
		/* mmap aligns to the host page only: over-reserve by one
		 * granule and trim both ends. */
		size_t span = size + h->gran;
		if (span < size) {
			r_ = CUDA_ERROR_OUT_OF_MEMORY;
			goto out;
		}
		void *p = mmap(NULL, span, PROT_NONE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (p == MAP_FAILED) {
			r_ = CUDA_ERROR_OUT_OF_MEMORY;
			goto out;
		}
		uintptr_t base = (uintptr_t)p;
		va = (base + h->gran - 1) & ~(uintptr_t)(h->gran - 1);
		if (va > base)
			munmap(p, va - base);
		if (base + span > va + size)
			munmap((void *)(va + size), base + span - (va + size));
	}
	size_t i = res_upper(h, va);
	memmove(h->res + i + 1, h->res + i, (h->nres - i) * sizeof *h->res);
	h->res[i] = (struct host_range){ va, size };
	h->nres++;
	*out = (CUdeviceptr)va;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_va_free(vpmm_driver *d, CUdeviceptr dva, size_t size)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_VA_FREE);
	uintptr_t va = (uintptr_t)dva;
	size_t i = res_upper(h, va);
	if (i == 0 || h->res[i - 1].va != va || h->res[i - 1].size != size) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	/* Anything still mapped inside: the first mapping at or after va. */
	size_t m = map_upper(h, va);
	if (m > 0 && h->maps[m - 1].va == va)
		m--;
	if (m < h->nmaps && h->maps[m].va < va + size) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (!h->unbacked && munmap((void *)va, size) != 0) {
		r_ = CUDA_ERROR_OPERATING_SYSTEM;
		goto out;
	}
	i--;
	memmove(h->res + i, h->res + i + 1, (h->nres - i - 1) * sizeof *h->res);
	h->nres--;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_mem_create(vpmm_driver *d, int device, size_t size,
				CUmemGenericAllocationHandle *out)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_MEM_CREATE);
	struct host_handle *hd = NULL;
	if (!out || size == 0 || !aligned(size, h->gran)) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (size > host_free(h)) {
		r_ = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	if (!(hd = handle_alloc(h))) {
		r_ = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	hd->size = size;
	if (!h->unbacked) {
		hd->fd = memfd_create("vpmm-host", MFD_CLOEXEC);
		if (hd->fd < 0 || ftruncate(hd->fd, (off_t)size) != 0) {
			handle_free(hd);
			r_ = CUDA_ERROR_OUT_OF_MEMORY;
			goto out;
		}
	}
	hd->id = h->next_id++;
	h->handles[h->nhandles++] = hd;
	h->handle_bytes += size;
	*out = hd->id;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_mem_release(vpmm_driver *d, CUmemGenericAllocationHandle id)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_MEM_RELEASE);
	struct host_handle *hd = handle_find(h, id, NULL);
	if (!hd || hd->released) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	hd->released = true;
	handle_settle(h, hd);
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_map(vpmm_driver *d, CUdeviceptr dva, size_t size,
			 CUmemGenericAllocationHandle id)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_MAP);
	uintptr_t va = (uintptr_t)dva;
	struct host_handle *hd = handle_find(h, id, NULL);
	if (!hd || hd->released || size != hd->size || va == 0 ||
	    !aligned(va, h->gran) || va + size < va) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	/* Inside one reservation. */
	size_t ri = res_upper(h, va);
	if (ri == 0 || va + size > h->res[ri - 1].va + h->res[ri - 1].size) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	/* Over nothing mapped: the mapping before ends at or before va, the
	 * one after starts at or after va + size. */
	size_t i = map_upper(h, va);
	if ((i > 0 && h->maps[i - 1].va + h->maps[i - 1].size > va) ||
	    (i < h->nmaps && h->maps[i].va < va + size)) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	struct host_map *maps = grow(h->maps, &h->capmaps, h->nmaps + 1,
				     sizeof *h->maps);
	if (!maps) {
		r_ = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	h->maps = maps;
	if (!h->unbacked) {
		void *p = mmap((void *)va, size, PROT_NONE, MAP_SHARED | MAP_FIXED,
			       hd->fd, 0);
		if (p == MAP_FAILED) {
			/* A failed MAP_FIXED may have dropped the placeholder. */
			placeholder(va, size);
			r_ = CUDA_ERROR_OUT_OF_MEMORY;
			goto out;
		}
	}
	memmove(h->maps + i + 1, h->maps + i, (h->nmaps - i) * sizeof *h->maps);
	h->maps[i] = (struct host_map){ va, size, hd, 0 };
	h->nmaps++;
	hd->maps++;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_unmap(vpmm_driver *d, CUdeviceptr dva, size_t size)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_UNMAP);
	uintptr_t va = (uintptr_t)dva, end = va + size;
	if (size == 0 || end < va) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	/* Whole mappings only, back to back from va to va + size. */
	size_t i = map_upper(h, va);
	if (i == 0 || h->maps[i - 1].va != va) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	i--;
	size_t j = i;
	uintptr_t at = va;
	while (j < h->nmaps && h->maps[j].va == at && at < end) {
		at += h->maps[j].size;
		j++;
	}
	if (at != end) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (!h->unbacked && !placeholder(va, size)) {
		r_ = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	for (size_t k = i; k < j; k++) {
		h->maps[k].h->maps--;
		handle_settle(h, h->maps[k].h);
	}
	memmove(h->maps + i, h->maps + j, (h->nmaps - j) * sizeof *h->maps);
	h->nmaps -= j - i;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_set_access(vpmm_driver *d, CUdeviceptr dva, size_t size,
				const int *devices, int ndevices)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_SET_ACCESS);
	uintptr_t va = (uintptr_t)dva, end = va + size;
	if (!devices || ndevices <= 0 || size == 0 || end < va ||
	    !aligned(va, h->gran) || !aligned(size, h->gran)) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	/* Every byte mapped: the mapping holding va, then mappings back to
	 * back up to end. */
	size_t i = map_upper(h, va);
	if (i == 0 || h->maps[i - 1].va + h->maps[i - 1].size <= va) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	uintptr_t at = h->maps[i - 1].va + h->maps[i - 1].size;
	while (at < end) {
		if (i == h->nmaps || h->maps[i].va != at) {
			r_ = CUDA_ERROR_INVALID_VALUE;
			goto out;
		}
		at += h->maps[i].size;
		i++;
	}
	uint64_t mask = 0;
	for (int k = 0; k < ndevices; k++) {
		/* the one context's device is 0 */
		int dev = devices[k] < 0 ? 0 : devices[k];
		if (dev >= 64) {
			r_ = CUDA_ERROR_INVALID_DEVICE;
			goto out;
		}
		mask |= (uint64_t)1 << dev;
	}
	/* mprotect only fails for lack of kernel memory (too many areas);
	 * what it changed before failing stays: access is only ever widened
	 * here and the pool treats the range as inaccessible on error. */
	if (!h->unbacked &&
	    mprotect((void *)va, size, PROT_READ | PROT_WRITE) != 0) {
		r_ = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	for (size_t k = map_upper(h, va) - 1; k < h->nmaps && h->maps[k].va < end; k++)
		h->maps[k].access |= mask;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_event_create(vpmm_driver *d, CUevent *out)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_EVENT_CREATE);
	struct host_event *ev;
	if (!out) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	ev = calloc(1, sizeof *ev);
	if (!ev || !ptr_insert(&h->events, &h->nevents, &h->capevents, ev)) {
		free(ev);
		r_ = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	*out = (CUevent)ev;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_event_record(vpmm_driver *d, CUevent e, CUstream st)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_EVENT_RECORD);
	struct host_event *ev = event_find(h, e);
	struct host_stream *s;
	struct host_record *rec;
	if (!ev) {
		r_ = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	if ((r_ = stream_find(h, st, &s)) != CUDA_SUCCESS)
		goto out;
	if (!queue_reserve(s) || !(rec = calloc(1, sizeof *rec))) {
		r_ = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	rec->refs = 2; /* the event and the queue entry */
	rec->event = ev;
	rec->stream = s;
	queue_push(s, ENTRY_RECORD, rec, ev);
	if (ev->rec) {
		ev->rec->event = NULL;
		rec_put(ev->rec);
	}
	ev->rec = rec;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_event_query(vpmm_driver *d, CUevent e)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_EVENT_QUERY);
	struct host_event *ev = event_find(h, e);
	if (!ev)
		r_ = CUDA_ERROR_INVALID_HANDLE;
	else if (ev->rec && !ev->rec->done)
		r_ = CUDA_ERROR_NOT_READY;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_event_sync(vpmm_driver *d, CUevent e)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_EVENT_SYNC);
	struct host_event *ev = event_find(h, e);
	if (!ev)
		r_ = CUDA_ERROR_INVALID_HANDLE;
	else if (ev->rec && !ev->rec->done)
		r_ = stream_run_until(ev->rec->stream, ev->rec);
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_event_destroy(vpmm_driver *d, CUevent e)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_EVENT_DESTROY);
	size_t pos;
	if (!ptr_find(h->events, h->nevents, e, &pos)) {
		r_ = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	/* A pending record stays queued (the device still runs up to it);
	 * it just no longer completes an event. */
	struct host_event *ev = (struct host_event *)e;
	ptr_remove(h->events, &h->nevents, pos);
	if (ev->rec) {
		ev->rec->event = NULL;
		rec_put(ev->rec);
	}
	free(ev);
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_stream_wait(vpmm_driver *d, CUstream st, CUevent e)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_STREAM_WAIT);
	struct host_event *ev = event_find(h, e);
	struct host_stream *s;
	if (!ev) {
		r_ = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	if ((r_ = stream_find(h, st, &s)) != CUDA_SUCCESS)
		goto out;
	/* Waiting on a complete or never-recorded event is a no-op on the
	 * device: nothing to queue. */
	if (ev->rec && !ev->rec->done) {
		if (!queue_reserve(s)) {
			r_ = CUDA_ERROR_OUT_OF_MEMORY;
			goto out;
		}
		ev->rec->refs++;
		queue_push(s, ENTRY_WAIT, ev->rec, ev);
	}
	s->waits++;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_stream_capturing(vpmm_driver *d, CUstream st,
				      bool *capturing)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_STREAM_CAPTURING);
	struct host_stream *s;
	if (!capturing) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if ((r_ = stream_find(h, st, &s)) == CUDA_SUCCESS)
		*capturing = s->capturing;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_mem_info(vpmm_driver *d, size_t *free_bytes,
			      size_t *total_bytes)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_MEM_INFO);
	if (!free_bytes || !total_bytes) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	*free_bytes = host_free(h);
	*total_bytes = h->capacity;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

/* One context per host driver, standing for the device's: any thread may
 * bind it. */
static CUresult host_ctx_current(vpmm_driver *d, CUcontext *out)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_CTX_CURRENT);
	if (!out)
		r_ = CUDA_ERROR_INVALID_VALUE;
	else
		*out = (CUcontext)h;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_ctx_bind(vpmm_driver *d, CUcontext ctx)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_CTX_BIND);
	if (ctx && ctx != (CUcontext)h)
		r_ = CUDA_ERROR_INVALID_CONTEXT;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_export_fd(vpmm_driver *d, CUmemGenericAllocationHandle id,
			       int *fd)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_EXPORT_FD);
	struct host_handle *hd = handle_find(h, id, NULL);
	if (!fd || !hd || hd->released) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (h->unbacked) {
		r_ = CUDA_ERROR_NOT_SUPPORTED;
		goto out;
	}
	int nfd = fcntl(hd->fd, F_DUPFD_CLOEXEC, 0);
	if (nfd < 0) {
		r_ = CUDA_ERROR_OPERATING_SYSTEM;
		goto out;
	}
	*fd = nfd;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_import_fd(vpmm_driver *d, int fd, CUmemGenericAllocationHandle *out)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_IMPORT_FD);
	struct host_handle *hd = NULL;
	struct stat st;
	if (!out || fd < 0) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (h->unbacked) {
		r_ = CUDA_ERROR_NOT_SUPPORTED;
		goto out;
	}
	/* What export_fd hands out: a memfd of whole pages. */
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
	    !aligned((uintptr_t)st.st_size, h->gran)) {
		r_ = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	if (!(hd = handle_alloc(h))) {
		r_ = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	hd->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (hd->fd < 0) {
		free(hd);
		r_ = CUDA_ERROR_OPERATING_SYSTEM;
		goto out;
	}
	hd->size = (size_t)st.st_size;
	hd->imported = true;
	hd->id = h->next_id++;
	h->handles[h->nhandles++] = hd;
	*out = hd->id;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

/* Frees the driver and, so that tests leak nothing, whatever it still
 * tracks: reservations (and the mappings inside), memfds, events, streams. */
static void host_destroy(vpmm_driver *d)
{
	struct host_driver *h = host_of(d);
	if (!h)
		return;
	if (!h->unbacked)
		for (size_t i = 0; i < h->nres; i++)
			munmap((void *)h->res[i].va, h->res[i].size);
	for (size_t i = 0; i < h->nhandles; i++)
		handle_free(h->handles[i]);
	for (size_t i = 0; i < h->nstreams; i++)
		stream_free(h->streams[i]);
	for (size_t i = 0; i < HOST_SPECIAL_STREAMS; i++)
		stream_free(h->special[i]);
	for (size_t i = 0; i < h->nevents; i++) {
		struct host_event *ev = h->events[i];
		rec_put(ev->rec);
		free(ev);
	}
	free(h->handles);
	free(h->res);
	free(h->maps);
	free(h->events);
	free(h->streams);
	pthread_cond_destroy(&h->gate_open);
	pthread_mutex_destroy(&h->lock);
	free(h);
}

CUresult vpmm_driver_host_create(const struct vpmm_host_options *opt,
				 vpmm_driver **out)
{
	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	struct vpmm_host_options o = { 0 };
	if (opt)
		o = *opt;
	if (!o.granularity)
		o.granularity = HOST_DEFAULT_GRANULARITY;
	if (!o.capacity)
		o.capacity = HOST_DEFAULT_CAPACITY;
	long page = sysconf(_SC_PAGESIZE);
	if (o.granularity < 4096 || (o.granularity & (o.granularity - 1)) ||
	    (!o.unbacked && page > 0 && o.granularity % (size_t)page))
		return CUDA_ERROR_INVALID_VALUE;

	struct host_driver *h = calloc(1, sizeof *h);
	if (!h)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (pthread_mutex_init(&h->lock, NULL) != 0) {
		free(h);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (pthread_cond_init(&h->gate_open, NULL) != 0) {
		pthread_mutex_destroy(&h->lock);
		free(h);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	h->gran = o.granularity;
	h->capacity = o.capacity;
	h->unbacked = o.unbacked;
	h->next_va = HOST_UNBACKED_BASE;
	h->next_id = 1;
	h->base = (vpmm_driver){
		.name = "host",
		.granularity = host_granularity,
		.va_reserve = host_va_reserve,
		.va_free = host_va_free,
		.mem_create = host_mem_create,
		.mem_release = host_mem_release,
		.map = host_map,
		.unmap = host_unmap,
		.set_access = host_set_access,
		.event_create = host_event_create,
		.event_record = host_event_record,
		.event_query = host_event_query,
		.event_sync = host_event_sync,
		.event_destroy = host_event_destroy,
		.stream_wait = host_stream_wait,
		.stream_capturing = host_stream_capturing,
		.mem_info = host_mem_info,
		.export_fd = host_export_fd,
		.import_fd = host_import_fd,
		.ctx_current = host_ctx_current,
		.ctx_bind = host_ctx_bind,
		.destroy = host_destroy,
	};
	*out = &h->base;
	return CUDA_SUCCESS;
}

/* ---- test controls ---------------------------------------------------------------- */

/* The host driver behind `d`, or NULL for another driver (the controls then
 * do nothing rather than scribble over a foreign object). */
static struct host_driver *host_checked(vpmm_driver *d)
{
	return d && d->destroy == host_destroy ? host_of(d) : NULL;
}

CUstream vpmm_host_stream_create(vpmm_driver *d)
{
	struct host_driver *h = host_checked(d);
	if (!h)
		return NULL;
	struct host_stream *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	pthread_mutex_lock(&h->lock);
	if (!ptr_insert(&h->streams, &h->nstreams, &h->capstreams, s)) {
		free(s);
		s = NULL;
	}
	pthread_mutex_unlock(&h->lock);
	return (CUstream)s;
}

unsigned vpmm_host_stream_complete(vpmm_driver *d, CUstream st)
{
	struct host_driver *h = host_checked(d);
	if (!h)
		return 0;
	unsigned n = 0;
	size_t moved = 0;
	struct host_stream *s;
	pthread_mutex_lock(&h->lock);
	if (stream_find(h, st, &s) == CUDA_SUCCESS)
		n = stream_run(s, &moved);
	pthread_mutex_unlock(&h->lock);
	return n;
}

unsigned vpmm_host_complete_all(vpmm_driver *d)
{
	struct host_driver *h = host_checked(d);
	if (!h)
		return 0;
	unsigned n = 0;
	size_t moved;
	pthread_mutex_lock(&h->lock);
	do {
		moved = 0;
		for (size_t i = 0; i < HOST_SPECIAL_STREAMS; i++)
			if (h->special[i])
				n += stream_run(h->special[i], &moved);
		for (size_t i = 0; i < h->nstreams; i++)
			n += stream_run(h->streams[i], &moved);
	} while (moved);
	pthread_mutex_unlock(&h->lock);
	return n;
}

unsigned vpmm_host_complete_nth(vpmm_driver *d, size_t n)
{
	struct host_driver *h = host_checked(d);
	if (!h)
		return 0;
	unsigned done = 0;
	size_t moved = 0;
	pthread_mutex_lock(&h->lock);
	if (h->nstreams + HOST_SPECIAL_STREAMS) {
		n %= h->nstreams + HOST_SPECIAL_STREAMS;
		struct host_stream *s = n < h->nstreams ? h->streams[n]
				      : h->special[n - h->nstreams];
		if (s)
			done = stream_run(s, &moved);
	}
	pthread_mutex_unlock(&h->lock);
	return done;
}

bool vpmm_host_stream_waits_on(vpmm_driver *d, CUstream st, CUevent ev)
{
	struct host_driver *h = host_checked(d);
	if (!h)
		return false;
	bool found = false;
	struct host_stream *s;
	pthread_mutex_lock(&h->lock);
	if (stream_find(h, st, &s) == CUDA_SUCCESS)
		for (size_t i = s->head; i < s->len && !found; i++)
			found = s->q[i].kind == ENTRY_WAIT &&
				s->q[i].event == (const void *)ev;
	pthread_mutex_unlock(&h->lock);
	return found;
}

unsigned long vpmm_host_stream_wait_count(vpmm_driver *d, CUstream st)
{
	struct host_driver *h = host_checked(d);
	if (!h)
		return 0;
	unsigned long n = 0;
	struct host_stream *s;
	pthread_mutex_lock(&h->lock);
	if (stream_find(h, st, &s) == CUDA_SUCCESS)
		n = s->waits;
	pthread_mutex_unlock(&h->lock);
	return n;
}

void vpmm_host_set_capturing(vpmm_driver *d, CUstream st, bool capturing)
{
	struct host_driver *h = host_checked(d);
	if (!h)
		return;
	struct host_stream *s;
	pthread_mutex_lock(&h->lock);
	if (stream_find(h, st, &s) == CUDA_SUCCESS)
		s->capturing = capturing;
	pthread_mutex_unlock(&h->lock);
}

void vpmm_host_gate(vpmm_driver *d, enum vpmm_op op, bool closed)
{
	struct host_driver *h = host_checked(d);
	if (!h || (unsigned)op >= VPMM_OP_COUNT)
		return;
	pthread_mutex_lock(&h->lock);
	h->gate[op] = closed;
	pthread_cond_broadcast(&h->gate_open);
	pthread_mutex_unlock(&h->lock);
}

void vpmm_host_fail(vpmm_driver *d, enum vpmm_op op, unsigned long nth,
		    CUresult result)
{
	struct host_driver *h = host_checked(d);
	if (!h || (unsigned)op >= VPMM_OP_COUNT)
		return;
	pthread_mutex_lock(&h->lock);
	/* A "failure" with CUDA_SUCCESS would claim an effect that did not
	 * happen: it disarms instead. */
	h->fault[op].nth = result == CUDA_SUCCESS ? 0 : nth;
	h->fault[op].result = result;
	pthread_mutex_unlock(&h->lock);
}

unsigned long vpmm_host_calls(vpmm_driver *d, enum vpmm_op op)
{
	struct host_driver *h = host_checked(d);
	if (!h || (unsigned)op >= VPMM_OP_COUNT)
		return 0;
	pthread_mutex_lock(&h->lock);
	unsigned long n = h->calls[op];
	pthread_mutex_unlock(&h->lock);
	return n;
}

void vpmm_host_set_hook(vpmm_driver *d, vpmm_host_hook fn, void *arg)
{
	struct host_driver *h = host_checked(d);
	if (!h)
		return;
	h->hook_arg = arg;
	__atomic_store_n(&h->hook, fn, __ATOMIC_RELEASE);
}

void vpmm_host_set_tenant(vpmm_driver *d, size_t bytes)
{
	struct host_driver *h = host_of(d);
	pthread_mutex_lock(&h->lock);
	h->tenant = bytes;
	pthread_mutex_unlock(&h->lock);
}

size_t vpmm_host_free_bytes(vpmm_driver *d)
{
	struct host_driver *h = host_of(d);
	pthread_mutex_lock(&h->lock);
	size_t n = host_free(h);
	pthread_mutex_unlock(&h->lock);
	return n;
}

bool vpmm_host_accessible(vpmm_driver *d, CUdeviceptr dva, int device)
{
	struct host_driver *h = host_checked(d);
	if (!h || device < 0 || device >= 64)
		return false;
	uintptr_t va = (uintptr_t)dva;
	pthread_mutex_lock(&h->lock);
	size_t i = map_upper(h, va);
	bool ok = i > 0 && h->maps[i - 1].va + h->maps[i - 1].size > va &&
		  (h->maps[i - 1].access >> device & 1);
	pthread_mutex_unlock(&h->lock);
	return ok;
}

void vpmm_host_live(vpmm_driver *d, struct vpmm_host_live *out)
{
	struct host_driver *h = host_checked(d);
	if (!out)
		return;
	*out = (struct vpmm_host_live){ 0 };
	if (!h)
		return;
	pthread_mutex_lock(&h->lock);
	out->handles = h->nhandles;
	out->handle_bytes = h->handle_bytes;
	out->reservations = h->nres;
	out->mappings = h->nmaps;
	out->events = h->nevents;
	pthread_mutex_unlock(&h->lock);
}
