/* libFuzzer: the LoRA adapter readers over a fixed small base. Input: a llama.cpp GGUF LoRA file
 * (starting "GGUF": mpk_lora_parse_gguf), or a PEFT adapter as u32 LE length of the
 * adapter_config.json text, that text, then adapter_model.safetensors (mpk_lora_parse). Seeds:
 * corpus/lora/ (tests/fuzz/make_lora_seeds.py). */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "mpk/lora.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4) return 0;
  bool gguf = !memcmp(data, "GGUF", 4);
  uint32_t n;
  memcpy(&n, data, 4);
  if (!gguf && n > size - 4) return 0;
  /* 2 layers, hidden 8, 2 heads of 4 (1 KV head), MLP 16: the shapes make_lora_seeds.py writes */
  mpk_lora_base base = {.n_layers = 2,
                        .out = {8, 4, 4, 8, 16, 16, 8},
                        .in = {8, 8, 8, 8, 8, 8, 16},
                        .permute_qk = (size & 1) != 0, /* both B row orders */
                        .q_heads = 2,
                        .kv_heads = 1,
                        .name = "fuzz-base"};
  mpk_lora *l = NULL;
  int rc = gguf ? mpk_lora_parse_gguf("fuzz.gguf", data, size, &base, &l)
                : mpk_lora_parse("fuzz", (const char *)data + 4, n, data + 4 + n, size - 4 - n, &base, &l);
  if (rc != 0) return 0;
  if (l->rank < 1 || l->rank > MPK_LORA_MAX_RANK || l->n_adapted < 1) __builtin_trap();
  for (int i = 0; i < l->n_layers * MPK_LORA_MODULES; i++) {
    const servd_tensor *t = l->ab[i];
    if (!t) continue;
    int m = i % MPK_LORA_MODULES;
    if (t->shape[0] != l->rank || t->shape[1] != base.in[m] + base.out[m]) __builtin_trap();
  }
  mpk_lora_free(l);
  return 0;
}
