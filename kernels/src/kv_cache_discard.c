/* servd_kv_cache_discard: a cache with no block held gives its memory back to the system (a model
 * put to sleep, level 1). The pool is an anonymous mapping, so MADV_DONTNEED drops its pages at once
 * and the next touch maps zeroed ones: the cache stays valid, and nothing it held mattered, since
 * every block is written before attention reads it. */
#include <sys/mman.h>

#include "ops-impl.h"
#include "servd/ops.h"
#include "servd/status.h"

int servd_kv_cache_discard(servd_kv_cache *c) {
  if (!c) return 0;
  pthread_mutex_lock(&c->mu);
  int held = c->n_blocks - c->n_free;
  int rc = 0;
  if (held > 0) rc = servd_fail(SERVD_EBUSY, "kv cache discard: %d of %d blocks are still held", held, c->n_blocks);
  else if (c->pool && madvise(c->pool, c->pool_bytes, MADV_DONTNEED) != 0)
    rc = servd_fail(SERVD_EIO, "kv cache discard: madvise of %zu bytes failed", c->pool_bytes);
  pthread_mutex_unlock(&c->mu);
  return rc;
}
