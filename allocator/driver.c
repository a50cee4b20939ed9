/* driver.c — what both driver implementations share: the names of the
 * operations (for stats, logs and fault injection). Calls nothing. */
#include "driver.h"

const char *vpmm_op_name(enum vpmm_op op)
{
	/* A switch, not a table, so that -Wswitch flags a new op left unnamed. */
	switch (op) {
	case VPMM_OP_GRANULARITY: return "granularity";
	case VPMM_OP_VA_RESERVE: return "va_reserve";
	case VPMM_OP_VA_FREE: return "va_free";
	case VPMM_OP_MEM_CREATE: return "mem_create";
	case VPMM_OP_MEM_RELEASE: return "mem_release";
	case VPMM_OP_MAP: return "map";
	case VPMM_OP_UNMAP: return "unmap";
	case VPMM_OP_SET_ACCESS: return "set_access";
	case VPMM_OP_EVENT_CREATE: return "event_create";
	case VPMM_OP_EVENT_RECORD: return "event_record";
	case VPMM_OP_EVENT_QUERY: return "event_query";
	case VPMM_OP_EVENT_SYNC: return "event_sync";
	case VPMM_OP_EVENT_DESTROY: return "event_destroy";
	case VPMM_OP_STREAM_WAIT: return "stream_wait";
	case VPMM_OP_STREAM_CAPTURING: return "stream_capturing";
	case VPMM_OP_MEM_INFO: return "mem_info";
	case VPMM_OP_EXPORT_FD: return "export_fd";
	case VPMM_OP_IMPORT_FD: return "import_fd";
	case VPMM_OP_CTX_CURRENT: return "ctx_current";
	case VPMM_OP_CTX_BIND: return "ctx_bind";
	case VPMM_OP_CTX_ID: return "ctx_id";
	case VPMM_OP_COUNT: break;
	}
	return "unknown";
}
