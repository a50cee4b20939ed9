/* options.h — the process-level VPMM_* options (those that are not part of
 * struct vpmm_config) and the options table's documentation.
 *
 * The pool's own options (VPMM_PAGES, VPMM_PAGE_SIZE, ...) are parsed by
 * vpmm_config_from_env() in vpmm.h; both read the same table in options.c.
 *
 * Conventions shared by every VPMM_* variable:
 *  - unset or empty: the default;
 *  - a bad value: -EINVAL and one line in `err` naming the variable, the value
 *    and what is accepted; the output structure is left unchanged.
 */
#ifndef VPMM_OPTIONS_H
#define VPMM_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "vpmm.h"

enum vpmm_log_level {
	VPMM_LOG_ERROR,
	VPMM_LOG_WARN,
	VPMM_LOG_INFO,
	VPMM_LOG_DEBUG,
};

/* What a synchronous free (cudaFree, cuMemFree) does before the memory
 * is reused (VPMM_SYNC_FREE). */
enum vpmm_sync_free {
	/* Fences on the device (the legacy default stream waits for every
	 * non-blocking stream; they wait for it before the memory is handed
	 * out again): the host goes on. Where the shim cannot know every
	 * stream that may touch the memory, as `device`. */
	VPMM_SYNC_FREE_EVENTS,
	/* Synchronise the pool's context, as the real call does. */
	VPMM_SYNC_FREE_DEVICE,
};

/* sun_path of a Unix socket address holds 108 bytes with the final NUL. */
#define VPMM_SOCKET_PATH_MAX 108
#define VPMM_TRACE_PATH_MAX 4096

struct vpmm_env_options {
	bool disable;                       /* VPMM_DISABLE: pass everything through */
	enum vpmm_log_level log_level;      /* VPMM_LOG */
	bool socket_off;                    /* VPMM_SOCKET=off */
	char socket[VPMM_SOCKET_PATH_MAX];  /* VPMM_SOCKET; "" = default location */
	char trace[VPMM_TRACE_PATH_MAX];    /* VPMM_TRACE; "" = no trace */
	bool has_release_threshold;         /* VPMM_RELEASE_THRESHOLD set */
	size_t release_threshold;           /* bytes of free pages kept mapped */
	enum vpmm_sync_free sync_free;      /* VPMM_SYNC_FREE */
};

typedef const char *(*vpmm_getenv_fn)(const char *name);

void vpmm_env_options_default(struct vpmm_env_options *o);
/* Fills `o` from the process-level VPMM_* variables of `getenv_fn` (getenv if
 * NULL) over the defaults. 0, or -EINVAL with one line in err. */
int vpmm_env_options_from_env(struct vpmm_env_options *o, vpmm_getenv_fn getenv_fn,
			      char *err, size_t errlen);

/* "error", "warn", "info", "debug". */
const char *vpmm_log_level_name(enum vpmm_log_level level);

/* The one strict decimal reader of the project (options, the socket's IPC
 * requests, vpmm-dump's arguments): one or more digits, no sign, no spaces,
 * no base prefix. strtoull() takes all three and wraps silently. 0 with *out
 * set; -EINVAL when s does not start with a digit; -ERANGE past UINT64_MAX
 * (*out then unspecified). *end receives the first non-digit either way but
 * for -EINVAL; the caller decides what may follow. */
int vpmm_parse_digits(const char *s, uint64_t *out, const char **end);

/* What a vpmm_config's page, handle and grain sizes are on a driver of
 * granularity `gran`, its zeros (the defaults) resolved. One place, so that
 * vpmm_config_check() judges the sizes the pool will use. */
struct vpmm_units {
	size_t page;   /* VPMM_PAGE_SIZE, else the granularity */
	size_t handle; /* VPMM_HANDLE_SIZE, else one page */
	size_t grain;  /* VPMM_GRAIN below the page, else the page */
};
void vpmm_config_units(const struct vpmm_config *cfg, size_t gran, struct vpmm_units *u);

/* "64K", "2M", or bytes: how a size reads back in a message (n >= 24). */
const char *vpmm_size_text(size_t v, char *buf, size_t n);
/* "1.50 MiB", "512 B": a size for people, in binary units with two
 * decimals up to EiB (n >= 24); the reports' notation (the out-of-memory
 * line and exception, vpmm-dump, vpmm-replay). */
const char *vpmm_size_human(uint64_t v, char *buf, size_t n);

/* vpmm_config_check() and the checks against the device's memory (`total`
 * bytes; 0: unknown), the ones vpmm_pool_create() makes: 0, or -EINVAL
 * with one line in err (may be NULL) naming the variable at fault. */
int vpmm_config_check_device(const struct vpmm_config *cfg, size_t gran, size_t total,
			     char *err, size_t errlen);

/* One entry of the options table, for documentation and --help. */
struct vpmm_option_info {
	const char *name;  /* "VPMM_PAGE_SIZE" */
	const char *type;  /* "size", "count", "enum", "bool", "string" */
	const char *def;   /* the default, as text */
	const char *desc;  /* one line */
};

/* The table; *n receives its length. */
const struct vpmm_option_info *vpmm_options_table(size_t *n);
/* The table as aligned text: name, default, description, one line each. */
void vpmm_options_print(FILE *f);

#endif
