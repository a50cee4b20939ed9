/* resolve.c — the real functions behind every hook, found once.
 *
 * Owns: glibc's dlsym, the libcuda handle, the real driver entry points
 * (forwarding targets of the wrappers, and the helpers the shim's rooms
 * call), the set of pointers the real libcuda may hand out for each wrapped
 * entry point, and the real runtime functions behind the runtime hooks.
 *
 * Why a set of pointers: a program asks for an entry point by base name,
 * version and flags ("cuMemAllocAsync", 12000, per-thread) and libcuda picks
 * the variant. Rather than re-deriving libcuda's rules, we ask libcuda for
 * every variant we wrap, both ways a program may (dlsym of the exported name,
 * cuGetProcAddress at the variant's first version with its flags), and later
 * compare what it handed the program with those pointers. A v1 cuMemAlloc
 * (32-bit sizes), a variant newer than ours, or any pointer we do not know is
 * therefore passed through untouched.
 *
 * May call: nothing of the shim but shim.h (the log).
 */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "resolve.h"
#include "shim.h"

void *(*vpmm_real_dlsym_fn)(void *, const char *);
struct vpmm_real vpmm_real;

/* ---- dlsym ----------------------------------------------------------------- */

static void *no_dlsym(void *handle, const char *name)
{
	(void)handle;
	(void)name;
	return NULL;
}

static pthread_once_t dlsym_once = PTHREAD_ONCE_INIT;

/* Runs first inside AddressSanitizer's start-up (it calls our dlsym):
 * nothing here may be instrumented. */
VPMM_EARLY static void find_dlsym(void)
{
	/* glibc 2.34 moved dlsym into libc under a new version; older ones
	 * keep the first version of each architecture. */
	static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5",
					       "GLIBC_2.17", "GLIBC_2.0"};
	void *p = NULL;
	for (size_t i = 0; !p && i < sizeof versions / sizeof versions[0]; i++)
		p = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
	if (p) {
		vpmm_real_dlsym_fn = VPMM_PTR_TO_FN(void *(*)(void *, const char *), p);
	} else {
		vpmm_log(VPMM_LOG_ERROR, "glibc's dlsym was not found: dlsym answers nothing");
		vpmm_real_dlsym_fn = no_dlsym;
	}
}

VPMM_EARLY void vpmm_resolve_dlsym(void)
{
	pthread_once(&dlsym_once, find_dlsym);
}

/* ---- libcuda ---------------------------------------------------------------- */

struct wrapped_def {
	const char *sym;  /* exported name */
	const char *base; /* cuGetProcAddress name */
	int version;      /* first version with this variant */
	cuuint64_t flags;
};

static const struct wrapped_def wrapped_defs[VPMM_W_COUNT] = {
	[VPMM_W_GPA_V2] = {"cuGetProcAddress_v2", "cuGetProcAddress", 12000, 0},
	[VPMM_W_GPA_V1] = {"cuGetProcAddress", "cuGetProcAddress", 11030, 0},
	[VPMM_W_MEM_ALLOC] = {"cuMemAlloc_v2", "cuMemAlloc", 3020, 0},
	[VPMM_W_MEM_FREE] = {"cuMemFree_v2", "cuMemFree", 3020, 0},
	[VPMM_W_ALLOC_ASYNC] = {"cuMemAllocAsync", "cuMemAllocAsync", 11020,
				CU_GET_PROC_ADDRESS_LEGACY_STREAM},
	[VPMM_W_ALLOC_ASYNC_PTSZ] = {"cuMemAllocAsync_ptsz", "cuMemAllocAsync", 11020,
				     CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
	[VPMM_W_FREE_ASYNC] = {"cuMemFreeAsync", "cuMemFreeAsync", 11020,
			       CU_GET_PROC_ADDRESS_LEGACY_STREAM},
	[VPMM_W_FREE_ASYNC_PTSZ] = {"cuMemFreeAsync_ptsz", "cuMemFreeAsync", 11020,
				    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
	[VPMM_W_MEM_GET_INFO] = {"cuMemGetInfo_v2", "cuMemGetInfo", 3020, 0},
	[VPMM_W_ADDRESS_RANGE] = {"cuMemGetAddressRange_v2", "cuMemGetAddressRange",
				  3020, 0},
	[VPMM_W_PTR_ATTR] = {"cuPointerGetAttribute", "cuPointerGetAttribute", 4000, 0},
	[VPMM_W_PTR_ATTRS] = {"cuPointerGetAttributes", "cuPointerGetAttributes", 7000, 0},
	[VPMM_W_STREAM_DESTROY] = {"cuStreamDestroy_v2", "cuStreamDestroy", 4000, 0},
	[VPMM_W_IPC_GET] = {"cuIpcGetMemHandle", "cuIpcGetMemHandle", 4010, 0},
	[VPMM_W_IPC_OPEN] = {"cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle", 11000, 0},
	[VPMM_W_IPC_CLOSE] = {"cuIpcCloseMemHandle", "cuIpcCloseMemHandle", 4010, 0},
	[VPMM_W_PEER_ENABLE] = {"cuCtxEnablePeerAccess", "cuCtxEnablePeerAccess", 4000, 0},
	[VPMM_W_MEM_CREATE] = {"cuMemCreate", "cuMemCreate", 10020, 0},
	[VPMM_W_CTX_DESTROY] = {"cuCtxDestroy_v2", "cuCtxDestroy", 4000, 0},
	[VPMM_W_CTX_CREATE] = {"cuCtxCreate_v2", "cuCtxCreate", 3020, 0},
	[VPMM_W_CTX_CREATE_V3] = {"cuCtxCreate_v3", "cuCtxCreate", 11040, 0},
	[VPMM_W_CTX_CREATE_V4] = {"cuCtxCreate_v4", "cuCtxCreate", 12050, 0},
	[VPMM_W_GREEN_CTX_CREATE] = {"cuGreenCtxCreate", "cuGreenCtxCreate", 12040, 0},
	[VPMM_W_PRIMARY_RESET] = {"cuDevicePrimaryCtxReset_v2", "cuDevicePrimaryCtxReset",
				  11000, 0},
	[VPMM_W_STREAM_CREATE] = {"cuStreamCreate", "cuStreamCreate", 2000, 0},
	[VPMM_W_STREAM_CREATE_PRIO] = {"cuStreamCreateWithPriority", "cuStreamCreateWithPriority",
				       5050, 0},
	[VPMM_W_GREEN_STREAM_CREATE] = {"cuGreenCtxStreamCreate", "cuGreenCtxStreamCreate",
					12050, 0},
	[VPMM_W_BEGIN_CAPTURE] = {"cuStreamBeginCapture", "cuStreamBeginCapture", 10000,
				  CU_GET_PROC_ADDRESS_LEGACY_STREAM},
	[VPMM_W_BEGIN_CAPTURE_PTSZ] = {"cuStreamBeginCapture_ptsz", "cuStreamBeginCapture", 10000,
				       CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
	[VPMM_W_BEGIN_CAPTURE_V2] = {"cuStreamBeginCapture_v2", "cuStreamBeginCapture", 10010,
				     CU_GET_PROC_ADDRESS_LEGACY_STREAM},
	[VPMM_W_BEGIN_CAPTURE_V2_PTSZ] = {"cuStreamBeginCapture_v2_ptsz", "cuStreamBeginCapture",
					  10010, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
	[VPMM_W_BEGIN_TO_GRAPH] = {"cuStreamBeginCaptureToGraph", "cuStreamBeginCaptureToGraph",
				   12030, CU_GET_PROC_ADDRESS_LEGACY_STREAM},
	[VPMM_W_BEGIN_TO_GRAPH_PTSZ] = {"cuStreamBeginCaptureToGraph_ptsz",
					"cuStreamBeginCaptureToGraph", 12030,
					CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
	[VPMM_W_END_CAPTURE] = {"cuStreamEndCapture", "cuStreamEndCapture", 10000,
				CU_GET_PROC_ADDRESS_LEGACY_STREAM},
	[VPMM_W_END_CAPTURE_PTSZ] = {"cuStreamEndCapture_ptsz", "cuStreamEndCapture", 10000,
				     CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
	[VPMM_W_RETAIN_HANDLE] = {"cuMemRetainAllocationHandle", "cuMemRetainAllocationHandle",
				  11000, 0},
	[VPMM_W_DEVICE_SET_MEMPOOL] = {"cuDeviceSetMemPool", "cuDeviceSetMemPool", 11020, 0},
	[VPMM_W_MEM_SET_MEMPOOL] = {"cuMemSetMemPool", "cuMemSetMemPool", 13000, 0},
	[VPMM_W_MEMPOOL_DESTROY] = {"cuMemPoolDestroy", "cuMemPoolDestroy", 11020, 0},
	[VPMM_W_MEMPOOL_GET_ATTR] = {"cuMemPoolGetAttribute", "cuMemPoolGetAttribute", 11020, 0},
	[VPMM_W_MEMPOOL_SET_ATTR] = {"cuMemPoolSetAttribute", "cuMemPoolSetAttribute", 11020, 0},
	[VPMM_W_MEMPOOL_TRIM] = {"cuMemPoolTrimTo", "cuMemPoolTrimTo", 11020, 0},
};

#define KNOWN_MAX 4
static void *known[VPMM_W_COUNT][KNOWN_MAX];

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static __thread bool tls_resolving;

bool vpmm_resolving(void)
{
	return tls_resolving;
}

VPMM_EARLY bool vpmm_wrapped_name(const char *name)
{
	if (name[0] != 'c' || name[1] != 'u')
		return false;
	for (int i = 0; i < VPMM_W_COUNT; i++)
		if (!strcmp(name, wrapped_defs[i].sym))
			return true;
	return false;
}

static void *lib_sym(const char *name)
{
	return vpmm_real_dlsym_fn(vpmm_real.libcuda, name);
}

/* The real cuGetProcAddress's answer, or NULL. */
static void *proc(const char *base, int version, cuuint64_t flags)
{
	void *p = NULL;
	CUdriverProcAddressQueryResult st;
	CUresult r = CUDA_ERROR_NOT_FOUND;
	if (vpmm_real.gpa_v2)
		r = vpmm_real.gpa_v2(base, &p, version, flags, &st);
	else if (vpmm_real.gpa_v1)
		r = vpmm_real.gpa_v1(base, &p, version, flags);
	return r == CUDA_SUCCESS ? p : NULL;
}

static void add_known(int w, void *p)
{
	if (!p)
		return;
	for (int k = 0; k < KNOWN_MAX; k++) {
		if (known[w][k] == p)
			return;
		if (!known[w][k]) {
			known[w][k] = p;
			return;
		}
	}
}

/* One pointer in two entries' sets could only be mapped to one wrapper,
 * possibly the wrong variant: pass it through instead. */
static void drop_ambiguous(void)
{
	for (int a = 0; a < VPMM_W_COUNT; a++)
		for (int i = 0; i < KNOWN_MAX; i++)
			for (int b = a + 1; known[a][i] && b < VPMM_W_COUNT; b++)
				for (int j = 0; j < KNOWN_MAX; j++)
					if (known[b][j] == known[a][i]) {
						vpmm_log(VPMM_LOG_WARN,
							 "libcuda gives one function for %s and %s: neither is wrapped",
							 wrapped_defs[a].sym, wrapped_defs[b].sym);
						known[b][j] = NULL;
						known[a][i] = NULL;
						break;
					}
}

#define SET(field, p) ((field) = VPMM_PTR_TO_FN(__typeof__(field), (p)))

static void find_cuda(void)
{
	tls_resolving = true;
	vpmm_resolve_dlsym();
	vpmm_real.libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!vpmm_real.libcuda) {
		VPMM_LOGF(VPMM_LOG_INFO, "libcuda.so.1 not loadable (%s): passing everything through",
			  dlerror());
		goto out;
	}
	SET(vpmm_real.gpa_v2, lib_sym("cuGetProcAddress_v2"));
	SET(vpmm_real.gpa_v1, lib_sym("cuGetProcAddress"));
	{
		CUresult (*version)(int *) = NULL;
		SET(version, lib_sym("cuDriverGetVersion"));
		if (!version || version(&vpmm_real.driver_version) != CUDA_SUCCESS)
			vpmm_real.driver_version = 0;
	}

	/* Only at the variant's own version: a later version may answer with
	 * a newer variant (cuGetProcAddress_v2 for "cuGetProcAddress" from
	 * 12000 on), which must not be taken for this one. A program asking
	 * at its own, later version gets the same pointer while this variant
	 * is current, and an unknown one (passed through) once it is not. */
	for (int w = 0; w < VPMM_W_COUNT; w++) {
		const struct wrapped_def *d = &wrapped_defs[w];
		add_known(w, lib_sym(d->sym));
		add_known(w, proc(d->base, d->version, d->flags));
		/* The stream creators take no stream: a program asking with
		 * the per-thread flag (a runtime built for it) may get another
		 * pointer for the same function. */
		if (w >= VPMM_W_STREAM_CREATE && w <= VPMM_W_GREEN_STREAM_CREATE)
			add_known(w, proc(d->base, d->version,
					  CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM));
	}
	drop_ambiguous();

	/* Forwarding targets: the exported symbol, else what cuGetProcAddress
	 * gives at the variant's version. */
#define TARGET(field, w)                                                      \
	do {                                                                  \
		void *p_ = lib_sym(wrapped_defs[w].sym);                      \
		if (!p_)                                                      \
			p_ = proc(wrapped_defs[w].base, wrapped_defs[w].version, \
				  wrapped_defs[w].flags);                     \
		SET(field, p_);                                               \
	} while (0)
	TARGET(vpmm_real.mem_alloc, VPMM_W_MEM_ALLOC);
	TARGET(vpmm_real.mem_free, VPMM_W_MEM_FREE);
	TARGET(vpmm_real.alloc_async, VPMM_W_ALLOC_ASYNC);
	TARGET(vpmm_real.alloc_async_ptsz, VPMM_W_ALLOC_ASYNC_PTSZ);
	TARGET(vpmm_real.free_async, VPMM_W_FREE_ASYNC);
	TARGET(vpmm_real.free_async_ptsz, VPMM_W_FREE_ASYNC_PTSZ);
	TARGET(vpmm_real.mem_get_info, VPMM_W_MEM_GET_INFO);
	TARGET(vpmm_real.address_range, VPMM_W_ADDRESS_RANGE);
	TARGET(vpmm_real.ptr_attr, VPMM_W_PTR_ATTR);
	TARGET(vpmm_real.ptr_attrs, VPMM_W_PTR_ATTRS);
	TARGET(vpmm_real.stream_destroy, VPMM_W_STREAM_DESTROY);
	TARGET(vpmm_real.ipc_get, VPMM_W_IPC_GET);
	TARGET(vpmm_real.ipc_open, VPMM_W_IPC_OPEN);
	TARGET(vpmm_real.ipc_close, VPMM_W_IPC_CLOSE);
	TARGET(vpmm_real.peer_enable, VPMM_W_PEER_ENABLE);
	TARGET(vpmm_real.mem_create, VPMM_W_MEM_CREATE);
	TARGET(vpmm_real.ctx_destroy, VPMM_W_CTX_DESTROY);
	TARGET(vpmm_real.ctx_create, VPMM_W_CTX_CREATE);
	TARGET(vpmm_real.ctx_create_v3, VPMM_W_CTX_CREATE_V3);
	TARGET(vpmm_real.ctx_create_v4, VPMM_W_CTX_CREATE_V4);
	TARGET(vpmm_real.green_ctx_create, VPMM_W_GREEN_CTX_CREATE);
	TARGET(vpmm_real.primary_reset, VPMM_W_PRIMARY_RESET);
	TARGET(vpmm_real.stream_create, VPMM_W_STREAM_CREATE);
	TARGET(vpmm_real.stream_create_prio, VPMM_W_STREAM_CREATE_PRIO);
	TARGET(vpmm_real.green_stream_create, VPMM_W_GREEN_STREAM_CREATE);
	TARGET(vpmm_real.begin_capture, VPMM_W_BEGIN_CAPTURE);
	TARGET(vpmm_real.begin_capture_ptsz, VPMM_W_BEGIN_CAPTURE_PTSZ);
	TARGET(vpmm_real.begin_capture_v2, VPMM_W_BEGIN_CAPTURE_V2);
	TARGET(vpmm_real.begin_capture_v2_ptsz, VPMM_W_BEGIN_CAPTURE_V2_PTSZ);
	TARGET(vpmm_real.begin_to_graph, VPMM_W_BEGIN_TO_GRAPH);
	TARGET(vpmm_real.begin_to_graph_ptsz, VPMM_W_BEGIN_TO_GRAPH_PTSZ);
	TARGET(vpmm_real.end_capture, VPMM_W_END_CAPTURE);
	TARGET(vpmm_real.end_capture_ptsz, VPMM_W_END_CAPTURE_PTSZ);
	TARGET(vpmm_real.retain_handle, VPMM_W_RETAIN_HANDLE);
	TARGET(vpmm_real.device_set_mempool, VPMM_W_DEVICE_SET_MEMPOOL);
	TARGET(vpmm_real.mem_set_mempool, VPMM_W_MEM_SET_MEMPOOL);
	TARGET(vpmm_real.mempool_destroy, VPMM_W_MEMPOOL_DESTROY);
	TARGET(vpmm_real.mempool_get_attr, VPMM_W_MEMPOOL_GET_ATTR);
	TARGET(vpmm_real.mempool_set_attr, VPMM_W_MEMPOOL_SET_ATTR);
	TARGET(vpmm_real.mempool_trim, VPMM_W_MEMPOOL_TRIM);
#undef TARGET

	SET(vpmm_real.ctx_get_current, vpmm_real_entry("cuCtxGetCurrent", NULL));
	SET(vpmm_real.ctx_get_device, vpmm_real_entry("cuCtxGetDevice", NULL));
	SET(vpmm_real.ctx_synchronize, vpmm_real_entry("cuCtxSynchronize", NULL));
	SET(vpmm_real.ctx_synchronize_v2, vpmm_real_entry("cuCtxSynchronize_v2", NULL));
	SET(vpmm_real.ctx_push, vpmm_real_entry("cuCtxPushCurrent_v2", NULL));
	SET(vpmm_real.ctx_pop, vpmm_real_entry("cuCtxPopCurrent_v2", NULL));
	SET(vpmm_real.stream_is_capturing, vpmm_real_entry("cuStreamIsCapturing", NULL));
	SET(vpmm_real.stream_get_ctx, vpmm_real_entry("cuStreamGetCtx", NULL));
	SET(vpmm_real.stream_synchronize, vpmm_real_entry("cuStreamSynchronize", NULL));
	SET(vpmm_real.event_query, vpmm_real_entry("cuEventQuery", NULL));
	SET(vpmm_real.device_get, vpmm_real_entry("cuDeviceGet", NULL));
	SET(vpmm_real.primary_retain, vpmm_real_entry("cuDevicePrimaryCtxRetain", NULL));
	SET(vpmm_real.primary_get_state, vpmm_real_entry("cuDevicePrimaryCtxGetState", NULL));
	SET(vpmm_real.event_create, vpmm_real_entry("cuEventCreate", NULL));
	SET(vpmm_real.event_record, vpmm_real_entry("cuEventRecord", NULL));
	SET(vpmm_real.event_destroy, vpmm_real_entry("cuEventDestroy_v2", NULL));
	SET(vpmm_real.stream_wait_event, vpmm_real_entry("cuStreamWaitEvent", NULL));
	SET(vpmm_real.ctx_get_id, vpmm_real_entry("cuCtxGetId", NULL));
	/* The capture query in the newest form the driver has: asked at a
	 * later version than its own, the driver answers with an older form,
	 * of other arguments. */
	if (vpmm_real.driver_version >= 12030)
		SET(vpmm_real.capture_info_v3, proc("cuStreamGetCaptureInfo", 12030,
						    CU_GET_PROC_ADDRESS_LEGACY_STREAM));
	else if (vpmm_real.driver_version >= 11030)
		SET(vpmm_real.capture_info_v2, proc("cuStreamGetCaptureInfo", 11030,
						    CU_GET_PROC_ADDRESS_LEGACY_STREAM));
	else
		SET(vpmm_real.capture_info_v1, proc("cuStreamGetCaptureInfo", 10010,
						    CU_GET_PROC_ADDRESS_LEGACY_STREAM));
	SET(vpmm_real.exchange_capture_mode,
	    vpmm_real_entry("cuThreadExchangeStreamCaptureMode", NULL));
	SET(vpmm_real.device_default_mempool, vpmm_real_entry("cuDeviceGetDefaultMemPool", NULL));
out:
	tls_resolving = false;
}

void vpmm_resolve(void)
{
	pthread_once(&cuda_once, find_cuda);
}

void *vpmm_wrapper_for(void *real_fn)
{
	if (!real_fn)
		return NULL;
	for (int w = 0; w < VPMM_W_COUNT; w++) {
		void *mine = vpmm_fn_to_ptr(vpmm_wrappers[w]);
		if (real_fn == mine)
			return mine;
		for (int k = 0; k < KNOWN_MAX && known[w][k]; k++)
			if (known[w][k] == real_fn)
				return mine;
	}
	return NULL;
}

void *vpmm_real_entry(const char *name, void *arg)
{
	void *p;
	(void)arg;
	if (!vpmm_real.libcuda)
		return NULL;
	p = lib_sym(name);
	if (!p) {
		/* Entry points libcuda does not export by name: ask for the
		 * base name as this header knows it. */
		p = proc(name, vpmm_real.driver_version ? vpmm_real.driver_version
							: CUDA_VERSION, 0);
	}
	return p;
}

/* ---- the runtime ------------------------------------------------------------- */

static const char *const rt_names[VPMM_RT_COUNT] = {
	[VPMM_RT_MALLOC] = "cudaMalloc",
	[VPMM_RT_FREE] = "cudaFree",
	[VPMM_RT_MALLOC_ASYNC] = "cudaMallocAsync",
	[VPMM_RT_FREE_ASYNC] = "cudaFreeAsync",
	[VPMM_RT_MALLOC_ASYNC_PTSZ] = "cudaMallocAsync_ptsz",
	[VPMM_RT_FREE_ASYNC_PTSZ] = "cudaFreeAsync_ptsz",
	[VPMM_RT_MEM_GET_INFO] = "cudaMemGetInfo",
};

/* Whether p lies in this library (our own hook, found again). */
static bool ours(void *p)
{
	Dl_info a, b;
	return dladdr(p, &a) && dladdr((void *)(uintptr_t)&vpmm_real_runtime, &b) &&
	       a.dli_fbase == b.dli_fbase;
}

/* The real runtime functions, by the scope they were found in: the global
 * one, or the calling object's own (an RTLD_LOCAL libcudart, loaded with an
 * extension module). An object can be closed and another mapped where it
 * was, with another runtime: each cached pointer is checked, on every use,
 * to lie still in the object it was found in (its start and its name), and
 * each scope is keyed by the calling object the same way. The checks use
 * _dl_find_object, which takes no lock: the loader's locks would make a
 * call wait behind another thread's dlopen (and its constructors) and
 * could be held across a fork. A miss is not cached: a runtime loaded
 * later is found. The lock covers the table only. */
#define RT_SCOPES 8

struct obj_id {
	const void *start; /* NULL: the global scope */
	uint64_t name;     /* a hash of the object's file name */
};

static struct rt_scope {
	struct obj_id who;
	bool used;
	void *fn[VPMM_RT_COUNT];
	struct obj_id in[VPMM_RT_COUNT]; /* the object fn[] lies in */
} rt_scopes[RT_SCOPES];
static unsigned rt_next;
static pthread_mutex_t rt_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t rt_once = PTHREAD_ONCE_INIT;

/* A fork while another thread holds rt_lock would leave it held in the
 * child; the table itself stays valid (the child maps the same objects). */
static void rt_lock_reset(void)
{
	pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
	rt_lock = fresh;
}

static void rt_install_atfork(void)
{
	pthread_atfork(NULL, NULL, rt_lock_reset);
}

static uint64_t name_hash(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; s && *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

/* The loaded object holding addr. */
static bool obj_of(const void *addr, struct obj_id *id)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
	struct dl_find_object fo;
	if (_dl_find_object((void *)(uintptr_t)addr, &fo) != 0)
		return false;
	id->start = fo.dlfo_map_start;
	id->name = name_hash(fo.dlfo_link_map ? fo.dlfo_link_map->l_name : NULL);
	return true;
#else
	Dl_info info; /* older glibc: the same, under the loader's lock */
	if (!dladdr(addr, &info))
		return false;
	id->start = info.dli_fbase;
	id->name = name_hash(info.dli_fname);
	return true;
#endif
}

static bool same_obj(const struct obj_id *a, const struct obj_id *b)
{
	return a->start == b->start && a->name == b->name;
}

/* fn cached for the scope `who`, still where it was found; else NULL. */
static void *rt_cached(const struct obj_id *who, enum vpmm_rt fn)
{
	void *p = NULL;
	struct obj_id in = {0}, now;
	pthread_mutex_lock(&rt_lock);
	for (unsigned i = 0; i < RT_SCOPES; i++)
		if (rt_scopes[i].used && same_obj(&rt_scopes[i].who, who)) {
			p = rt_scopes[i].fn[fn];
			in = rt_scopes[i].in[fn];
			break;
		}
	pthread_mutex_unlock(&rt_lock);
	if (p && (!obj_of(p, &now) || !same_obj(&now, &in)))
		p = NULL; /* its object is gone: look again */
	return p;
}

static void rt_store(const struct obj_id *who, enum vpmm_rt fn, void *p)
{
	struct obj_id in;
	if (!obj_of(p, &in))
		return;
	pthread_mutex_lock(&rt_lock);
	struct rt_scope *e = NULL;
	for (unsigned i = 0; i < RT_SCOPES && !e; i++)
		if (rt_scopes[i].used && same_obj(&rt_scopes[i].who, who))
			e = &rt_scopes[i];
	if (!e) {
		e = &rt_scopes[rt_next++ % RT_SCOPES];
		*e = (struct rt_scope){.who = *who, .used = true};
	}
	e->fn[fn] = p;
	e->in[fn] = in;
	pthread_mutex_unlock(&rt_lock);
}

void *vpmm_real_runtime(enum vpmm_rt fn, void *caller)
{
	static const struct obj_id global = {NULL, 0};
	struct obj_id who;
	pthread_once(&rt_once, rt_install_atfork);
	bool local = caller && obj_of(caller, &who);
	void *p = rt_cached(&global, fn);
	if (!p && local)
		p = rt_cached(&who, fn);
	if (p)
		return p;
	vpmm_resolve_dlsym();
	p = vpmm_real_dlsym_fn(RTLD_NEXT, rt_names[fn]);
	if (p && !ours(p)) {
		rt_store(&global, fn, p);
		return p;
	}
	/* A link map is a dlsym handle in glibc: the lookup then runs over the
	 * caller's own scope, its RTLD_LOCAL dependencies included. */
	Dl_info info;
	struct link_map *lm = NULL;
	p = NULL;
	if (local && dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) && lm)
		p = vpmm_real_dlsym_fn(lm, rt_names[fn]);
	if (p && ours(p))
		p = NULL;
	if (p)
		rt_store(&who, fn, p);
	return p;
}
