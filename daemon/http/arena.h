/* A per-request arena: bump allocation from a chain of blocks plus cleanup hooks, all released at
 * once when the request ends (as nginx's ngx_pool_t). Not thread-safe: used on the loop thread only.
 */
#ifndef SERVD_HTTP_ARENA_H
#define SERVD_HTTP_ARENA_H

#include <stddef.h>

typedef struct servd_arena servd_arena;

/* NULL on allocation failure. */
servd_arena *servd_arena_create(size_t block_size);
void servd_arena_destroy(servd_arena *a); /* runs cleanups; accepts NULL */
/* Runs the cleanups and frees every block but the first, ready for the next request. */
void servd_arena_reset(servd_arena *a);

/* Memory valid until the next reset/destroy, 16-byte aligned; NULL when out of memory. */
void *servd_arena_alloc(servd_arena *a, size_t n);
void *servd_arena_calloc(servd_arena *a, size_t n);
char *servd_arena_strndup(servd_arena *a, const char *s, size_t n);
char *servd_arena_strdup(servd_arena *a, const char *s);
char *servd_arena_printf(servd_arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* fn(p) runs at reset/destroy, most recently added first. Returns 0 or -1 when out of memory
 * (then fn has not been registered and the caller still owns p). */
int servd_arena_cleanup_add(servd_arena *a, void (*fn)(void *), void *p);

#endif
