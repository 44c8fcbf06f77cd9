/* LoRA adapters: read, checked against their base model and laid out for servd.ops.lora.
 *
 * Sources:
 *   - a PEFT folder: adapter_config.json (peft_type LORA, r, lora_alpha, use_rslora, target_modules)
 *     and adapter_model.safetensors with
 *     base_model.model.model.layers.N.{self_attn.{q,k,v,o}_proj | mlp.{gate,up,down}_proj}.lora_{A,B}.weight
 *     (lora_A (r, in), lora_B (out, r); F32, F16 or BF16);
 *   - a llama.cpp GGUF LoRA file (convert_lora_to_gguf.py: general.type "adapter", adapter.type "lora",
 *     adapter.lora.alpha, blk.N.<attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down>.weight.lora_{a,b};
 *     F32, F16 or BF16): scale alpha / rank, lora_b's Q/K rows taken as the converter permuted them
 *     (for a base packed from a GGUF of the same model).
 * Scale: lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora. Ranks 1..MPK_LORA_MAX_RANK.
 * Refused, naming the file and the tensor: another rank or shape than the base's projection takes,
 * modules other than the seven projections, a lora_A without its lora_B, NaN or infinite values,
 * a truncated or malformed file, DoRA, fan_in_fan_out, biases, per-module rank patterns.
 */
#ifndef MPK_LORA_H
#define MPK_LORA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mpk/package.h"
#include "servd/tensor.h"

/* servd.ops.lora's limit (SERVD_LORA_MAX_RANK of servd/ops.h; the engine asserts they agree) */
#define MPK_LORA_MAX_RANK 64

typedef enum mpk_lora_module {
  MPK_LORA_Q,
  MPK_LORA_K,
  MPK_LORA_V,
  MPK_LORA_O,
  MPK_LORA_GATE,
  MPK_LORA_UP,
  MPK_LORA_DOWN,
  MPK_LORA_MODULES
} mpk_lora_module;

/* "q_proj", ... */
SERVD_API const char *mpk_lora_module_name(mpk_lora_module m);

/* What the base model offers an adapter: its layers and each projection's (out, in) features. */
typedef struct mpk_lora_base {
  int n_layers;
  int64_t out[MPK_LORA_MODULES], in[MPK_LORA_MODULES];
  /* The base's Q/K rows are llama.cpp's interleaved-RoPE permutation (a GGUF Llama: rope_layout
   * "interleaved"): lora_B rows of q_proj / k_proj are permuted the same way, heads of head_dim. */
  bool permute_qk;
  int q_heads, kv_heads;
  char name[128]; /* the package's name */
  char hash[72];  /* content hash of the base package's weights ("" when unknown) */
} mpk_lora_base;

/* Reads the projection shapes of a package (Hugging Face or GGUF tensor names); SERVD_EUNSUPPORTED
 * for a model without separate q/k/v/o/gate/up/down projections (Phi-3's fused ones). */
SERVD_API int mpk_lora_base_of(mpk_package *p, mpk_lora_base *out);

typedef struct mpk_lora {
  int rank;
  double alpha;
  bool rslora;
  float scale; /* alpha / r, or alpha / sqrt(r) */
  int n_layers;
  /* [layer * MPK_LORA_MODULES + module]: ab (r, in + out), row j = lora_A row j then lora_B column j,
   * f16 when both came as F16, else f32; NULL where the adapter leaves the projection alone. Owned. */
  servd_tensor **ab;
  int n_adapted;         /* non-NULL entries */
  uint64_t bytes;        /* of the ab tensors */
  char base_model[256];  /* adapter_config's base_model_name_or_path, "" when absent */
  char base_hash[72];    /* an adapter package's base hash, "" for a PEFT folder */
  char content_hash[72]; /* "sha256:<hex>" of the adapter's config and weights */
} mpk_lora;

/* Parses a PEFT adapter from its two files in memory (config JSON text, safetensors bytes), checked
 * against `base`. `what` names the source in messages. *out owned by the caller (mpk_lora_free). */
SERVD_API int mpk_lora_parse(const char *what, const char *config, size_t config_len, const void *st, size_t st_len,
                             const mpk_lora_base *base, mpk_lora **out);
/* The same from a llama.cpp GGUF LoRA file in memory. */
SERVD_API int mpk_lora_parse_gguf(const char *what, const void *buf, size_t len, const mpk_lora_base *base,
                                  mpk_lora **out);
/* Reads a PEFT folder, a GGUF LoRA file or an adapter package at path; an adapter package made for
 * another base (its lora.base.hash is not base->hash) is refused naming both. */
SERVD_API int mpk_lora_load(const char *path, const mpk_lora_base *base, mpk_lora **out);
SERVD_API void mpk_lora_free(mpk_lora *l); /* accepts NULL */

/* modelpkg pack --lora: the PEFT folder adapter_dir, checked against base as a load checks it, as an
 * adapter package at out: manifest kind "lora-adapter", name, config (adapter_config.json),
 * lora {base {name, hash}, rank, alpha, use_rslora}, and the two files as they are. */
SERVD_API int mpk_lora_pack(const char *adapter_dir, mpk_package *base, const char *name, const char *out);

#endif
