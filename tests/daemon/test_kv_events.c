/* KV-cache events: llm-d's block hashes against values computed by an independent implementation
 * (Python: cbor2.dumps(x, canonical=True), hashlib.sha256, the last 8 bytes big-endian), the prefix
 * cache's hooks (stored with the right parent, removed on eviction, never for an unreachable entry),
 * and the publisher's refusals (an endpoint that cannot be bound names itself). The wire format is
 * tested from the outside, by a pyzmq + msgpack subscriber (tests/integration/test_kv_events.py). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "engine/kv_block_hash.h"
#include "engine/kv_events.h"
#include "engine/prefix_cache.h"
#include "servd/status.h"

static void test_block_hash_reference(void **state) {
  (void)state;
  /* cbor2 + hashlib: root = H(""), b1 = H([root, [1..16], None]), b2 = H([b1, heads..., None]). */
  uint64_t root = kv_block_hash_root("");
  assert_int_equal(root, 0x0ad38662763f13d3ull);
  assert_int_equal(kv_block_hash_root(NULL), root);
  assert_int_equal(kv_block_hash_root("42"), 0xa74ffcc4f31c1780ull);
  int32_t t1[16];
  for (int i = 0; i < 16; i++) t1[i] = i + 1;
  uint64_t b1 = kv_block_hash(root, t1, 16);
  assert_int_equal(b1, 0xb2d4f55f6847e50cull);
  /* Every CBOR head width: 1 byte, 24, 255, 256, 65535, 65536 and 2^32 - 1 (token ids are unsigned). */
  static const int32_t heads[8] = {0, 23, 24, 255, 256, 65535, 65536, (int32_t)0xffffffffu};
  int32_t t2[16];
  for (int i = 0; i < 16; i++) t2[i] = heads[i % 8];
  assert_int_equal(kv_block_hash(b1, t2, 16), 0xacf0b4b351e6207eull);
}

/* ---- the prefix cache's hooks ---------------------------------------------------------------- */

#define BS 4

typedef struct seen {
  int n_stored, n_removed;
  int32_t stored[16], parent[16], removed[16];
  int32_t first_token[16];
} seen;

static void on_stored(void *ud, int32_t id, int32_t parent, const int32_t *tokens, int block_size) {
  seen *s = ud;
  assert_int_equal(block_size, BS);
  s->first_token[s->n_stored] = tokens[0];
  s->parent[s->n_stored] = parent;
  s->stored[s->n_stored++] = id;
}

static void on_removed(void *ud, int32_t id) {
  seen *s = ud;
  s->removed[s->n_removed++] = id;
}

static const prefix_cache_events hooks = {on_stored, on_removed};

static void test_hooks(void **state) {
  (void)state;
  servd_kv_cache *kv;
  servd_prefix_cache pc;
  assert_int_equal(servd_kv_cache_create_blocks_only(&kv, 1, 1, 4, BS, 4), 0);
  assert_int_equal(prefix_cache_init(&pc, kv, true), 0);
  seen s = {0};
  pc.events = &hooks;
  pc.events_ud = &s;

  /* A chain of three blocks: each stored after the one before it. */
  int32_t toks[24] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24}, ids[3];
  assert_int_equal(prefix_cache_alloc(&pc, 3, ids), 0);
  prefix_chain c = {0};
  for (int i = 0; i < 3; i++) prefix_cache_register(&pc, 7, &c, ids[i], toks + i * BS);
  assert_int_equal(s.n_stored, 3);
  assert_int_equal(s.parent[0], -1);
  assert_int_equal(s.parent[1], ids[0]);
  assert_int_equal(s.parent[2], ids[1]);
  assert_int_equal(s.first_token[2], 9);

  /* The same prefix registered again (computed twice at once): not stored twice. */
  int32_t dup;
  assert_int_equal(prefix_cache_alloc(&pc, 1, &dup), 0);
  prefix_chain c2 = {0};
  prefix_cache_register(&pc, 7, &c2, dup, toks);
  assert_int_equal(s.n_stored, 3);
  assert_int_equal(c2.id, ids[0]); /* the chain follows the cached entry */
  prefix_cache_release(&pc, 1, &dup);

  /* Released, then evicted to make room: each eviction is told, the last block first in line. */
  prefix_cache_release(&pc, 3, ids);
  int32_t fresh[4];
  assert_int_equal(prefix_cache_alloc(&pc, 4, fresh), 0);
  assert_int_equal(s.n_removed, 3);
  assert_int_equal(s.removed[0], ids[2]);

  /* A chain whose parent was evicted since: its next block is unreachable and nobody hears of it. */
  prefix_cache_release(&pc, 4, fresh);
  int32_t a[2];
  assert_int_equal(prefix_cache_alloc(&pc, 2, a), 0);
  prefix_chain c3 = {0};
  prefix_cache_register(&pc, 9, &c3, a[0], toks);
  int stored = s.n_stored;
  int32_t filler[2], b;
  assert_int_equal(prefix_cache_alloc(&pc, 2, filler), 0); /* nothing free is left */
  prefix_cache_release(&pc, 1, a);                         /* a[0] evictable, then taken for other tokens */
  assert_int_equal(prefix_cache_alloc(&pc, 1, &b), 0);
  assert_int_equal(b, a[0]);
  prefix_cache_register(&pc, 9, &c3, a[1], toks + BS);
  assert_int_equal(s.n_stored, stored);
  prefix_cache_release(&pc, 1, &b);
  prefix_cache_release(&pc, 1, &a[1]);
  prefix_cache_release(&pc, 2, filler);

  /* Emptied (sleep, level 1): every cached block nobody holds goes, and each is told. */
  int32_t held[2];
  assert_int_equal(prefix_cache_alloc(&pc, 2, held), 0);
  prefix_chain c4 = {0};
  for (int i = 0; i < 2; i++) prefix_cache_register(&pc, 11, &c4, held[i], toks + 4 * BS + i * BS);
  prefix_cache_release(&pc, 2, held);
  int removed = s.n_removed, cached = pc.n_cached;
  assert_true(cached >= 2);
  assert_int_equal(prefix_cache_clear(&pc), cached);
  assert_int_equal(pc.n_cached, 0);
  assert_int_equal(s.n_removed, removed + cached);
  assert_int_equal(servd_kv_cache_free_blocks(kv), 4);

  prefix_cache_free(&pc);
  servd_kv_cache_destroy(kv);
}

/* ---- the publisher's refusals ---------------------------------------------------------------- */

static void test_bind_failures(void **state) {
  (void)state;
  servd_kv_events *e = NULL, *e2 = NULL;
  servd_kv_events_options o = {.endpoint = "tcp://*:*"};
  /* A wildcard port binds; a second publisher on a port in use does not, and says which. */
  assert_int_equal(servd_kv_events_create(&o, &e), 0);
  servd_kv_events_destroy(e);
  servd_kv_events_options taken = {.endpoint = "tcp://*:47791"};
  assert_int_equal(servd_kv_events_create(&taken, &e), 0);
  assert_int_equal(servd_kv_events_create(&taken, &e2), SERVD_EINVAL);
  assert_null(e2);
  assert_non_null(strstr(servd_last_error(), "--kv-events-endpoint tcp://*:47791: cannot bind"));
  servd_kv_events_options replay = {.endpoint = "tcp://*:*", .replay_endpoint = "tcp://*:47791"};
  assert_int_equal(servd_kv_events_create(&replay, &e2), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "--kv-events-replay-endpoint"));
  servd_kv_events_destroy(e);
  servd_kv_events_options bad = {.endpoint = "not-an-endpoint"};
  assert_int_equal(servd_kv_events_create(&bad, &e), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "--kv-events-endpoint not-an-endpoint: cannot connect"));
  /* A specific address is connected to (the subscriber binds), so nothing has to listen yet. */
  servd_kv_events_options peer = {.endpoint = "tcp://127.0.0.1:47792"};
  assert_int_equal(servd_kv_events_create(&peer, &e), 0);
  servd_kv_events_destroy(e);
  servd_kv_events_options none = {0};
  assert_int_equal(servd_kv_events_create(&none, &e), SERVD_EINVAL);
  servd_kv_events_destroy(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_block_hash_reference),
      cmocka_unit_test(test_hooks),
      cmocka_unit_test(test_bind_failures),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
