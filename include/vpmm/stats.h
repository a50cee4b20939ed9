/* vpmm/stats.h — struct vpmm_stats: the counters of one device's pool, as
 * vpmm_shim_stats() (vpmm/vpmm.h) and the pool itself (allocator/vpmm.h)
 * report them. Declared once here, with each field's meaning; the JSON of
 * vpmm_shim_stats_json() and vpmm-dump's output use the same names.
 *
 * Includes only <stdint.h>; valid C and C++.
 *
 * Layout: while the major version is 0, fields may be added anywhere in
 * any minor version (the struct is the pool's own record), so a program
 * that may meet a library other than the one it was built with reads
 * vpmm_shim_stats_json() instead, whose names stay.
 */
#ifndef VPMM_STATS_H
#define VPMM_STATS_H

#include <stdint.h>

/* Declared once: name, meaning. Byte gauges have a peak. */
#define VPMM_GAUGES(X)                                                        \
	X(live, "bytes handed out")                                           \
	X(mapped, "physical bytes held (live + reusable)")                    \
	X(reusable, "free bytes mapped, ready to reuse")                      \
	X(holes, "reserved VA with nothing mapped")                           \
	X(zombies, "old VA of remapped pages awaiting unmap")                 \
	X(reserved, "reserved virtual address space")
#define VPMM_COUNTERS(X)                                                      \
	X(mallocs, "successful allocations")                                  \
	X(frees, "frees")                                                     \
	X(failures, "failed allocations")                                     \
	X(defrags, "allocations that remapped or grew")                       \
	X(loop_growths, "of them, a repeating loop's, grown instead of remapped") \
	X(room_growths, "of them, grown without remapping: the device had room") \
	X(growth_refusals, "growths refused for want of device memory")       \
	X(loop_hints, "mallocs placed where the same malloc went a step before") \
	X(pages_created, "pages of physical memory created")                  \
	X(pages_remapped, "pages moved to a new address")                     \
	X(handles_remapped, "physical handles moved to a new address")        \
	X(pages_released, "pages unmapped and given back to the driver")      \
	X(handles_created, "physical handles created")                        \
	X(zombies_reclaimed, "old ranges unmapped")                           \
	X(reclaims_deferred, "unmaps left for later: a caller was mapping")   \
	X(events_recorded, "events recorded")                                 \
	X(stream_waits, "device-side waits inserted")                         \
	X(front_hits, "mallocs served from a stream's cache, lock-free")      \
	X(front_parks, "frees parked in a stream's cache")                    \
	X(driver_calls, "driver calls of any kind")

struct vpmm_stats {
#define X(n, d) uint64_t n; uint64_t n##_peak;
	VPMM_GAUGES(X)
#undef X
#define X(n, d) uint64_t n;
	VPMM_COUNTERS(X)
#undef X
	uint64_t page_size;
	uint64_t regions;
	/* Stream records the pool holds (destroyed streams' included until
	 * nothing refers to them), and the driver events it holds. */
	uint64_t streams;
	uint64_t events;
	uint64_t parked; /* bytes in streams' caches: counted in reusable */
	/* What the device and the limit left the pool at the last growth
	 * (VPMM_REMAP=pressure; 0 before the first, and while the device's
	 * free memory cannot be read). */
	uint64_t headroom;
};

#endif
