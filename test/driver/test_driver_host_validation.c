/* test_driver_host_validation.c — the host driver rejects misuse of map,
 * unmap and va_free as the real driver does, and a random sequence of
 * map/unmap/set_access agrees with a model of pages. */
#include "host_test.h"

/* ---- validation of map, unmap, va_free ---------------------------------------------- */

static void map_validation(bool unbacked)
{
	vpmm_driver *d = mk(G, 0, unbacked);
	CUdeviceptr r = reserve(d, 8 * G);
	CUdeviceptr other = reserve(d, 8 * G);
	CUmemGenericAllocationHandle a = create(d, 2 * G), b = create(d, 2 * G);
	CUmemGenericAllocationHandle c = create(d, G);
	OK(d->map(d, r + 2 * G, 2 * G, a));

	FAILS(d->map(d, r + 2 * G, 2 * G, b), CUDA_ERROR_INVALID_VALUE); /* same */
	FAILS(d->map(d, r + G, 2 * G, b), CUDA_ERROR_INVALID_VALUE);     /* tail */
	FAILS(d->map(d, r + 3 * G, 2 * G, b), CUDA_ERROR_INVALID_VALUE); /* head */
	FAILS(d->map(d, r + 3 * G, G, c), CUDA_ERROR_INVALID_VALUE);     /* inside */
	FAILS(d->map(d, r + 7 * G, 2 * G, b), CUDA_ERROR_INVALID_VALUE); /* past end */
	FAILS(d->map(d, r - 2 * G, 2 * G, b), CUDA_ERROR_INVALID_VALUE); /* before */
	FAILS(d->map(d, r + 4 * G, G, b), CUDA_ERROR_INVALID_VALUE);     /* size */
	FAILS(d->map(d, r + 4 * G, 3 * G, b), CUDA_ERROR_INVALID_VALUE); /* size */
	FAILS(d->map(d, r + 4 * G + 4096, 2 * G, b), CUDA_ERROR_INVALID_VALUE);
	FAILS(d->map(d, 0, 2 * G, b), CUDA_ERROR_INVALID_VALUE);
	FAILS(d->map(d, r + 4 * G, 2 * G, b + c + 99), CUDA_ERROR_INVALID_VALUE);
	cr_assert_eq(live(d).mappings, 1);

	/* Right up against the existing mapping, on both sides, and the same
	 * handle twice. */
	OK(d->map(d, r + 4 * G, 2 * G, b));
	OK(d->map(d, r + G, G, c));
	OK(d->map(d, other, 2 * G, a));
	cr_assert_eq(live(d).mappings, 4);
	d->destroy(d);
}

Test(driver, map_validation_backed) { map_validation(false); }
Test(driver, map_validation_unbacked) { map_validation(true); }

static void unmap_validation(bool unbacked)
{
	vpmm_driver *d = mk(G, 0, unbacked);
	CUdeviceptr r = reserve(d, 16 * G);
	CUmemGenericAllocationHandle a = create(d, 2 * G), b = create(d, 2 * G);
	CUmemGenericAllocationHandle c = create(d, 2 * G);

	FAILS(d->unmap(d, r, 2 * G), CUDA_ERROR_INVALID_VALUE); /* never mapped */
	OK(d->map(d, r, 2 * G, a));
	OK(d->map(d, r + 2 * G, 2 * G, b));
	OK(d->map(d, r + 6 * G, 2 * G, c)); /* a gap of 2 G before it */

	FAILS(d->unmap(d, r, G), CUDA_ERROR_INVALID_VALUE);          /* part */
	FAILS(d->unmap(d, r + G, 2 * G), CUDA_ERROR_INVALID_VALUE);  /* straddles */
	FAILS(d->unmap(d, r, 3 * G), CUDA_ERROR_INVALID_VALUE);      /* 1.5 maps */
	FAILS(d->unmap(d, r, 8 * G), CUDA_ERROR_INVALID_VALUE);      /* a gap */
	FAILS(d->unmap(d, r + 4 * G, 2 * G), CUDA_ERROR_INVALID_VALUE); /* the gap */
	FAILS(d->unmap(d, r + 6 * G, 4 * G), CUDA_ERROR_INVALID_VALUE); /* past */
	FAILS(d->unmap(d, r, 0), CUDA_ERROR_INVALID_VALUE);
	cr_assert_eq(live(d).mappings, 3);

	/* Two whole mappings in one call. */
	OK(d->unmap(d, r, 4 * G));
	cr_assert_eq(live(d).mappings, 1);
	FAILS(d->unmap(d, r, 2 * G), CUDA_ERROR_INVALID_VALUE); /* again */
	OK(d->unmap(d, r + 6 * G, 2 * G));
	cr_assert_eq(live(d).mappings, 0);
	d->destroy(d);
}

Test(driver, unmap_validation_backed) { unmap_validation(false); }
Test(driver, unmap_validation_unbacked) { unmap_validation(true); }

Test(driver, va_free_validation)
{
	vpmm_driver *d = mk(G, 0, false);
	CUdeviceptr r = reserve(d, 4 * G);
	CUmemGenericAllocationHandle h = create(d, G);
	FAILS(d->va_free(d, r + G, 3 * G), CUDA_ERROR_INVALID_VALUE);
	FAILS(d->va_free(d, r, 2 * G), CUDA_ERROR_INVALID_VALUE);
	FAILS(d->va_free(d, 4096 * G, G), CUDA_ERROR_INVALID_VALUE);

	OK(d->map(d, r + 3 * G, G, h));
	FAILS(d->va_free(d, r, 4 * G), CUDA_ERROR_INVALID_VALUE);
	OK(d->unmap(d, r + 3 * G, G));
	OK(d->map(d, r, G, h));
	FAILS(d->va_free(d, r, 4 * G), CUDA_ERROR_INVALID_VALUE);
	OK(d->unmap(d, r, G));
	OK(d->va_free(d, r, 4 * G));
	FAILS(d->va_free(d, r, 4 * G), CUDA_ERROR_INVALID_VALUE);
	FAILS(d->map(d, r, G, h), CUDA_ERROR_INVALID_VALUE);
	cr_assert_eq(live(d).reservations, 0);
	d->destroy(d);
}

/* A random sequence of map/unmap/set_access checked against a model of pages. */
static void random_against_model(bool unbacked, unsigned steps)
{
	enum { PAGES = 64, HANDLES = 24 };
	vpmm_driver *d = mk(G, 0, unbacked);
	CUdeviceptr r = reserve(d, PAGES * G);
	CUmemGenericAllocationHandle h[HANDLES];
	size_t hsize[HANDLES];
	int owner[PAGES];     /* handle index mapped on the page, -1 none */
	bool start[PAGES];    /* a mapping starts at this page */
	for (int i = 0; i < HANDLES; i++) {
		hsize[i] = (size_t)(i % 3 + 1);
		h[i] = create(d, hsize[i] * G);
	}
	for (int p = 0; p < PAGES; p++) {
		owner[p] = -1;
		start[p] = false;
	}
	unsigned seed = 12345;
	size_t nmaps = 0;
	for (unsigned s = 0; s < steps; s++) {
		int op = rand_r(&seed) % 3;
		int p = rand_r(&seed) % PAGES;
		if (op == 0) {
			int k = rand_r(&seed) % HANDLES;
			size_t n = hsize[k];
			bool ok = p + (int)n <= PAGES;
			for (size_t i = 0; ok && i < n; i++)
				ok = owner[p + (int)i] < 0;
			CUresult res = d->map(d, r + (size_t)p * G, n * G, h[k]);
			cr_assert_eq(res == CUDA_SUCCESS, ok, "step %u: map page %d", s, p);
			if (ok) {
				for (size_t i = 0; i < n; i++)
					owner[p + (int)i] = k;
				start[p] = true;
				nmaps++;
			}
		} else {
			/* A range of 1..4 pages from p. */
			int n = rand_r(&seed) % 4 + 1;
			bool whole = p + n <= PAGES && start[p] &&
				     (p + n == PAGES || owner[p + n] < 0 || start[p + n]);
			bool mapped = p + n <= PAGES;
			for (int i = 0; mapped && i < n; i++)
				mapped = owner[p + i] >= 0;
			if (op == 1) {
				CUresult res = d->unmap(d, r + (size_t)p * G, (size_t)n * G);
				cr_assert_eq(res == CUDA_SUCCESS, whole && mapped,
					     "step %u: unmap %d+%d", s, p, n);
				if (whole && mapped)
					for (int i = 0; i < n; i++) {
						nmaps -= start[p + i];
						owner[p + i] = -1;
						start[p + i] = false;
					}
			} else {
				CUresult res = d->set_access(d, r + (size_t)p * G,
							     (size_t)n * G, dev0, 1);
				cr_assert_eq(res == CUDA_SUCCESS, mapped,
					     "step %u: set_access %d+%d", s, p, n);
				if (mapped && !unbacked) {
					/* Each page shows its handle's bytes. */
					volatile char *c = (volatile char *)(uintptr_t)(r + (size_t)p * G);
					*c = (char)s;
					cr_assert_eq(*c, (char)s);
				}
			}
		}
		cr_assert_eq(live(d).mappings, nmaps, "step %u", s);
	}
	d->destroy(d);
}

Test(driver, random_against_model_unbacked) { random_against_model(true, 20000); }
Test(driver, random_against_model_backed) { random_against_model(false, 4000); }
