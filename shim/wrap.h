/* wrap.h — cuGetProcAddress's and dlsym's answers swapped for our wrappers
 * (wrap.c). Includes shim.h only.
 */
#ifndef VPMM_WRAP_H
#define VPMM_WRAP_H

#include "shim.h"

/* The exported cuGetProcAddress_v2 and cuGetProcAddress forward here. */
CUresult vpmm_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
				  cuuint64_t flags,
				  CUdriverProcAddressQueryResult *symbolStatus);
CUresult vpmm_cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
			       cuuint64_t flags);

/* Our wrapper for dlsym(handle, name), or NULL: "ask the real dlsym as is".
 * Also makes sure vpmm_real_dlsym_fn is set, which the exported dlsym
 * (dlsym.c) relies on. Safe before a sanitizer's runtime is ready. */
void *vpmm_dlsym_filter(void *handle, const char *name) VPMM_HIDDEN __attribute__((used));

#endif
