/* The block manager (internal to the engine): every KV block a sequence holds, from allocation to
 * release. It owns the sequences' block tables and the prefix cache over them (prefix_cache.h:
 * content-addressed full blocks, their chain hashes, LRU eviction), and is the only way to the
 * allocator (the kernels' servd_kv_cache: the free list and reference counts, whose block ids every
 * tensor-parallel rank and a GPU cache share). The scheduler decides what runs and asks here for the
 * blocks it needs; the update phase truncates a table to the tokens a verify row accepted.
 *
 * A block is registered in the prefix cache once every one of its tokens is final (computed, and not
 * a draft still to be judged): a cached block never holds K/V that a sequence could take back, so
 * sharing and truncation never meet. Not thread-safe: the scheduler's thread only.
 */
#ifndef SERVD_ENGINE_BLOCK_MANAGER_H
#define SERVD_ENGINE_BLOCK_MANAGER_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/prefix_cache.h"

/* A sequence's blocks: ids[i] holds its tokens [i * block_size, (i + 1) * block_size). */
typedef struct block_table {
  int32_t *ids;       /* capacity: the manager's max_blocks */
  int n;              /* blocks held */
  prefix_chain chain; /* its full blocks registered in (or found in) the prefix cache */
  uint64_t adapter;   /* mixed into the prefix-cache key: 0, or the LoRA adapter's (its K/V differ) */
} block_table;

typedef struct block_manager block_manager;

/* A lower tier under the prefix cache (prefix_disk.h; zeroed: none): told of each block newly
 * registered (block `index` of the sequence whose tokens start at `tokens`), and asked, before a
 * prompt is matched, to bring back into the cache the blocks of it that it holds. */
typedef struct bm_tier {
  void *ctx;
  void (*stored)(void *ctx, block_manager *bm, const int32_t *tokens, int index, int32_t id);
  void (*fetch)(void *ctx, block_manager *bm, const int32_t *tokens, int max_blocks);
} bm_tier;

struct block_manager {
  servd_kv_cache *kv;    /* the allocator; borrowed */
  servd_prefix_cache pc; /* every block goes through it (a plain allocator when disabled) */
  int block_size;
  int max_blocks; /* per table: a context's worth */
  int max_tokens; /* the context */
  uint64_t key;   /* the model's prefix-cache key: blocks are only found under the same key */
  bm_tier tier;
};

/* kv borrowed (outlives bm); tables hold up to max_tokens tokens. 0 or SERVD_ENOMEM. */
int bm_init(block_manager *bm, servd_kv_cache *kv, int max_tokens, bool prefix_cache, uint64_t key);
void bm_free(block_manager *bm); /* accepts a zeroed struct */

int bm_table_init(const block_manager *bm, block_table *t); /* 0 or SERVD_ENOMEM */
void bm_table_free(block_table *t);                         /* accepts a zeroed table */

/* Blocks n tokens take. */
int bm_blocks_for(const block_manager *bm, int n_tokens);
/* Blocks that can be had now: free ones and cached ones nobody holds (evicted on demand). */
int bm_available(const block_manager *bm);
/* Blocks held by tables (a cached block nobody holds counts as free). */
int bm_used(const block_manager *bm);

/* t holds blocks for its first n_tokens: 0, SERVD_EBUSY having taken none (too few blocks), or
 * SERVD_ERANGE (more than a context). */
int bm_grow(block_manager *bm, block_table *t, int n_tokens);
/* Gives back every block of t (its registered ones stay cached, evictable once nobody holds them). */
void bm_release(block_manager *bm, block_table *t);
/* The blocks of t past what n_tokens take go back, never one its chain registered. */
void bm_truncate(block_manager *bm, block_table *t, int n_tokens);

/* The cached full blocks tokens[] starts with (at most max_blocks): their ids into t->ids and *chain,
 * no reference taken; *n_evictable of them nobody holds now. Returns their count (0 when the prefix
 * cache is off). t must hold no block. */
int bm_match(const block_manager *bm, const int32_t *tokens, int max_blocks, block_table *t, prefix_chain *chain,
             int *n_evictable);
/* Asks the tier (if any) to bring back the blocks of tokens[] (at most max_blocks) it holds. */
void bm_fetch(block_manager *bm, const int32_t *tokens, int max_blocks);
/* Takes the n blocks bm_match found into t (t->n = n, t->chain = chain). */
int bm_acquire(block_manager *bm, block_table *t, int n, const prefix_chain *chain);
/* Registers the full blocks of t whose tokens (tokens[0..n_final)) are all final. */
void bm_register(block_manager *bm, block_table *t, const int32_t *tokens, int n_final);

#endif
