/* libFuzzer: a GGUF file packed as modelpkg does (mpk_pack_gguf): the architecture's metadata reader
 * (llama, qwen2 with YaRN keys, phi3 with LongRoPE factor tensors, gemma3, ...), its config and tensor
 * checks, the tokenizer import and the package writer. Seeds: make_gguf_import_seeds.py. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "mpk/import.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char in[64], out[64];
  snprintf(in, sizeof in, "/tmp/fuzz-gguf-import-%d.gguf", (int)getpid());
  snprintf(out, sizeof out, "/tmp/fuzz-gguf-import-%d.mpk", (int)getpid());
  FILE *f = fopen(in, "wb");
  if (!f) return 0;
  fwrite(data, 1, size, f);
  fclose(f);
  mpk_import_options o;
  mpk_import_options_init(&o);
  mpk_pack_gguf(in, out, &o);
  unlink(in);
  unlink(out);
  return 0;
}
