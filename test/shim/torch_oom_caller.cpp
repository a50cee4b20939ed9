// torch_oom_caller.cpp — libtorch_oom_caller.so: calls vpmm_torch_malloc
// from C++ frames that catch, as PyTorch's pluggable allocator does. Its
// name begins with "libtorch" on purpose: libvpmm.so throws its failures
// only to code in libtorch*/libc10* (shim/torch.c says why).
#include <stdexcept>
#include <string>

#include "torch_oom_caller.h"

static std::string last;

extern "C" const char *oom_attempt(oom_malloc_fn m, long size, int device, void *stream,
				   void **out)
{
	*out = nullptr;
	last.clear();
	try {
		*out = m(size, device, stream);
	} catch (const std::runtime_error &e) {
		last = e.what();
		return last.c_str();
	}
	return nullptr;
}
