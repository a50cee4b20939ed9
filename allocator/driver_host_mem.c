/* driver_host_mem.c — the host driver's memory: VA reservations (PROT_NONE
 * mappings, or bare numbers when unbacked), physical handles (memfds),
 * mappings (MAP_FIXED|MAP_SHARED of the memfd, inaccessible until
 * set_access), the capacity they count against, and handles exported and
 * imported as file descriptors.
 *
 * Owns: struct host_handle, host_range, host_map (driver_host_int.h) and
 * their lifetimes. Calls driver_host_base.c only. Misuse of the VMM calls is
 * answered with CUDA_ERROR_INVALID_VALUE (what libcuda documents for every
 * bad range, size or handle), as the real driver rejects it.
 */
#include "driver_host_int.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Index of the first mapping whose va is > va. */
size_t vpi_host_map_upper(const struct host_driver *h, uintptr_t va)
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
	struct host_handle **handles = vpi_host_grow(h->handles, &h->caphandles,
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
		vpi_host_ptr_remove((void **)h->handles, &h->nhandles, pos);
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

/* ---- operations ---------------------------------------------------------------- */

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
	if (!out || size == 0 || !host_aligned(size, h->gran)) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	struct host_range *res = vpi_host_grow(h->res, &h->capres, h->nres + 1,
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
	size_t m = vpi_host_map_upper(h, va);
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
	if (!out || size == 0 || !host_aligned(size, h->gran)) {
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
	    !host_aligned(va, h->gran) || va + size < va) {
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
	size_t i = vpi_host_map_upper(h, va);
	if ((i > 0 && h->maps[i - 1].va + h->maps[i - 1].size > va) ||
	    (i < h->nmaps && h->maps[i].va < va + size)) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	struct host_map *maps = vpi_host_grow(h->maps, &h->capmaps, h->nmaps + 1,
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
	size_t i = vpi_host_map_upper(h, va);
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
	    !host_aligned(va, h->gran) || !host_aligned(size, h->gran)) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	/* Every byte mapped: the mapping holding va, then mappings back to
	 * back up to end. */
	size_t i = vpi_host_map_upper(h, va);
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
	for (size_t k = vpi_host_map_upper(h, va) - 1; k < h->nmaps && h->maps[k].va < end; k++)
		h->maps[k].access |= mask;
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
	    !host_aligned((uintptr_t)st.st_size, h->gran)) {
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


void vpi_host_mem_ops(vpmm_driver *base)
{
	base->granularity = host_granularity;
	base->va_reserve = host_va_reserve;
	base->va_free = host_va_free;
	base->mem_create = host_mem_create;
	base->mem_release = host_mem_release;
	base->map = host_map;
	base->unmap = host_unmap;
	base->set_access = host_set_access;
	base->mem_info = host_mem_info;
	base->export_fd = host_export_fd;
	base->import_fd = host_import_fd;
}

void vpi_host_mem_fini(struct host_driver *h)
{
	if (!h->unbacked)
		for (size_t i = 0; i < h->nres; i++)
			munmap((void *)h->res[i].va, h->res[i].size);
	for (size_t i = 0; i < h->nhandles; i++)
		handle_free(h->handles[i]);
	free(h->handles);
	free(h->res);
	free(h->maps);
}
