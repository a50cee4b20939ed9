/* torch_oom_caller.h — libtorch_oom_caller.so (torch_oom_caller.cpp), for
 * torch_oom_prog.cpp. */
#ifndef TORCH_OOM_CALLER_H
#define TORCH_OOM_CALLER_H

#ifdef __cplusplus
extern "C" {
#endif

typedef void *(*oom_malloc_fn)(long, int, void *);
/* Calls m(size, device, stream) into *out; the message of the
 * std::runtime_error it threw, or NULL when it returned. */
const char *oom_attempt(oom_malloc_fn m, long size, int device, void *stream, void **out);

#ifdef __cplusplus
}
#endif

#endif
