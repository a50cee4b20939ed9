/* wrap.c — the answers that hand out our wrappers: cuGetProcAddress's (the
 * runtime and most frameworks reach every driver entry point through it)
 * and dlsym's (programs that look entry points up one by one). The exported
 * cuGetProcAddress hooks (hooks.c) and the dlsym entry (dlsym.c) forward
 * here.
 *
 * Owns: when an answer is swapped (the shim active, the pointer one of
 * libcuda's wrapped entry points, compared by pointer: resolve.c) and the
 * counts of swapped answers. May call: resolve.h, process.h, the log.
 */
#include <string.h>

#include "process.h"
#include "resolve.h"
#include "shim.h"
#include "wrap.h"

/* ---- cuGetProcAddress's answers ----------------------------------------------------------------- */

/* The runtime asks for "cuGetProcAddress" through cuGetProcAddress itself
 * and then resolves every entry point through the answer: handing back our
 * own here is what makes all later lookups pass through us. */
static void wrap_answer(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	void *w;
	if (!pfn || !*pfn || !vpmm_active())
		return;
	w = vpmm_wrapper_for(*pfn);
	if (w && w != *pfn) {
		*pfn = w;
		vpmm_count(VPMM_HOOK_proc_wrapped);
	} else if (!w && vpmm_log_on(VPMM_LOG_DEBUG) && symbol &&
		   (!strncmp(symbol, "cuMem", 5) || !strncmp(symbol, "cuPointer", 9))) {
		/* an old variant, or one newer than ours: passed through */
		vpmm_log(VPMM_LOG_DEBUG, "cuGetProcAddress(%s, %d, %llu): not wrapped",
			 symbol, version, (unsigned long long)flags);
	}
}

CUresult vpmm_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
			     cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuGetProcAddress_v2);
	VPMM_REAL_CALL(r, gpa_v2, symbol, pfn, cudaVersion, flags, symbolStatus);
	if (r == CUDA_SUCCESS)
		wrap_answer(symbol, pfn, cudaVersion, flags);
	return r;
}

CUresult vpmm_cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
			  cuuint64_t flags)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuGetProcAddress);
	VPMM_REAL_CALL(r, gpa_v1, symbol, pfn, cudaVersion, flags);
	if (r == CUDA_SUCCESS)
		wrap_answer(symbol, pfn, cudaVersion, flags);
	return r;
}

/* ---- dlsym's answers -------------------------------------------------------------------- */

/* Our wrapper for this lookup, or NULL: "ask the real dlsym as is". Also
 * makes sure vpmm_real_dlsym_fn is set, which the entry relies on. Safe
 * before a sanitizer's runtime is ready (VPMM_EARLY): the names it looks
 * up then are not ours, and only ours go further. */
VPMM_EARLY void *vpmm_dlsym_filter(void *handle, const char *name)
{
	void *w;
	vpmm_resolve_dlsym();
	if (!name || !vpmm_wrapped_name(name) || vpmm_resolving())
		return NULL;
	if (!vpmm_active())
		return NULL;
	w = vpmm_wrapper_for(vpmm_real_dlsym_fn(handle, name));
	if (w)
		vpmm_count(VPMM_HOOK_dlsym_wrapped);
	return w;
}
