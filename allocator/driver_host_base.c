/* driver_host_base.c — under every other file of the host driver
 * (driver_host_int.h): growable sorted arrays, and the entry of every
 * operation (the hook, the call count, the gates and the faults).
 *
 * Owns no state of its own. Calls nothing of allocator/.
 */
#include "driver_host_int.h"

#include <stdlib.h>
#include <string.h>

/* `p` (an array of `*cap` elements of `elem` bytes) with room for `need`;
 * NULL (and `p` untouched) when memory is short. */
void *vpi_host_grow(void *p, size_t *cap, size_t need, size_t elem)
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

bool vpi_host_ptr_find(void *const *arr, size_t n, const void *p, size_t *pos)
{
	size_t i = ptr_lower(arr, n, p);
	if (pos)
		*pos = i;
	return i < n && arr[i] == p;
}

bool vpi_host_ptr_insert(void ***arr, size_t *n, size_t *cap, void *p)
{
	void **grown = vpi_host_grow(*arr, cap, *n + 1, sizeof **arr);
	if (!grown)
		return false;
	*arr = grown;
	size_t i = ptr_lower(*arr, *n, p);
	memmove(*arr + i + 1, *arr + i, (*n - i) * sizeof **arr);
	(*arr)[i] = p;
	(*n)++;
	return true;
}

void vpi_host_ptr_remove(void **arr, size_t *n, size_t i)
{
	memmove(arr + i, arr + i + 1, (*n - i - 1) * sizeof *arr);
	(*n)--;
}

/* Counts the call, waits (lock dropped) while a test holds the op's gate
 * closed, and fires an armed fault. Called with the lock held. Counting first
 * lets a test see that a call has reached the gate. */
bool vpi_host_injected(struct host_driver *h, enum vpmm_op op, CUresult *r)
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

void vpi_host_hook_call(struct host_driver *h, enum vpmm_op op)
{
	vpmm_host_hook fn = __atomic_load_n(&h->hook, __ATOMIC_ACQUIRE);
	if (fn)
		fn(h->hook_arg, op);
}
