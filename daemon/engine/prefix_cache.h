/* Automatic prefix caching (internal to the engine): full KV blocks addressed by their content, so
 * that a request whose prompt starts like an earlier one reuses that one's K/V instead of computing
 * it again (system prompts, few-shot examples, chat history resent every turn).
 *
 * Design (vLLM's): a full block of block_size tokens is named by a 64-bit chain hash of (the hash of
 * the block before it, its token ids, a key: the model, later an adapter). A sequence's first blocks
 * are looked up in order and every one found is shared (one more reference on the allocator's block,
 * servd_kv_cache_ref); only the rest of the prompt is computed. A block is registered once its K/V
 * are computed (after the step that filled it), and the cache holds one reference on it. When the
 * last sequence lets go, the block stays cached but evictable, in an LRU list; allocation takes
 * truly free blocks first, then evicts the least recently released cached block (its entry goes).
 *
 * A hit never returns another prompt's K/V: an entry stores its block's token ids, the key and the
 * serial number of the entry before it in its chain, and a lookup compares all three. The serial
 * (not the block id) names the parent because a parent can be evicted and its block reused for other
 * tokens while a child is still cached: the reused block gets a new serial, and the orphaned child
 * can no longer be reached (it ages out of the LRU). So the hash only finds candidates; equal hashes
 * of different content (tests force them with hash_fn) cost a comparison, never a wrong answer.
 *
 * Block ids are the allocator's (one servd_kv_cache, the ids every tensor-parallel rank and a GPU
 * cache use), so one cache serves every backend. Not thread-safe: the scheduler's thread only.
 */
#ifndef SERVD_ENGINE_PREFIX_CACHE_H
#define SERVD_ENGINE_PREFIX_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "servd/ops.h"

/* Where a sequence's chain of registered full blocks stands. Zeroed: nothing registered yet. */
typedef struct prefix_chain {
  int n;           /* full blocks registered (or found) from the start */
  uint64_t hash;   /* chain hash of the last one */
  uint64_t serial; /* serial of the entry holding the last one's content (0: none yet) */
  int32_t id;      /* that entry's block (meaningful when serial is neither 0 nor broken) */
} prefix_chain;

/* chain.serial of a chain with a block that could not be registered: what follows is not either. */
#define PREFIX_CHAIN_BROKEN UINT64_MAX

typedef uint64_t (*prefix_hash_fn)(uint64_t parent, const int32_t *tokens, int n, uint64_t key);

/* Who is told when a block enters or leaves the cache (KV-cache events, kv_events.h), on the
 * scheduler's thread, inside the call that changes the cache: keep them short. stored: block id now
 * holds tokens[0, block_size) after block parent (-1: first block of its chain). removed: id's entry
 * is gone (evicted for reuse), told for every id, stored or not. */
typedef struct prefix_cache_events {
  void (*stored)(void *ud, int32_t id, int32_t parent, const int32_t *tokens, int block_size);
  void (*removed)(void *ud, int32_t id);
} prefix_cache_events;

typedef struct servd_prefix_cache {
  servd_kv_cache *kv; /* the allocator; borrowed */
  bool enabled;       /* false: plain alloc/free, no lookups, nothing kept */
  int block_size, n_blocks;
  prefix_hash_fn hash_fn; /* prefix_cache_hash; tests may force collisions */

  /* Per block id, meaningful while serial[id] != 0 (the block is cached). */
  uint64_t *serial, *parent_serial, *hash, *key;
  int32_t *tokens;     /* n_blocks x block_size */
  int32_t *chain_next; /* next entry of the same bucket, -1 ends */
  int32_t *bucket;     /* heads, bucket_mask + 1 of them */
  uint32_t bucket_mask;
  uint64_t next_serial;
  /* Cached blocks nobody but the cache holds: a doubly linked LRU list, head evicted first. */
  int32_t *lru_prev, *lru_next;
  uint8_t *in_lru;
  int32_t lru_head, lru_tail;
  int n_cached, n_evictable;

  /* Counters (tokens): looked up at admission, and found. Evicted blocks. */
  uint64_t queries, hits, evictions;
  const prefix_cache_events *events; /* NULL: nobody listens */
  void *events_ud;
} servd_prefix_cache;

/* Sized for kv's blocks; kv borrowed (must outlive pc). 0 or SERVD_ENOMEM. */
int prefix_cache_init(servd_prefix_cache *pc, servd_kv_cache *kv, bool enabled);
void prefix_cache_free(servd_prefix_cache *pc); /* accepts a zeroed struct */

/* A key naming a model (its served name and package path), mixed into every block's hash. */
uint64_t prefix_cache_key(const char *name, const char *path);
/* The default chain hash: 64 bits over (parent, tokens, key). */
uint64_t prefix_cache_hash(uint64_t parent, const int32_t *tokens, int n, uint64_t key);

/* Finds the longest run of cached full blocks that starts tokens[], at most max_blocks of them, for
 * key. Their ids go to ids[] and chain to where the run ends; no reference is taken. *n_evictable:
 * how many of them nobody holds now (taking them does not use up free memory). Returns the count. */
int prefix_cache_match(const servd_prefix_cache *pc, uint64_t key, const int32_t *tokens, int max_blocks, int32_t *ids,
                       prefix_chain *chain, int *n_evictable);
/* Takes a reference on each of n blocks that prefix_cache_match found (they leave the LRU list). */
int prefix_cache_acquire(servd_prefix_cache *pc, int n, const int32_t *ids);
/* Blocks an allocation can get: free ones plus evictable cached ones. */
int prefix_cache_available(const servd_prefix_cache *pc);
/* Takes n blocks, evicting least recently used cached blocks when too few are free; SERVD_EBUSY
 * (taking and evicting none) if fewer than n are available. */
int prefix_cache_alloc(servd_prefix_cache *pc, int n, int32_t *ids);
/* Drops a sequence's reference on each of its n blocks. Cached blocks nobody else holds become
 * evictable, the last block first in line, so a shared beginning outlives its tails. */
void prefix_cache_release(servd_prefix_cache *pc, int n, const int32_t *ids);
/* Evicts every cached block nobody holds (each told as removed); returns how many. */
int prefix_cache_clear(servd_prefix_cache *pc);
/* Registers block id, whose K/V for tokens[0, block_size) are computed, as the next full block of
 * chain (advanced: n, hash, serial). When an equal entry exists (the same prefix computed twice at
 * once) the block is not registered and chain follows that entry. No-op when disabled. */
void prefix_cache_register(servd_prefix_cache *pc, uint64_t key, prefix_chain *chain, int32_t id,
                           const int32_t *tokens);

#endif
