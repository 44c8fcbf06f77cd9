/* The prefix cache's disk tier over a real q8_0 KV cache and the block manager: blocks registered
 * are written; after a "restart" (new cache, new manager, the directory reopened) a prompt's blocks
 * come back byte for byte and are found by the memory cache's lookup; another prompt, model key or
 * geometry finds nothing; a truncated, corrupt or foreign file is counted, removed and the block
 * computed instead; the size bound evicts the least recently used files; the file reader's verdicts
 * on each kind of damage. */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/prefix_disk.h"
#include "engine/prefix_disk_format.h"

#define BS 4
#define NB 3 /* blocks of the prompt */
#define LAYERS 2
#define KVH 2
#define HD 32

static char dir[64];
static int32_t prompt[NB * BS] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static char *ref[NB]; /* the blocks' bytes as first computed */
static size_t block_bytes;

typedef struct node {
  servd_kv_cache *kv;
  block_manager bm;
  prefix_disk *d;
} node;

static void start(node *n, uint64_t key, uint64_t max_bytes) {
  assert_int_equal(servd_kv_cache_create(&n->kv, LAYERS, KVH, HD, BS, 16, SERVD_Q8_0), 0);
  assert_int_equal(bm_init(&n->bm, n->kv, 64, true, 1), 0);
  assert_int_equal(prefix_disk_open(&n->d, dir, max_bytes, &n->kv, 1, LAYERS, KVH, HD, key), 0);
  n->bm.tier = prefix_disk_tier(n->d);
}

static void stop(node *n) {
  prefix_disk_close(n->d); /* writes what is queued */
  bm_free(&n->bm);
  servd_kv_cache_destroy(n->kv);
}

/* Computes the prompt's K/V (values from seed) into a table's blocks and registers them. */
static void compute(node *n, block_table *t, const int32_t *tokens, float seed) {
  assert_int_equal(bm_table_init(&n->bm, t), 0);
  assert_int_equal(bm_grow(&n->bm, t, NB * BS), 0);
  int w = KVH * HD;
  int64_t s2[2] = {NB * BS, w}, s1[1] = {NB * BS};
  servd_tensor *k = servd_tensor_new(SERVD_F32, 2, s2), *v = servd_tensor_new(SERVD_F32, 2, s2);
  servd_tensor *sl = servd_tensor_new(SERVD_I32, 1, s1);
  for (int i = 0; i < NB * BS * w; i++) {
    ((float *)servd_tensor_data(k))[i] = (float)((i * 37 + (int)seed) % 101) / 50.0f - 1.0f;
    ((float *)servd_tensor_data(v))[i] = (float)((i * 53 + (int)seed) % 97) / 48.0f - 1.0f;
  }
  for (int p = 0; p < NB * BS; p++) ((int32_t *)servd_tensor_data(sl))[p] = t->ids[p / BS] * BS + p % BS;
  for (int l = 0; l < LAYERS; l++) assert_int_equal(servd_kv_write(n->kv, l, k, v, sl), 0);
  servd_tensor_release(k);
  servd_tensor_release(v);
  servd_tensor_release(sl);
  bm_register(&n->bm, t, tokens, NB * BS);
}

/* Blocks of tokens found after the tier's fetch, their bytes checked against ref (up to found). */
static int found_after_fetch(node *n, const int32_t *tokens) {
  bm_fetch(&n->bm, tokens, NB);
  block_table t;
  assert_int_equal(bm_table_init(&n->bm, &t), 0);
  prefix_chain chain;
  int ev = 0, m = bm_match(&n->bm, tokens, NB, &t, &chain, &ev);
  char *got = test_malloc(block_bytes);
  for (int i = 0; i < m && tokens == prompt; i++) {
    assert_int_equal(servd_kv_cache_block_read(n->kv, t.ids[i], got), 0);
    assert_memory_equal(got, ref[i], block_bytes);
  }
  test_free(got);
  bm_table_free(&t);
  return m;
}

static prefix_disk_stats stats(node *n) {
  prefix_disk_stats s;
  prefix_disk_get_stats(n->d, &s);
  return s;
}

/* The files in the model's directory (one key), their paths sorted into names[]. */
static int files(uint64_t key, char names[][512], int cap) {
  char sub[128];
  snprintf(sub, sizeof sub, "%s/%016llx", dir, (unsigned long long)key);
  DIR *dd = opendir(sub);
  int n = 0;
  struct dirent *e;
  while (dd && (e = readdir(dd)))
    if (e->d_name[0] != '.' && n < cap) snprintf(names[n++], 512, "%s/%s", sub, e->d_name);
  if (dd) closedir(dd);
  return n;
}

static void write_once(uint64_t key) {
  node n;
  start(&n, key, 1ull << 30);
  block_table t;
  compute(&n, &t, prompt, 1);
  for (int i = 0; i < NB; i++) {
    ref[i] = ref[i] ? ref[i] : malloc(block_bytes); /* kept across tests */
    assert_int_equal(servd_kv_cache_block_read(n.kv, t.ids[i], ref[i]), 0);
  }
  bm_release(&n.bm, &t);
  bm_table_free(&t);
  stop(&n);
}

static void test_restart(void **state) {
  (void)state;
  write_once(77);
  char names[8][512];
  assert_int_equal(files(77, names, 8), NB);
  node n;
  start(&n, 77, 1ull << 30);
  assert_int_equal(stats(&n).files, NB);
  assert_int_equal(found_after_fetch(&n, prompt), NB);
  assert_int_equal(stats(&n).blocks_read, NB);
  assert_int_equal(stats(&n).rejected, 0);
  /* a prompt that shares the first block only: that one (already in memory now), nothing else */
  int32_t other[NB * BS];
  memcpy(other, prompt, sizeof other);
  other[BS + 1] = 99;
  assert_int_equal(found_after_fetch(&n, other), 1);
  stop(&n);
  /* another key (another model, dtype or geometry) sees none of these files */
  start(&n, 78, 1ull << 30);
  assert_int_equal(stats(&n).files, 0);
  assert_int_equal(found_after_fetch(&n, prompt), 0);
  stop(&n);
}

/* Damage: the second block's payload altered, then the first file cut short. */
static void test_damaged_files(void **state) {
  (void)state;
  write_once(80);
  char names[8][512];
  assert_int_equal(files(80, names, 8), NB);
  /* which file is which block: the reader says, through the blocks found */
  for (int victim = 0; victim < NB; victim++) {
    write_once(80);
    assert_int_equal(files(80, names, 8), NB);
    int fd = open(names[victim], O_RDWR);
    assert_true(fd >= 0);
    char c;
    off_t at = (off_t)prefix_disk_header_bytes(BS) + 100;
    assert_int_equal(pread(fd, &c, 1, at), 1);
    c ^= 0x20;
    assert_int_equal(pwrite(fd, &c, 1, at), 1);
    close(fd);
    node n;
    start(&n, 80, 1ull << 30);
    int m = found_after_fetch(&n, prompt);
    assert_true(m < NB); /* stops at the damaged block */
    assert_int_equal(stats(&n).rejected, 1);
    assert_int_equal(stats(&n).files, NB - 1); /* removed */
    stop(&n);
  }
  write_once(80);
  assert_int_equal(files(80, names, 8), NB);
  for (int i = 0; i < NB; i++) assert_int_equal(truncate(names[i], 50), 0);
  node n;
  start(&n, 80, 1ull << 30);
  assert_int_equal(found_after_fetch(&n, prompt), 0);
  assert_int_equal(stats(&n).rejected, 1); /* the first block's file; the others are not read */
  stop(&n);
}

/* Room for two files: the third written evicts the least recently used. */
static void test_size_bound(void **state) {
  (void)state;
  uint64_t one = prefix_disk_header_bytes(BS) + block_bytes;
  node n;
  start(&n, 90, 2 * one);
  block_table t;
  compute(&n, &t, prompt, 3);
  bm_release(&n.bm, &t);
  bm_table_free(&t);
  stop(&n);
  char names[8][512];
  assert_int_equal(files(90, names, 8), 2);
  start(&n, 90, 2 * one);
  assert_true(stats(&n).bytes <= 2 * one);
  stop(&n);
}

/* The reader's verdicts. */
static void test_format(void **state) {
  (void)state;
  int32_t tokens[BS] = {1, 2, 3, 4};
  prefix_disk_meta m = {.model_key = 9,
                        .hash = 10,
                        .parent_hash = 11,
                        .dtype = SERVD_Q8_0,
                        .block_size = BS,
                        .n_layers = 1,
                        .n_kv_heads = 1,
                        .head_dim = 32,
                        .tp = 1,
                        .payload_bytes = 40};
  size_t hb = prefix_disk_header_bytes(BS);
  uint8_t file[200], payload[40];
  for (int i = 0; i < 40; i++) payload[i] = (uint8_t)i;
  prefix_disk_header_write(file, &m, tokens, payload);
  memcpy(file + hb, payload, 40);
  const uint8_t *p;
  const char *why;
  assert_int_equal(prefix_disk_check(file, hb + 40, &m, tokens, &p, &why), PREFIX_DISK_OK);
  assert_ptr_equal(p, file + hb);
  assert_int_equal(prefix_disk_check(file, hb + 39, &m, tokens, &p, &why), PREFIX_DISK_TRUNCATED);
  assert_null(p);
  assert_int_equal(prefix_disk_check(file, 10, &m, tokens, &p, &why), PREFIX_DISK_FOREIGN);
  prefix_disk_meta other = m;
  other.model_key = 8;
  assert_int_equal(prefix_disk_check(file, hb + 40, &other, tokens, &p, &why), PREFIX_DISK_FOREIGN);
  other = m;
  other.dtype = SERVD_F16;
  assert_int_equal(prefix_disk_check(file, hb + 40, &other, tokens, &p, &why), PREFIX_DISK_FOREIGN);
  int32_t t2[BS] = {1, 2, 3, 5};
  assert_int_equal(prefix_disk_check(file, hb + 40, &m, t2, &p, &why), PREFIX_DISK_CORRUPT);
  assert_non_null(strstr(why, "tokens"));
  file[hb + 3] ^= 1;
  assert_int_equal(prefix_disk_check(file, hb + 40, &m, tokens, &p, &why), PREFIX_DISK_CORRUPT);
  assert_non_null(strstr(why, "CRC"));
}

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/servd-prefix-disk-XXXXXX");
  if (!mkdtemp(dir)) return -1;
  block_bytes = servd_kv_cache_block_bytes(LAYERS, KVH, HD, BS, SERVD_Q8_0);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  for (int i = 0; i < NB; i++) free(ref[i]);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_restart),
      cmocka_unit_test(test_damaged_files),
      cmocka_unit_test(test_size_bound),
      cmocka_unit_test(test_format),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
