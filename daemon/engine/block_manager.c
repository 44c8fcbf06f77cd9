/* The block manager: see block_manager.h. */
#include "engine/block_manager.h"

#include <stdlib.h>

#include "servd/status.h"

int bm_init(block_manager *bm, servd_kv_cache *kv, int max_tokens, bool prefix_cache, uint64_t key) {
  *bm = (block_manager){.kv = kv, .block_size = servd_kv_cache_block_size(kv), .max_tokens = max_tokens, .key = key};
  bm->max_blocks = bm_blocks_for(bm, max_tokens);
  return prefix_cache_init(&bm->pc, kv, prefix_cache);
}

void bm_free(block_manager *bm) { prefix_cache_free(&bm->pc); }

int bm_table_init(const block_manager *bm, block_table *t) {
  *t = (block_table){.ids = calloc((size_t)bm->max_blocks, sizeof(int32_t))};
  return t->ids ? 0 : servd_fail(SERVD_ENOMEM, "block table of %d blocks", bm->max_blocks);
}

void bm_table_free(block_table *t) {
  free(t->ids);
  t->ids = NULL;
  t->n = 0;
}

int bm_blocks_for(const block_manager *bm, int n_tokens) { return (n_tokens + bm->block_size - 1) / bm->block_size; }

int bm_available(const block_manager *bm) { return prefix_cache_available(&bm->pc); }

int bm_used(const block_manager *bm) {
  return servd_kv_cache_n_blocks(bm->kv) - servd_kv_cache_free_blocks(bm->kv) - bm->pc.n_evictable;
}

int bm_grow(block_manager *bm, block_table *t, int n_tokens) {
  int need = bm_blocks_for(bm, n_tokens) - t->n;
  if (need <= 0) return 0;
  if (t->n + need > bm->max_blocks)
    return servd_fail(SERVD_ERANGE, "scheduler: %d tokens exceed the context of %d", n_tokens, bm->max_tokens);
  int rc = prefix_cache_alloc(&bm->pc, need, t->ids + t->n);
  if (rc) return rc;
  t->n += need;
  return 0;
}

void bm_release(block_manager *bm, block_table *t) {
  if (t->n) prefix_cache_release(&bm->pc, t->n, t->ids);
  t->n = 0;
  t->chain = (prefix_chain){0};
}

void bm_truncate(block_manager *bm, block_table *t, int n_tokens) {
  int keep = bm_blocks_for(bm, n_tokens);
  if (keep < t->chain.n) keep = t->chain.n;
  if (t->n <= keep) return;
  prefix_cache_release(&bm->pc, t->n - keep, t->ids + keep);
  t->n = keep;
}

/* The key a table's blocks are cached under: the model's, and its adapter's (none: the model's). */
static uint64_t key_of(const block_manager *bm, const block_table *t) {
  return t->adapter ? bm->key ^ (t->adapter * 0x9E3779B97F4A7C15ull) : bm->key;
}

int bm_match(const block_manager *bm, const int32_t *tokens, int max_blocks, block_table *t, prefix_chain *chain,
             int *n_evictable) {
  *chain = (prefix_chain){0};
  *n_evictable = 0;
  return prefix_cache_match(&bm->pc, key_of(bm, t), tokens, max_blocks, t->ids, chain, n_evictable);
}

int bm_acquire(block_manager *bm, block_table *t, int n, const prefix_chain *chain) {
  int rc = prefix_cache_acquire(&bm->pc, n, t->ids);
  if (rc) return rc;
  t->n = n;
  t->chain = *chain;
  return 0;
}

void bm_register(block_manager *bm, block_table *t, const int32_t *tokens, int n_final) {
  while (bm->pc.enabled && (t->chain.n + 1) * bm->block_size <= n_final) {
    int i = t->chain.n;
    int32_t id = t->ids[i];
    prefix_cache_register(&bm->pc, key_of(bm, t), &t->chain, id, tokens + (size_t)i * bm->block_size);
    /* newly cached (not an equal entry found): the tier keeps a copy; not of an adapter's blocks,
     * whose K/V the tier's key (the model's) does not describe */
    if (bm->tier.stored && !t->adapter && bm->pc.serial[id] != 0 && bm->pc.serial[id] == t->chain.serial)
      bm->tier.stored(bm->tier.ctx, bm, tokens, i, id);
  }
}

void bm_fetch(block_manager *bm, const int32_t *tokens, int max_blocks) {
  if (bm->pc.enabled && bm->tier.fetch && max_blocks > 0) bm->tier.fetch(bm->tier.ctx, bm, tokens, max_blocks);
}
