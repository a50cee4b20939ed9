/* driver_host_control.c — what a test does to the host driver from outside
 * (driver_host.h's vpmm_host_*): make streams and run their queues, fail or
 * hold operations, set the hook and the tenant, look at what is mapped and
 * what is alive.
 *
 * Owns no state of its own: it works on the driver's, under its lock. Calls
 * driver_host.c (which driver is a host one), driver_host_stream.c,
 * driver_host_mem.c and driver_host_base.c.
 */
#include "driver_host_int.h"

#include <stdlib.h>

CUstream vpmm_host_stream_create(vpmm_driver *d)
{
	struct host_driver *h = vpi_host_checked(d);
	if (!h)
		return NULL;
	struct host_stream *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	pthread_mutex_lock(&h->lock);
	if (!vpi_host_ptr_insert(&h->streams, &h->nstreams, &h->capstreams, s)) {
		free(s);
		s = NULL;
	}
	pthread_mutex_unlock(&h->lock);
	return (CUstream)s;
}

unsigned vpmm_host_stream_complete(vpmm_driver *d, CUstream st)
{
	struct host_driver *h = vpi_host_checked(d);
	if (!h)
		return 0;
	unsigned n = 0;
	size_t moved = 0;
	struct host_stream *s;
	pthread_mutex_lock(&h->lock);
	if (vpi_host_stream_find(h, st, &s) == CUDA_SUCCESS)
		n = vpi_host_stream_run(s, &moved);
	pthread_mutex_unlock(&h->lock);
	return n;
}

void vpmm_host_stream_destroy(vpmm_driver *d, CUstream st)
{
	struct host_driver *h = vpi_host_checked(d);
	size_t pos;
	if (!h || (uintptr_t)st < HOST_SPECIAL_STREAMS)
		return;
	pthread_mutex_lock(&h->lock);
	if (vpi_host_ptr_find(h->streams, h->nstreams, st, &pos)) {
		struct host_stream *s = (struct host_stream *)st;
		vpi_host_ptr_remove(h->streams, &h->nstreams, pos);
		s->next_draining = h->draining;
		h->draining = s;
		vpi_host_stream_drained(h);
	}
	pthread_mutex_unlock(&h->lock);
}

unsigned vpmm_host_complete_all(vpmm_driver *d)
{
	struct host_driver *h = vpi_host_checked(d);
	if (!h)
		return 0;
	unsigned n = 0;
	size_t moved;
	pthread_mutex_lock(&h->lock);
	do {
		moved = 0;
		for (size_t i = 0; i < HOST_SPECIAL_STREAMS; i++)
			if (h->special[i])
				n += vpi_host_stream_run(h->special[i], &moved);
		for (size_t i = 0; i < h->nstreams; i++)
			n += vpi_host_stream_run(h->streams[i], &moved);
		for (struct host_stream *s = h->draining; s; s = s->next_draining)
			n += vpi_host_stream_run(s, &moved);
	} while (moved);
	vpi_host_stream_drained(h);
	pthread_mutex_unlock(&h->lock);
	return n;
}

unsigned vpmm_host_complete_nth(vpmm_driver *d, size_t n)
{
	struct host_driver *h = vpi_host_checked(d);
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
			done = vpi_host_stream_run(s, &moved);
	}
	pthread_mutex_unlock(&h->lock);
	return done;
}

bool vpmm_host_stream_waits_on(vpmm_driver *d, CUstream st, CUevent ev)
{
	struct host_driver *h = vpi_host_checked(d);
	if (!h)
		return false;
	bool found = false;
	struct host_stream *s;
	pthread_mutex_lock(&h->lock);
	if (vpi_host_stream_find(h, st, &s) == CUDA_SUCCESS)
		for (size_t i = s->head; i < s->len && !found; i++)
			found = s->q[i].kind == ENTRY_WAIT &&
				s->q[i].event == (const void *)ev;
	pthread_mutex_unlock(&h->lock);
	return found;
}

unsigned long vpmm_host_stream_wait_count(vpmm_driver *d, CUstream st)
{
	struct host_driver *h = vpi_host_checked(d);
	if (!h)
		return 0;
	unsigned long n = 0;
	struct host_stream *s;
	pthread_mutex_lock(&h->lock);
	if (vpi_host_stream_find(h, st, &s) == CUDA_SUCCESS)
		n = s->waits;
	pthread_mutex_unlock(&h->lock);
	return n;
}

void vpmm_host_set_capturing(vpmm_driver *d, CUstream st, bool capturing)
{
	struct host_driver *h = vpi_host_checked(d);
	if (!h)
		return;
	struct host_stream *s;
	pthread_mutex_lock(&h->lock);
	if (vpi_host_stream_find(h, st, &s) == CUDA_SUCCESS)
		s->capturing = capturing;
	pthread_mutex_unlock(&h->lock);
}

void vpmm_host_gate(vpmm_driver *d, enum vpmm_op op, bool closed)
{
	struct host_driver *h = vpi_host_checked(d);
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
	struct host_driver *h = vpi_host_checked(d);
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
	struct host_driver *h = vpi_host_checked(d);
	if (!h || (unsigned)op >= VPMM_OP_COUNT)
		return 0;
	pthread_mutex_lock(&h->lock);
	unsigned long n = h->calls[op];
	pthread_mutex_unlock(&h->lock);
	return n;
}

void vpmm_host_set_hook(vpmm_driver *d, vpmm_host_hook fn, void *arg)
{
	struct host_driver *h = vpi_host_checked(d);
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
	struct host_driver *h = vpi_host_checked(d);
	if (!h || device < 0 || device >= 64)
		return false;
	uintptr_t va = (uintptr_t)dva;
	pthread_mutex_lock(&h->lock);
	size_t i = vpi_host_map_upper(h, va);
	bool ok = i > 0 && h->maps[i - 1].va + h->maps[i - 1].size > va &&
		  (h->maps[i - 1].access >> device & 1);
	pthread_mutex_unlock(&h->lock);
	return ok;
}

void vpmm_host_ctx_reset(vpmm_driver *d, bool remade)
{
	struct host_driver *h = vpi_host_checked(d);
	if (!h)
		return;
	pthread_mutex_lock(&h->lock);
	vpi_host_stream_reset(h);
	h->ctx_id++;
	h->ctx_destroyed = !remade;
	pthread_mutex_unlock(&h->lock);
}

void vpmm_host_ctx_remake(vpmm_driver *d)
{
	struct host_driver *h = vpi_host_checked(d);
	if (!h)
		return;
	pthread_mutex_lock(&h->lock);
	h->ctx_destroyed = false;
	pthread_mutex_unlock(&h->lock);
}

unsigned long vpmm_host_dead_calls(vpmm_driver *d)
{
	struct host_driver *h = vpi_host_checked(d);
	if (!h)
		return 0;
	pthread_mutex_lock(&h->lock);
	unsigned long n = h->dead_calls;
	pthread_mutex_unlock(&h->lock);
	return n;
}

void vpmm_host_live(vpmm_driver *d, struct vpmm_host_live *out)
{
	struct host_driver *h = vpi_host_checked(d);
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
