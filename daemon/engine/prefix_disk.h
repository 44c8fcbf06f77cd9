/* The prefix cache's disk tier (internal to the engine): full KV blocks kept in files so that a
 * prompt seen before a restart finds its K/V again instead of computing it (as LMCache's disk
 * backend and llama-server's slot files do).
 *
 * A block the prefix cache registers is copied (every rank's share, in the cache's own layout) and
 * handed to a writer thread, which writes DIR/<model key>/<chain hash>.kvb (prefix_disk_format.h)
 * through a temporary name and a rename, so a file is whole or absent. The chain hash covers the
 * block's tokens and every block before it, under a key of the package's content, the KV dtype and
 * the cache geometry: another model, dtype, block size or TP degree never finds a file. The files
 * are bounded in bytes, least recently used first out (last use: a write or a read; at start, the
 * files' modification times). Before a waiting prompt is matched in memory (bm_fetch), the blocks
 * that follow its memory hits and are on disk are read back into free blocks and registered, up to
 * the first one missing; each file is checked whole (prefix_disk_check), and one that is foreign,
 * truncated or corrupt is counted, removed and never trusted. Writes that would queue more than a
 * bound are dropped and counted (a busy disk never stalls the scheduler).
 *
 * The fetch runs on the scheduler's thread; the writer thread and it share only the index (a lock).
 */
#ifndef SERVD_ENGINE_PREFIX_DISK_H
#define SERVD_ENGINE_PREFIX_DISK_H

#include <stdint.h>

#include "engine/block_manager.h"
#include "servd/ops.h"

typedef struct prefix_disk prefix_disk;

typedef struct prefix_disk_stats {
  uint64_t blocks_written, bytes_written; /* files written */
  uint64_t blocks_read;                   /* blocks found on disk and brought back */
  uint64_t rejected;                      /* files foreign, truncated or corrupt: removed, not used */
  uint64_t evicted;                       /* files removed for the size bound */
  uint64_t dropped;                       /* writes not queued: the writer was too far behind */
  uint64_t files, bytes;                  /* on disk now */
} prefix_disk_stats;

/* The key of a model's blocks: its package's content (the canonical manifest, which lists every
 * entry's SHA-256), the KV dtype and the geometry of the caches. */
uint64_t prefix_disk_key(const char *manifest_json, servd_dtype dtype, int block_size, int n_layers, int n_kv_heads,
                         int head_dim, int tp);

/* Opens (creating) dir/<key in hex>/ for tp ranks' caches kv[] (borrowed, CPU caches of the model's
 * n_layers, head_dim and n_kv_heads_total / tp kv heads each), indexes the files there and starts
 * the writer. max_bytes: the bound on the files' size. 0 or a negative code naming the directory. */
int prefix_disk_open(prefix_disk **out, const char *dir, uint64_t max_bytes, servd_kv_cache *const *kv, int tp,
                     int n_layers, int n_kv_heads_total, int head_dim, uint64_t key);
/* Writes what is queued, stops the writer and frees d. Accepts NULL. */
void prefix_disk_close(prefix_disk *d);
void prefix_disk_get_stats(prefix_disk *d, prefix_disk_stats *s);
/* The block manager's tier (bm_tier) over d. */
bm_tier prefix_disk_tier(prefix_disk *d);

#endif
