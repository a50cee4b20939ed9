/* _history.c — the extension module vpmm._history: the Python stack frames
 * of the pool's allocations, for vpmm.record_history() and vpmm.snapshot().
 *
 * libvpmm.so (which must not link libpython: it is preloaded into programs
 * that may have none) calls an observer on every allocation and free the
 * pool takes (vpmm_set_alloc_observer of vpmm/vpmm.h); this module is that
 * observer. The package hands it the library's vpmm_set_alloc_observer by
 * address (the library the process already has: _lib.handle()), so that
 * this module links nothing of the library.
 *
 * Per event, on the allocating or freeing thread:
 *  - when Python code waits above the allocation on that thread (PyTorch
 *    allocating for a Python call, usually with the GIL released: the GIL
 *    is then taken for the walk, as PyTorch's own history does), the
 *    thread's Python frames, innermost first (up to MAX_DEPTH), as
 *    (code object, instruction) pairs, each interned once with its line
 *    (the table holds a reference to the code object, so its address is
 *    never reused for another), and the sequence of their ids interned as
 *    one stack id; a thread Python does not know, or one with no Python
 *    frames (PyTorch's autograd threads), gets none, and nothing of Python
 *    is touched nor the GIL taken for it;
 *  - under the module's own lock: the live map (address -> device, bytes
 *    asked for, stack id) gains the allocation or drops the freed address,
 *    and the trace (a ring of the last max_entries events) gains the event.
 * No Python code runs and nothing of Python is allocated under the lock
 * (the lock is never held across a call that could reach the allocator
 * again); from 3.11 on, where walking the frames may create frame objects,
 * the garbage collector is paused for the walk, so that no finaliser runs
 * inside an allocation. Names (co_filename, co_name) are read from the code
 * objects only when a snapshot is read.
 *
 * The frame and stack tables grow with the program's distinct call sites
 * (instructions) and paths, not with its allocations: the live map holds one entry per
 * live recorded allocation, the trace at most max_entries. stop() empties
 * everything.
 *
 * Calls: the Python C API, pthread, and the observer setter it is given.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The observer interface of vpmm/vpmm.h, repeated here (this module is
 * built without the library's headers; the layout is the library's ABI). */
struct vpmm_alloc_event {
	int kind;
	int device;
	unsigned long long address;
	size_t size;
	void *stream;
};
enum { EVENT_ALLOC = 1, EVENT_FREE = 2 };
typedef void (*observer_fn)(void *ctx, const struct vpmm_alloc_event *event);
typedef int (*set_observer_fn)(observer_fn fn, void *ctx);

#define MAX_DEPTH 128
#define NONE UINT32_MAX /* no stack: no frames */

struct frame {
	PyObject *code; /* a reference held */
	int lasti;      /* the instruction's byte offset: the key with code */
	int line;       /* its line, found once, when interned */
};
struct stack {
	uint32_t off, len; /* in stack_ids */
	uint64_t hash;
};
struct live {
	uint64_t addr; /* 0: an empty slot */
	uint64_t size;
	uint32_t stack;
	int32_t device;
};
struct event {
	uint64_t addr, size, stream;
	int64_t time_us;
	uint32_t stack;
	int16_t device;
	uint8_t kind;
};

/* A table of uint32 indices with open addressing, NONE for empty. */
struct index {
	uint32_t *slot;
	size_t cap; /* a power of two, or 0 */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct tables {
	struct frame *frames;
	size_t nframes, frames_cap;
	struct index frame_index;
	struct stack *stacks;
	size_t nstacks, stacks_cap;
	struct index stack_index;
	uint32_t *stack_ids;
	size_t nids, ids_cap;
	struct live *live;
	size_t nlive, live_cap;
	struct event *trace;
	size_t trace_cap, trace_start, trace_len;
	unsigned long long dropped; /* events the ring overwrote */
	unsigned long long lost;    /* events not recorded: no memory */
} T;

static atomic_int recording;
static atomic_uint generation; /* a stop() in between: the event is dropped */
static set_observer_fn set_observer;

static uint64_t mix(uint64_t h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ULL;
	return h ^ (h >> 33);
}

static int grow(void **p, size_t *cap, size_t want, size_t elem)
{
	size_t n = *cap ? *cap : 64;
	void *q;
	if (want <= *cap)
		return 0;
	while (n < want)
		n *= 2;
	q = realloc(*p, n * elem);
	if (!q)
		return -1;
	*p = q;
	*cap = n;
	return 0;
}

/* ---- interning (under the lock) ------------------------------------------------ */

static uint64_t frame_hash(PyObject *code, int lasti)
{
	return mix((uint64_t)(uintptr_t)code ^ ((uint64_t)(unsigned)lasti << 48));
}

static uint64_t stack_hash(const uint32_t *ids, size_t n)
{
	uint64_t h = n;
	for (size_t i = 0; i < n; i++)
		h = mix(h ^ ids[i]);
	return h;
}

/* Rebuilds an index of `n` entries whose hashes `hash_of` gives, at twice
 * the capacity. */
static int reindex(struct index *ix, size_t n, uint64_t (*hash_of)(uint32_t))
{
	size_t cap = ix->cap ? ix->cap * 2 : 256;
	uint32_t *slot = malloc(cap * sizeof *slot);
	if (!slot)
		return -1;
	memset(slot, 0xff, cap * sizeof *slot);
	for (uint32_t i = 0; i < n; i++) {
		size_t j = hash_of(i) & (cap - 1);
		while (slot[j] != NONE)
			j = (j + 1) & (cap - 1);
		slot[j] = i;
	}
	free(ix->slot);
	ix->slot = slot;
	ix->cap = cap;
	return 0;
}

static uint64_t frame_hash_of(uint32_t i)
{
	return frame_hash(T.frames[i].code, T.frames[i].lasti);
}

static uint64_t stack_hash_of(uint32_t i)
{
	return T.stacks[i].hash;
}

/* The id of (code, lasti), added (with a reference to code, and its line)
 * if new; NONE when out of memory. The GIL is held. Keyed by the
 * instruction rather than the line: finding the line decodes the code's
 * line table, which is done once per instruction instead of once per
 * frame of every event. */
static uint32_t intern_frame(PyObject *code, int lasti)
{
	uint64_t h = frame_hash(code, lasti);
	size_t j;
	if ((T.nframes + 1) * 2 > T.frame_index.cap &&
	    reindex(&T.frame_index, T.nframes, frame_hash_of))
		return NONE;
	for (j = h & (T.frame_index.cap - 1); T.frame_index.slot[j] != NONE;
	     j = (j + 1) & (T.frame_index.cap - 1)) {
		struct frame *f = &T.frames[T.frame_index.slot[j]];
		if (f->code == code && f->lasti == lasti)
			return T.frame_index.slot[j];
	}
	if (grow((void **)&T.frames, &T.frames_cap, T.nframes + 1, sizeof *T.frames))
		return NONE;
	Py_INCREF(code);
	T.frames[T.nframes] = (struct frame){code, lasti,
					     PyCode_Addr2Line((PyCodeObject *)code, lasti)};
	T.frame_index.slot[j] = (uint32_t)T.nframes;
	return (uint32_t)T.nframes++;
}

static uint32_t intern_stack(const uint32_t *ids, size_t n)
{
	uint64_t h = stack_hash(ids, n);
	size_t j;
	if ((T.nstacks + 1) * 2 > T.stack_index.cap &&
	    reindex(&T.stack_index, T.nstacks, stack_hash_of))
		return NONE;
	for (j = h & (T.stack_index.cap - 1); T.stack_index.slot[j] != NONE;
	     j = (j + 1) & (T.stack_index.cap - 1)) {
		struct stack *s = &T.stacks[T.stack_index.slot[j]];
		if (s->hash == h && s->len == n &&
		    !memcmp(T.stack_ids + s->off, ids, n * sizeof *ids))
			return T.stack_index.slot[j];
	}
	if (grow((void **)&T.stacks, &T.stacks_cap, T.nstacks + 1, sizeof *T.stacks) ||
	    grow((void **)&T.stack_ids, &T.ids_cap, T.nids + n, sizeof *T.stack_ids))
		return NONE;
	memcpy(T.stack_ids + T.nids, ids, n * sizeof *ids);
	T.stacks[T.nstacks] = (struct stack){(uint32_t)T.nids, (uint32_t)n, h};
	T.nids += n;
	T.stack_index.slot[j] = (uint32_t)T.nstacks;
	return (uint32_t)T.nstacks++;
}

/* ---- the live map (under the lock) ------------------------------------------------ */

static size_t live_slot(uint64_t addr)
{
	size_t j = mix(addr) & (T.live_cap - 1);
	while (T.live[j].addr && T.live[j].addr != addr)
		j = (j + 1) & (T.live_cap - 1);
	return j;
}

static int live_put(const struct live *e)
{
	if ((T.nlive + 1) * 2 > T.live_cap) {
		struct live *old = T.live;
		size_t oldcap = T.live_cap, cap = oldcap ? oldcap * 2 : 1024;
		struct live *fresh = calloc(cap, sizeof *fresh);
		if (!fresh)
			return -1;
		T.live = fresh;
		T.live_cap = cap;
		for (size_t i = 0; i < oldcap; i++)
			if (old[i].addr)
				T.live[live_slot(old[i].addr)] = old[i];
		free(old);
	}
	size_t j = live_slot(e->addr);
	if (!T.live[j].addr)
		T.nlive++;
	T.live[j] = *e;
	return 0;
}

/* Removes addr, backward-shifting the entries after it; its bytes asked
 * for into *size when it was there. */
static void live_drop(uint64_t addr, uint64_t *size)
{
	size_t mask = T.live_cap - 1, i, j;
	if (!T.live_cap)
		return;
	i = live_slot(addr);
	if (!T.live[i].addr)
		return;
	*size = T.live[i].size;
	T.nlive--;
	for (j = (i + 1) & mask; T.live[j].addr; j = (j + 1) & mask) {
		size_t home = mix(T.live[j].addr) & mask;
		/* the entry at j may move to i when its home is not in (i, j] */
		if (((j - home) & mask) >= ((j - i) & mask)) {
			T.live[i] = T.live[j];
			i = j;
		}
	}
	T.live[i].addr = 0;
}

static void trace_add(const struct event *e)
{
	if (!T.trace_cap)
		return;
	if (T.trace_len == T.trace_cap) {
		T.trace_start = (T.trace_start + 1) % T.trace_cap;
		T.trace_len--;
		T.dropped++;
	}
	T.trace[(T.trace_start + T.trace_len++) % T.trace_cap] = *e;
}

/* ---- the observer ------------------------------------------------------------------ */

/* The byte offset of the frame's current instruction, as PyCode_Addr2Line
 * takes it. */
static int frame_lasti(PyFrameObject *f)
{
#if PY_VERSION_HEX >= 0x030B0000
	return PyFrame_GetLasti(f);
#elif PY_VERSION_HEX >= 0x030A0000
	return f->f_lasti < 0 ? f->f_lasti : f->f_lasti * 2; /* in code units */
#else
	return f->f_lasti;
#endif
}

/* The calling thread's Python frames, innermost first, with a reference to
 * each code object; the GIL is held. */
static size_t walk_frames(PyThreadState *ts, PyObject **codes, int *lastis)
{
	size_t n = 0;
	int had_error = PyErr_Occurred() != NULL;
#if PY_VERSION_HEX >= 0x030B0000
	int gc_was = PyGC_Disable(); /* PyFrame_GetBack may create frame objects */
#endif
#if PY_VERSION_HEX >= 0x03090000
	PyFrameObject *f = PyThreadState_GetFrame(ts);
	while (f && n < MAX_DEPTH) {
		PyFrameObject *back;
		codes[n] = (PyObject *)PyFrame_GetCode(f);
		lastis[n++] = frame_lasti(f);
		back = PyFrame_GetBack(f);
		Py_DECREF(f);
		f = back;
	}
	Py_XDECREF(f);
#else
	for (PyFrameObject *f = ts->frame; f && n < MAX_DEPTH; f = f->f_back) {
		codes[n] = (PyObject *)f->f_code;
		Py_INCREF(codes[n]);
		lastis[n++] = frame_lasti(f);
	}
#endif
#if PY_VERSION_HEX >= 0x030B0000
	if (gc_was)
		PyGC_Enable();
#endif
	if (!had_error && PyErr_Occurred())
		PyErr_Clear(); /* out of memory for a frame object: fewer frames */
	return n;
}

/* Whether the thread, which does not hold the GIL, has Python frames
 * waiting above the C code it runs: read without the GIL, which is safe
 * for the calling thread's own state (only it changes its frame pointer,
 * and it is here). A thread with none (PyTorch's autograd threads keep a
 * thread state for their hooks) is not worth the GIL. */
static bool has_python_frames(PyThreadState *ts)
{
#if PY_VERSION_HEX >= 0x030D0000
	return ts->current_frame != NULL;
#elif PY_VERSION_HEX >= 0x030B0000
	return ts->cframe && ts->cframe->current_frame != NULL;
#else
	return ts->frame != NULL;
#endif
}

static void observe(void *ctx, const struct vpmm_alloc_event *ev)
{
	PyObject *codes[MAX_DEPTH];
	int lastis[MAX_DEPTH];
	uint32_t ids[MAX_DEPTH];
	size_t n = 0, k = 0;
	unsigned gen = atomic_load(&generation);
	PyThreadState *ts = NULL;
	PyGILState_STATE gil = PyGILState_UNLOCKED;
	bool took_gil = false;
	struct timespec now;
	(void)ctx;
	if (!atomic_load_explicit(&recording, memory_order_relaxed))
		return;
	/* Python's frames only on a thread Python knows (never once the
	 * interpreter is finalising): with the GIL it holds, or else, when
	 * the thread released it to run C code (PyTorch's operators do)
	 * while Python frames wait above, with the GIL taken for the walk. */
	if (Py_IsInitialized() && (ts = PyGILState_GetThisThreadState())) {
		if (!PyGILState_Check()) {
			if (has_python_frames(ts)) {
				gil = PyGILState_Ensure();
				took_gil = true;
			} else {
				ts = NULL;
			}
		}
		if (ts)
			n = walk_frames(ts, codes, lastis);
	}
	clock_gettime(CLOCK_REALTIME, &now);
	struct event e = {ev->address, ev->size, (uint64_t)(uintptr_t)ev->stream,
			  (int64_t)now.tv_sec * 1000000 + now.tv_nsec / 1000, NONE,
			  (int16_t)ev->device, (uint8_t)ev->kind};

	pthread_mutex_lock(&lock);
	if (atomic_load(&generation) == gen && atomic_load(&recording)) {
		for (k = 0; k < n; k++)
			if ((ids[k] = intern_frame(codes[k], lastis[k])) == NONE)
				break;
		if (n && k == n)
			e.stack = intern_stack(ids, n);
		if (ev->kind == EVENT_ALLOC) {
			struct live l = {ev->address, ev->size, e.stack, ev->device};
			if (live_put(&l))
				T.lost++;
		} else {
			live_drop(ev->address, &e.size);
		}
		trace_add(&e);
	}
	pthread_mutex_unlock(&lock);
	for (k = 0; k < n; k++)
		Py_DECREF(codes[k]);
	if (took_gil)
		PyGILState_Release(gil);
}

/* ---- the module's functions ------------------------------------------------------------ */

/* Empties every table under the lock; the code objects' references are
 * given back after it (a deallocation may run Python code). */
static void clear_all(void)
{
	struct frame *frames;
	size_t nframes;
	pthread_mutex_lock(&lock);
	frames = T.frames;
	nframes = T.nframes;
	free(T.frame_index.slot);
	free(T.stacks);
	free(T.stack_index.slot);
	free(T.stack_ids);
	free(T.live);
	free(T.trace);
	T = (struct tables){0};
	pthread_mutex_unlock(&lock);
	for (size_t i = 0; i < nframes; i++)
		Py_DECREF(frames[i].code);
	free(frames);
}

static PyObject *h_attach(PyObject *self, PyObject *arg)
{
	unsigned long long fn = PyLong_AsUnsignedLongLong(arg);
	if (PyErr_Occurred())
		return NULL;
	if (!fn) {
		PyErr_SetString(PyExc_ValueError, "vpmm_set_alloc_observer's address is 0");
		return NULL;
	}
	set_observer = (set_observer_fn)(uintptr_t)fn;
	Py_RETURN_NONE;
}

static PyObject *h_start(PyObject *self, PyObject *arg)
{
	Py_ssize_t max_entries = PyLong_AsSsize_t(arg);
	if (max_entries == -1 && PyErr_Occurred())
		return NULL;
	if (max_entries < 0) {
		PyErr_SetString(PyExc_ValueError, "max_entries must be 0 or more");
		return NULL;
	}
	if (!set_observer) {
		PyErr_SetString(PyExc_RuntimeError, "attach() first");
		return NULL;
	}
	atomic_store(&recording, 0);
	atomic_fetch_add(&generation, 1);
	clear_all();
	if (max_entries) {
		pthread_mutex_lock(&lock);
		T.trace = malloc((size_t)max_entries * sizeof *T.trace);
		T.trace_cap = T.trace ? (size_t)max_entries : 0;
		pthread_mutex_unlock(&lock);
		if (!T.trace_cap)
			return PyErr_NoMemory();
	}
	atomic_store(&recording, 1);
	if (set_observer(observe, NULL)) {
		atomic_store(&recording, 0);
		return PyErr_NoMemory();
	}
	Py_RETURN_NONE;
}

static PyObject *h_stop(PyObject *self, PyObject *unused)
{
	if (set_observer)
		set_observer(NULL, NULL);
	atomic_store(&recording, 0);
	atomic_fetch_add(&generation, 1);
	clear_all();
	Py_RETURN_NONE;
}

static PyObject *h_recording(PyObject *self, PyObject *unused)
{
	return PyBool_FromLong(atomic_load(&recording));
}

static PyObject *h_counts(PyObject *self, PyObject *unused)
{
	size_t c[5];
	unsigned long long dropped, lost;
	pthread_mutex_lock(&lock);
	c[0] = T.nlive, c[1] = T.nframes, c[2] = T.nstacks, c[3] = T.trace_len, c[4] = T.nids;
	dropped = T.dropped, lost = T.lost;
	pthread_mutex_unlock(&lock);
	return Py_BuildValue("{s:n,s:n,s:n,s:n,s:n,s:K,s:K}", "live", (Py_ssize_t)c[0], "frames",
			     (Py_ssize_t)c[1], "stacks", (Py_ssize_t)c[2], "trace",
			     (Py_ssize_t)c[3], "stack_frames", (Py_ssize_t)c[4], "dropped",
			     dropped, "lost", lost);
}

/* What read() copies under the lock, to build Python objects after it. */
struct copy {
	struct frame *frames;
	size_t nframes;
	struct stack *stacks;
	size_t nstacks;
	uint32_t *ids;
	struct live *live;
	size_t nlive;
	struct event *trace;
	size_t ntrace;
};

static int copy_tables(struct copy *c)
{
	size_t k = 0;
	memset(c, 0, sizeof *c);
	pthread_mutex_lock(&lock);
	c->nframes = T.nframes, c->nstacks = T.nstacks, c->nlive = T.nlive,
	c->ntrace = T.trace_len;
	c->frames = malloc((c->nframes + 1) * sizeof *c->frames);
	c->stacks = malloc((c->nstacks + 1) * sizeof *c->stacks);
	c->ids = malloc((T.nids + 1) * sizeof *c->ids);
	c->live = malloc((c->nlive + 1) * sizeof *c->live);
	c->trace = malloc((c->ntrace + 1) * sizeof *c->trace);
	if (c->frames && c->stacks && c->ids && c->live && c->trace) {
		memcpy(c->frames, T.frames, c->nframes * sizeof *c->frames);
		for (size_t i = 0; i < c->nframes; i++)
			Py_INCREF(c->frames[i].code);
		memcpy(c->stacks, T.stacks, c->nstacks * sizeof *c->stacks);
		memcpy(c->ids, T.stack_ids, T.nids * sizeof *c->ids);
		for (size_t i = 0; i < T.live_cap; i++)
			if (T.live[i].addr)
				c->live[k++] = T.live[i];
		for (size_t i = 0; i < c->ntrace; i++)
			c->trace[i] = T.trace[(T.trace_start + i) % T.trace_cap];
	} else {
		c->nframes = 0;
	}
	pthread_mutex_unlock(&lock);
	return c->frames && c->stacks && c->ids && c->live && c->trace ? 0 : -1;
}

static void free_copy(struct copy *c)
{
	for (size_t i = 0; i < c->nframes; i++)
		Py_DECREF(c->frames[i].code);
	free(c->frames);
	free(c->stacks);
	free(c->ids);
	free(c->live);
	free(c->trace);
}

/* The dict {"filename", "line", "name"} of each frame. */
static PyObject *frame_dicts(const struct copy *c)
{
	PyObject *out = PyList_New((Py_ssize_t)c->nframes);
	for (size_t i = 0; out && i < c->nframes; i++) {
		PyObject *file = PyObject_GetAttrString(c->frames[i].code, "co_filename");
		PyObject *name = PyObject_GetAttrString(c->frames[i].code, "co_name");
		PyObject *d = file && name ? Py_BuildValue("{s:O,s:i,s:O}", "filename", file, "line",
							     c->frames[i].line, "name", name)
					   : NULL;
		Py_XDECREF(file);
		Py_XDECREF(name);
		if (!d) {
			Py_CLEAR(out);
			break;
		}
		PyList_SET_ITEM(out, (Py_ssize_t)i, d);
	}
	return out;
}

/* A new list of the stack's frame dicts ([] for NONE). */
static PyObject *stack_list(const struct copy *c, PyObject *frames, uint32_t sid)
{
	const struct stack *s;
	PyObject *l;
	if (sid == NONE || sid >= c->nstacks)
		return PyList_New(0);
	s = &c->stacks[sid];
	l = PyList_New(s->len);
	for (uint32_t i = 0; l && i < s->len; i++) {
		PyObject *f = PyList_GET_ITEM(frames, c->ids[s->off + i]);
		Py_INCREF(f);
		PyList_SET_ITEM(l, i, f);
	}
	return l;
}

/* read() -> (live, trace): live a dict {address: (device, size, frames)},
 * trace a list of (kind, device, address, size, stream, time_us, frames)
 * in the order the events happened ("alloc" or "free"); frames innermost
 * first, each {"filename", "line", "name"}. */
static PyObject *h_read(PyObject *self, PyObject *unused)
{
	struct copy c;
	PyObject *frames = NULL, *live = NULL, *trace = NULL, *ret = NULL;
	if (copy_tables(&c)) {
		free_copy(&c);
		return PyErr_NoMemory();
	}
	if (!(frames = frame_dicts(&c)) || !(live = PyDict_New()) ||
	    !(trace = PyList_New((Py_ssize_t)c.ntrace)))
		goto out;
	for (size_t i = 0; i < c.nlive; i++) {
		PyObject *st = stack_list(&c, frames, c.live[i].stack);
		PyObject *v = st ? Py_BuildValue("(iKN)", c.live[i].device,
						 (unsigned long long)c.live[i].size, st)
				 : NULL;
		PyObject *k = v ? PyLong_FromUnsignedLongLong(c.live[i].addr) : NULL;
		int e = k ? PyDict_SetItem(live, k, v) : -1;
		Py_XDECREF(k);
		Py_XDECREF(v);
		if (e)
			goto out;
	}
	for (size_t i = 0; i < c.ntrace; i++) {
		const struct event *e = &c.trace[i];
		PyObject *st = stack_list(&c, frames, e->stack);
		PyObject *v = st ? Py_BuildValue("(siKKKLN)",
						 e->kind == EVENT_ALLOC ? "alloc" : "free",
						 (int)e->device, (unsigned long long)e->addr,
						 (unsigned long long)e->size,
						 (unsigned long long)e->stream, (long long)e->time_us, st)
				 : NULL;
		if (!v)
			goto out;
		PyList_SET_ITEM(trace, (Py_ssize_t)i, v);
	}
	ret = PyTuple_Pack(2, live, trace);
out:
	Py_XDECREF(frames);
	Py_XDECREF(live);
	Py_XDECREF(trace);
	free_copy(&c);
	return ret;
}

static PyMethodDef methods[] = {
	{"attach", h_attach, METH_O, "attach(address of vpmm_set_alloc_observer)"},
	{"start", h_start, METH_O, "start(max_entries): records from now on, afresh"},
	{"stop", h_stop, METH_NOARGS, "stop(): records nothing more, forgets everything"},
	{"recording", h_recording, METH_NOARGS, "whether it records"},
	{"counts", h_counts, METH_NOARGS, "the sizes of the tables"},
	{"read", h_read, METH_NOARGS, "(live, trace) recorded so far"},
	{NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT, "vpmm._history",
	"The Python stack frames of the pool's allocations (vpmm.record_history).", -1, methods,
	NULL, NULL, NULL, NULL,
};

/* A fork() while another thread holds the lock would leave the child's
 * lock held for ever: the fork waits for it instead. */
static void fork_prepare(void)
{
	pthread_mutex_lock(&lock);
}

static void fork_done(void)
{
	pthread_mutex_unlock(&lock);
}

/* Exported whatever -fvisibility says (Python 3.8's PyMODINIT_FUNC does
 * not say it). */
__attribute__((visibility("default"))) PyMODINIT_FUNC PyInit__history(void);
PyMODINIT_FUNC PyInit__history(void)
{
	if (pthread_atfork(fork_prepare, fork_done, fork_done))
		return PyErr_NoMemory();
	return PyModule_Create(&module);
}
