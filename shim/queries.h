/* queries.h — what the driver's queries about an address answer for pool
 * memory (queries.c): hooks.c forwards each exported hook to the function
 * of its name with vpmm_ in front, same arguments. Includes shim.h only.
 */
#ifndef VPMM_QUERIES_H
#define VPMM_QUERIES_H

#include "shim.h"

CUresult vpmm_cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize,
				      CUdeviceptr dptr);
CUresult vpmm_cuPointerGetAttribute(void *data, CUpointer_attribute attribute,
				    CUdeviceptr ptr);
CUresult vpmm_cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attributes,
				     void **data, CUdeviceptr ptr);
CUresult vpmm_cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle,
					  void *addr);

#endif
