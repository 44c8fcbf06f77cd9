/* Automatic prefix caching: see prefix_cache.h for the design. */
#include "engine/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "servd/status.h"

/* splitmix64's finalizer: every input bit reaches every output bit. Chaining it over the tokens costs
 * ~1 ns per token (an 830-token prompt: ~1 us per admission), far below the step it saves; the
 * content is compared on every hit, so the hash needs to spread, not to resist an adversary. */
static uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

uint64_t prefix_cache_hash(uint64_t parent, const int32_t *tokens, int n, uint64_t key) {
  uint64_t h = mix(parent ^ mix(key + 0x9e3779b97f4a7c15ull));
  for (int i = 0; i < n; i++) h = mix(h + (uint32_t)tokens[i] + 0x9e3779b97f4a7c15ull);
  return mix(h ^ (uint64_t)n);
}

uint64_t prefix_cache_key(const char *name, const char *path) {
  uint64_t h = 0x6a09e667f3bcc908ull;
  for (const char *s = name; s && *s; s++) h = mix(h + (unsigned char)*s);
  h = mix(h ^ 0xff); /* keeps ("ab", "c") apart from ("a", "bc") */
  for (const char *s = path; s && *s; s++) h = mix(h + (unsigned char)*s);
  return h;
}

int prefix_cache_init(servd_prefix_cache *pc, servd_kv_cache *kv, bool enabled) {
  memset(pc, 0, sizeof *pc);
  pc->kv = kv;
  pc->enabled = enabled;
  pc->block_size = servd_kv_cache_block_size(kv);
  pc->n_blocks = servd_kv_cache_n_blocks(kv);
  pc->hash_fn = prefix_cache_hash;
  pc->lru_head = pc->lru_tail = -1;
  if (!enabled) return 0;
  size_t n = (size_t)pc->n_blocks;
  uint32_t buckets = 1;
  while (buckets < n && buckets < (1u << 30)) buckets <<= 1;
  pc->bucket_mask = buckets - 1;
  pc->serial = calloc(n, sizeof *pc->serial);
  pc->parent_serial = calloc(n, sizeof *pc->parent_serial);
  pc->hash = calloc(n, sizeof *pc->hash);
  pc->key = calloc(n, sizeof *pc->key);
  pc->tokens = calloc(n * (size_t)pc->block_size, sizeof *pc->tokens);
  pc->chain_next = malloc(n * sizeof *pc->chain_next);
  pc->bucket = malloc((size_t)buckets * sizeof *pc->bucket);
  pc->lru_prev = malloc(n * sizeof *pc->lru_prev);
  pc->lru_next = malloc(n * sizeof *pc->lru_next);
  pc->in_lru = calloc(n, 1);
  if (!pc->serial || !pc->parent_serial || !pc->hash || !pc->key || !pc->tokens || !pc->chain_next || !pc->bucket ||
      !pc->lru_prev || !pc->lru_next || !pc->in_lru) {
    prefix_cache_free(pc);
    return servd_fail(SERVD_ENOMEM, "prefix cache: bookkeeping of %d blocks of %d tokens", (int)n,
                      servd_kv_cache_block_size(kv));
  }
  for (uint32_t i = 0; i < buckets; i++) pc->bucket[i] = -1;
  return 0;
}

void prefix_cache_free(servd_prefix_cache *pc) {
  if (!pc) return;
  free(pc->serial);
  free(pc->parent_serial);
  free(pc->hash);
  free(pc->key);
  free(pc->tokens);
  free(pc->chain_next);
  free(pc->bucket);
  free(pc->lru_prev);
  free(pc->lru_next);
  free(pc->in_lru);
  memset(pc, 0, sizeof *pc);
}

static void lru_unlink(servd_prefix_cache *pc, int32_t b) {
  if (!pc->in_lru[b]) return;
  int32_t p = pc->lru_prev[b], n = pc->lru_next[b];
  if (p >= 0) pc->lru_next[p] = n;
  else pc->lru_head = n;
  if (n >= 0) pc->lru_prev[n] = p;
  else pc->lru_tail = p;
  pc->in_lru[b] = 0;
  pc->n_evictable--;
}

static void lru_push_tail(servd_prefix_cache *pc, int32_t b) {
  pc->lru_prev[b] = pc->lru_tail;
  pc->lru_next[b] = -1;
  if (pc->lru_tail >= 0) pc->lru_next[pc->lru_tail] = b;
  else pc->lru_head = b;
  pc->lru_tail = b;
  pc->in_lru[b] = 1;
  pc->n_evictable++;
}

/* The cached entry for (hash, parent, key, tokens), or -1. */
static int32_t find(const servd_prefix_cache *pc, uint64_t h, uint64_t parent, uint64_t key, const int32_t *tokens) {
  size_t row = (size_t)pc->block_size * sizeof *tokens;
  for (int32_t e = pc->bucket[h & pc->bucket_mask]; e >= 0; e = pc->chain_next[e])
    if (pc->hash[e] == h && pc->parent_serial[e] == parent && pc->key[e] == key &&
        memcmp(pc->tokens + (size_t)e * (size_t)pc->block_size, tokens, row) == 0)
      return e;
  return -1;
}

/* Takes block b's entry out of the table (the block keeps its cache reference). */
static void unregister(servd_prefix_cache *pc, int32_t b) {
  int32_t *at = &pc->bucket[pc->hash[b] & pc->bucket_mask];
  while (*at >= 0 && *at != b) at = &pc->chain_next[*at];
  if (*at == b) *at = pc->chain_next[b];
  pc->serial[b] = 0;
  pc->n_cached--;
}

int prefix_cache_match(const servd_prefix_cache *pc, uint64_t key, const int32_t *tokens, int max_blocks, int32_t *ids,
                       prefix_chain *chain, int *n_evictable) {
  prefix_chain c = {0};
  int free_hits = 0;
  if (pc->enabled && pc->n_cached > 0) {
    for (int i = 0; i < max_blocks; i++) {
      const int32_t *t = tokens + (size_t)i * (size_t)pc->block_size;
      uint64_t h = pc->hash_fn(c.hash, t, pc->block_size, key);
      int32_t e = find(pc, h, c.serial, key, t);
      if (e < 0) break;
      ids[i] = e;
      free_hits += pc->in_lru[e];
      c.n++;
      c.hash = h;
      c.serial = pc->serial[e];
      c.id = e;
    }
  }
  if (chain) *chain = c;
  if (n_evictable) *n_evictable = free_hits;
  return c.n;
}

int prefix_cache_acquire(servd_prefix_cache *pc, int n, const int32_t *ids) {
  int rc = servd_kv_cache_ref(pc->kv, n, ids);
  if (rc) return rc;
  for (int i = 0; i < n; i++) lru_unlink(pc, ids[i]);
  return 0;
}

int prefix_cache_available(const servd_prefix_cache *pc) {
  return servd_kv_cache_free_blocks(pc->kv) + pc->n_evictable;
}

int prefix_cache_alloc(servd_prefix_cache *pc, int n, int32_t *ids) {
  int free_now = servd_kv_cache_free_blocks(pc->kv);
  if (n > free_now + pc->n_evictable)
    return servd_fail(SERVD_EBUSY, "kv blocks: %d asked, %d free and %d cached evictable of %d", n, free_now,
                      pc->n_evictable, pc->n_blocks);
  for (int k = free_now; k < n; k++) {
    int32_t b = pc->lru_head;
    lru_unlink(pc, b);
    if (pc->events) pc->events->removed(pc->events_ud, b);
    unregister(pc, b);
    servd_kv_cache_free(pc->kv, 1, &b); /* the cache's reference was the last */
    pc->evictions++;
  }
  return servd_kv_cache_alloc(pc->kv, n, ids);
}

int prefix_cache_clear(servd_prefix_cache *pc) {
  int n = 0;
  while (pc->lru_head >= 0) {
    int32_t b = pc->lru_head;
    lru_unlink(pc, b);
    if (pc->events) pc->events->removed(pc->events_ud, b);
    unregister(pc, b);
    servd_kv_cache_free(pc->kv, 1, &b);
    pc->evictions++;
    n++;
  }
  return n;
}

void prefix_cache_release(servd_prefix_cache *pc, int n, const int32_t *ids) {
  if (!pc->enabled) {
    servd_kv_cache_free(pc->kv, n, ids);
    return;
  }
  for (int i = n - 1; i >= 0; i--) {
    int32_t b = ids[i];
    servd_kv_cache_free(pc->kv, 1, &b);
    if (b >= 0 && b < pc->n_blocks && pc->serial[b] && !pc->in_lru[b] && servd_kv_cache_refcount(pc->kv, b) == 1)
      lru_push_tail(pc, b);
  }
}

void prefix_cache_register(servd_prefix_cache *pc, uint64_t key, prefix_chain *chain, int32_t id,
                           const int32_t *tokens) {
  if (!pc->enabled || id < 0 || id >= pc->n_blocks) return;
  if (chain->serial == PREFIX_CHAIN_BROKEN) {
    chain->n++;
    return;
  }
  uint64_t h = pc->hash_fn(chain->hash, tokens, pc->block_size, key);
  int32_t e = find(pc, h, chain->serial, key, tokens);
  if (e < 0 && !pc->serial[id] && servd_kv_cache_ref(pc->kv, 1, &id) == 0) {
    e = id;
    pc->serial[e] = ++pc->next_serial;
    pc->parent_serial[e] = chain->serial;
    pc->hash[e] = h;
    pc->key[e] = key;
    memcpy(pc->tokens + (size_t)e * (size_t)pc->block_size, tokens, (size_t)pc->block_size * sizeof *tokens);
    uint32_t bk = (uint32_t)(h & pc->bucket_mask);
    pc->chain_next[e] = pc->bucket[bk];
    pc->bucket[bk] = e;
    pc->n_cached++;
    /* A parent evicted since the chain passed it leaves this entry unreachable: nobody is told. */
    bool reachable = !chain->serial || pc->serial[chain->id] == chain->serial;
    if (pc->events && reachable)
      pc->events->stored(pc->events_ud, e, chain->serial ? chain->id : -1, tokens, pc->block_size);
  }
  chain->n++;
  chain->hash = h;
  chain->serial = e >= 0 ? pc->serial[e] : PREFIX_CHAIN_BROKEN;
  chain->id = e;
}
