/* native_threads.c — for the python suite (check_package.py): threads that
 * Python never saw, allocating and freeing through the pluggable
 * allocator's pair while the allocation history records, as PyTorch's C++
 * threads do. Calls only pthread and the two functions it is given. */
#include <pthread.h>
#include <stddef.h>
#include <sys/types.h>

typedef void *(*malloc_fn)(ssize_t size, int device, void *stream);
typedef void (*free_fn)(void *ptr, ssize_t size, int device, void *stream);

struct job {
	malloc_fn m;
	free_fn f;
	int rounds;
	void *kept;
};

static void *run(void *arg)
{
	struct job *j = arg;
	for (int i = 0; i < j->rounds; i++)
		j->f(j->m(5000, 0, NULL), 5000, 0, NULL);
	j->kept = j->m(4 << 20, 0, NULL);
	return NULL;
}

/* `nthreads` threads (at most 16), each making `rounds` pairs of 5000
 * bytes, then one allocation of 4 MiB that it keeps: into kept[i].
 * 0, or -1 when a thread could not start. */
__attribute__((visibility("default"))) int native_threads(malloc_fn m, free_fn f, int nthreads,
							 int rounds, void **kept);
int native_threads(malloc_fn m, free_fn f, int nthreads, int rounds, void **kept)
{
	struct job jobs[16];
	pthread_t t[16];
	int started = 0, rc = 0;
	if (nthreads > 16)
		return -1;
	for (; started < nthreads; started++) {
		jobs[started] = (struct job){m, f, rounds, NULL};
		if (pthread_create(&t[started], NULL, run, &jobs[started])) {
			rc = -1;
			break;
		}
	}
	for (int i = 0; i < started; i++) {
		pthread_join(t[i], NULL);
		kept[i] = jobs[i].kept;
	}
	return rc;
}
