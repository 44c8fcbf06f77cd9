/* The architecture registry: one row per model family (arch_<family>.c), one table (arch.c).
 *
 * A row says which sources the family accepts (Hugging Face config.json model_type/architectures,
 * GGUF general.architecture), how their tensor names map to the package's canonical names (Hugging
 * Face Llama style: model.layers.N.self_attn.q_proj.weight, ...), how a GGUF's metadata becomes the
 * config, how a config and the tensor shapes are checked, the RoPE layout of each source, and which
 * folder of models/ holds its code. The importers and mpk_check_model know no family: they ask this
 * table. Adding a family is one arch_<family>.c, one line in arch.c and its code under models/
 * (docs/architecture.md, "How to add a model family").
 */
#ifndef MPK_ARCH_H
#define MPK_ARCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "mpk/gguf.h"
#include "servd/tensor.h"

typedef struct mpk_name_pair {
  const char *src, *dst;
} mpk_name_pair;

/* Source tensor names -> canonical names. Whole names are looked up in `global`; per-layer names
 * "<block_prefix><N>.<suffix>" in `block` by suffix, becoming "model.layers.<N>.<dst>". Tables end
 * with {NULL, NULL}; a NULL table or prefix maps nothing. Names no table matches are kept; a name
 * mapped to "" is left out of the package (a buffer the code never reads). */
typedef struct mpk_name_map {
  const char *block_prefix;
  const mpk_name_pair *global, *block;
} mpk_name_map;

/* The tensors of a package or a source under canonical names, sorted by name (mpk__shapes_sort). */
typedef struct mpk_shape_entry {
  const char *name; /* borrowed */
  int ndim;
  int64_t shape[SERVD_MAX_DIMS];
} mpk_shape_entry;
typedef struct mpk_shapes {
  mpk_shape_entry *e;
  size_t n;
} mpk_shapes;

typedef struct mpk_arch {
  const char *name;                    /* registry name; the manifest's "architecture" */
  const char *const *hf_model_types;   /* config.json model_type accepted; [0] is written for GGUF sources */
  const char *const *hf_architectures; /* config.json architectures accepted; [0] is written for GGUF sources */
  const char *const *gguf_archs;       /* general.architecture accepted (also its metadata key prefix) */
  mpk_name_map gguf_names, hf_names;
  /* Optional: a prefix the Hugging Face names may carry, cut before hf_names maps them (a BERT
   * cross-encoder's "bert."): the same tensors as the bare model's. */
  const char *hf_prefix;
  const char *rope_layout_gguf, *rope_layout_hf; /* "interleaved" (llama.cpp permuted Q/K rows) or "half" */
  const char *code;                              /* the code folder: models/<code>, packed as code/<code>/ */
  const char *entry_point;                       /* default "module:callable" of that code */
  /* GGUF metadata (keys "<gguf_arch>.*") -> a Hugging Face-style config; *out owned by the caller. */
  int (*gguf_config)(const struct mpk_arch *a, const char *what, const mpk_gguf *g, const char *gguf_arch, bool tied,
                     uint64_t n_vocab, json_t **out);
  /* Optional (NULL: none): adapts a source's config before the checks, at pack time only; e.g.
   * Mistral caps the context at its sliding window. Says on stderr what it changed. */
  int (*prepare_config)(const struct mpk_arch *a, const char *what, json_t *config);
  /* Checks a config: the keys the model code needs, their types and ranges. `what` names the file. */
  int (*check_config)(const struct mpk_arch *a, const char *what, const json_t *config);
  /* Checks every tensor the model code takes against the (checked) config. */
  int (*check_tensors)(const struct mpk_arch *a, const char *what, const json_t *config, const mpk_shapes *s);
  /* The options of the shared dense checks (mpk__dense_*), for the rows that use them; else NULL. */
  const struct mpk_dense_opts *dense;
} mpk_arch;

/* The rows (arch_<family>.c). */
extern const mpk_arch mpk__arch_llama;
extern const mpk_arch mpk__arch_mistral;
extern const mpk_arch mpk__arch_qwen2;
extern const mpk_arch mpk__arch_qwen3;
extern const mpk_arch mpk__arch_gemma3;
extern const mpk_arch mpk__arch_phi3;
extern const mpk_arch mpk__arch_bert;

/* An importer's config step: a->prepare_config (if any), then a->check_config. */
int mpk__arch_config(const mpk_arch *a, const char *what, json_t *config);

/* The Llama-style decoder that llama, mistral, qwen2 and qwen3 share (arch_dense.c, code
 * models/llama): pre-norm blocks of RMSNorm, GQA attention with RoPE, SwiGLU MLP; what differs
 * between those families is data. */
typedef struct mpk_dense_opts {
  const char *family; /* for messages */
  bool qkv_bias;      /* self_attn.{q,k,v}_proj.bias required (Qwen2) */
  bool qk_norm;       /* self_attn.{q,k}_norm.weight of head_dim required (Qwen3) */
  /* The config key of a sliding attention window ("sliding_window"), NULL when the family has none;
   * `window_switch` (e.g. Qwen2's "use_sliding_window") must be true for it to apply, NULL: always. */
  const char *window_key, *window_switch;
} mpk_dense_opts;
/* The hooks of those rows; each reads its options from a->dense. */
int mpk__dense_check_config(const mpk_arch *a, const char *what, const json_t *c);
int mpk__dense_check_tensors(const mpk_arch *a, const char *what, const json_t *c, const mpk_shapes *s);
/* servd's attention has no window: a window W smaller than the context C (max_position_embeddings,
 * 2048 when absent, the engine's default) is refused by the check; at pack time this caps
 * max_position_embeddings at W instead (exact: no sequence ever reaches W + 1 tokens), with a line on
 * stderr. */
int mpk__dense_cap_window(const mpk_arch *a, const char *what, json_t *c);

/* What every decoder row (dense and Gemma 3) reads and checks alike. */
typedef struct mpk_decoder_dims {
  int64_t hidden, inter, layers, heads, kv_heads, head_dim, vocab; /* vocab -1: absent */
} mpk_decoder_dims;
/* The integer keys hidden_size, intermediate_size, num_hidden_layers, num_attention_heads (required),
 * num_key_value_heads (default heads), head_dim (default head_dim_dflt, 0: hidden / heads) and
 * vocab_size. */
int mpk__decoder_dims_read(const char *what, const json_t *c, int64_t head_dim_dflt, mpk_decoder_dims *d);
/* Refuses a zero head_dim, heads not a multiple of kv_heads and heads x head_dim over 2^31. */
int mpk__decoder_dims_check(const char *what, const mpk_decoder_dims *d);
/* "tie_word_embeddings" absent, null or a boolean. */
int mpk__cfg_tie(const char *what, const json_t *c);
/* "rope_scaling" absent, null, {} or {"rope_type" (or "type"): `type`, "factor": f} with a finite f
 * >= min_factor (> when min_strict); else SERVD_EUNSUPPORTED ending "expected null or `expected`". */
int mpk__cfg_rope_scaling(const char *what, const json_t *c, const char *type, double min_factor, bool min_strict,
                          const char *expected);
/* arch_rope.c: rope_scaling's type ("rope_type", else "type"; "" when not a string), NULL when there
 * is none (absent, null or {}). */
const char *mpk__rope_type(const json_t *c);
/* YaRN's keys (models/llama/rope_scaling.py): factor >= 1, original_max_position_embeddings,
 * beta_fast, beta_slow, attention_factor, mscale, mscale_all_dim, truncate. */
int mpk__cfg_rope_yarn(const char *what, const json_t *c);
/* LongRoPE's: short_factor and long_factor of head_dim/2 positive numbers, attention_factor, factor,
 * original_max_position_embeddings (top level, as transformers reads it, or in rope_scaling). */
int mpk__cfg_rope_longrope(const char *what, const json_t *c, int64_t head_dim);
/* A tensor of every layer: `name` after "model.layers.N.", of shape (rows,) or (rows, cols); when not
 * `on` (an option the family lacks) it must be absent, since the code would ignore it. */
typedef struct mpk_layer_tensor {
  const char *name;
  int ndim;
  int64_t rows, cols;
  bool on;
} mpk_layer_tensor;
/* The tensors of a decoder with d's dimensions: model.embed_tokens.weight (V, H), model.norm.weight
 * (H,), lm_head.weight (V, H) unless tied, t[0..n) of each layer and no layer d->layers. V is
 * d->vocab, or the embedding's rows when absent. `family` names it in messages. */
int mpk__decoder_check_tensors(const char *what, const json_t *c, const mpk_shapes *s, const mpk_decoder_dims *d,
                               const mpk_layer_tensor *t, size_t n, const char *family);
/* llama.cpp's names of the embedding, final norm and head (gguf-py tensor_mapping.py), which every
 * GGUF row so far shares. */
extern const mpk_name_pair mpk__gguf_llama_global[];
/* Config readers for GGUF rows: Llama's reader (arch_llama.c), generic over the metadata prefix. */
int mpk__llama_gguf_config(const struct mpk_arch *a, const char *what, const mpk_gguf *g, const char *gguf_arch,
                           bool tied, uint64_t n_vocab, json_t **out);

/* Lookups; on failure SERVD_EUNSUPPORTED with a message naming `what`, the field, the value and the
 * known architectures. */
const mpk_arch *mpk__arch_by_name(const char *name); /* NULL when unknown (no message) */
int mpk__arch_for_hf(const char *what, const json_t *config, const mpk_arch **out);
int mpk__arch_for_gguf(const char *what, const char *arch, size_t len, const mpk_arch **out);
/* "llama (model_type llama, mistral; GGUF llama), ..." for messages. */
void mpk__arch_known(char *buf, size_t cap);

/* Canonical name of source tensor `src` (written to out, truncated to cap). */
void mpk__arch_map_name(const mpk_name_map *m, const char *src, char *out, size_t cap);

void mpk__shapes_sort(mpk_shapes *s);
const mpk_shape_entry *mpk__shapes_find(const mpk_shapes *s, const char *name); /* NULL when absent */
/* Tensor `name` must exist with exactly `ndim` dimensions `...` (int64_t); SERVD_EFORMAT naming
 * what, the tensor, its shape and the expected one. */
int mpk__shapes_expect(const char *what, const mpk_shapes *s, const char *name, int ndim, ...);

/* Config readers for the rows; messages name `what` and the key. */
/* A positive integer at most 2^31 (required) or *out = dflt when absent or null (required false). */
int mpk__cfg_int(const char *what, const json_t *c, const char *key, bool required, int64_t dflt, int64_t *out);
/* A finite number > 0 (or >= 0 when zero_ok), *out = dflt when absent or null. */
int mpk__cfg_pos(const char *what, const json_t *c, const char *key, bool zero_ok, double dflt, double *out);

/* The code folder of `a` when no --code or SERVD_MODEL_CODE says otherwise: models/<a->code>
 * under <d>/share/servd/ for the executable's folder d or one of its three parents (install
 * layout <prefix>/bin + <prefix>/share/servd/models; the build tree has the same share/ link).
 * Writes the path to out; SERVD_EINVAL naming the places searched when none exists. */
int mpk__code_dir_for(const mpk_arch *a, char *out, size_t cap);

#endif
