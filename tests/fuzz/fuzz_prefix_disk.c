/* The prefix cache's block file reader (prefix_disk_check) on arbitrary bytes: never a crash, a read
 * out of bounds or a payload pointer outside the file, whatever the file says. The expected block is
 * fixed; the seeds (corpus/prefix_disk/) are a valid file for it and cut or altered copies. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/prefix_disk_format.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const int32_t tokens[4] = {1, 2, 3, 4};
  prefix_disk_meta want = {.model_key = 0x1122334455667788ull,
                           .hash = 0x0102030405060708ull,
                           .parent_hash = 7,
                           .dtype = 4,
                           .block_size = 4,
                           .n_layers = 1,
                           .n_kv_heads = 1,
                           .head_dim = 32,
                           .tp = 1,
                           .payload_bytes = 64};
  uint8_t *copy = malloc(size ? size : 1); /* exactly the file's bytes: ASan sees any read past them */
  if (!copy) return 0;
  memcpy(copy, data, size);
  const uint8_t *payload = NULL;
  const char *why = NULL;
  prefix_disk_verdict v = prefix_disk_check(copy, size, &want, tokens, &payload, &why);
  if (v == PREFIX_DISK_OK) {
    if (!payload || payload < copy || payload + want.payload_bytes != copy + size) abort();
    volatile uint8_t sink = 0;
    for (uint64_t i = 0; i < want.payload_bytes; i++) sink ^= payload[i];
    (void)sink;
  } else if (payload || !why) {
    abort();
  }
  free(copy);
  return 0;
}
