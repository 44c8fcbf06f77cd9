/* Importers: Hugging Face model folders and GGUF files into packages; generic packages from a code
 * folder and safetensors files; synthetic Llama models.
 *
 * Tensors are written under Hugging Face names (model.embed_tokens.weight,
 * model.layers.N.self_attn.q_proj.weight, ..., model.norm.weight, lm_head.weight) whatever the
 * source; the manifest's rope_layout says how Q/K rows are ordered: "half" for Hugging Face
 * weights, "interleaved" for GGUF (whose converter permutes Q and K rows).
 */
#ifndef MPK_IMPORT_H
#define MPK_IMPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "servd/status.h"
#include "servd/tensor.h"
#include "mpk/writer.h"

/* Called after each tensor (and periodically inside large ones) with bytes done and the total. */
typedef void (*mpk_progress_fn)(void *ctx, uint64_t done, uint64_t total);

typedef struct mpk_import_options {
  const char *name;          /* package name; NULL: derived from the source */
  const char *model_version; /* NULL: "1" */
  const char *code_dir; /* NULL: $SERVD_MODEL_CODE, else the architecture's models/<family> found from the executable */
  const char *entry_point; /* NULL: the architecture's ("llama.model:LlamaModel" for llama) */
  /* Target of tensors that have no native servd dtype (GGUF Q5_0 Q5_1 Q4_K Q5_K Q6_K, HF F64...).
   * Also applied to every 2-D weight of a Hugging Face import when convert_all is set. */
  servd_dtype dtype;
  bool convert_all;
  mpk_progress_fn progress;
  void *progress_ctx;
} mpk_import_options;

SERVD_API void mpk_import_options_init(mpk_import_options *o); /* dtype q8_0, the rest NULL/false */

/* Packs the source into `out_path` (written atomically). */
SERVD_API int mpk_pack_hf(const char *dir, const char *out_path, const mpk_import_options *o);
SERVD_API int mpk_pack_gguf(const char *gguf_path, const char *out_path, const mpk_import_options *o);

/* A generic (non-LLM) package, kind "generic": o->code_dir (required) embedded under
 * code/<basename>/, o->entry_point (required) "pkg.module:Callable" whose module is a file of the code
 * folder (pkg is the folder's basename), every tensor of the safetensors files `weights` (F32, F16,
 * BF16 kept as they are; other dtypes and a name in two files are errors), the JSON object at
 * config_path (may be NULL: {}) as the manifest's "config". o->name defaults to the folder's
 * basename, o->model_version to "1"; dtype and convert_all are not used. Written atomically. */
SERVD_API int mpk_pack_generic(const char *const *weights, size_t n_weights, const char *config_path,
                               const char *out_path, const mpk_import_options *o);

/* Embeds the files of `dir` under code/<basename of dir>/ (skips __pycache__ and *.pyc). */
SERVD_API int mpk_add_code_dir(mpk_writer *w, const char *dir);
/* The Llama code folder the importers use by default: $SERVD_MODEL_CODE, else
 * <d>/share/servd/models/llama for the executable's folder d or one of its 3 parents (installs and
 * the build tree); NULL when none exists. Borrowed, valid for the process's life. */
SERVD_API const char *mpk_default_code_dir(void);

/* Synthetic Llama ("tiny", "small-1b", "200mb"): random weights from `seed`. hf_dir (may be NULL)
 * receives config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
 * generation_config.json; pkg_path (may be NULL) the package. dtype: f32, f16 or bf16 (norms
 * are f32). */
SERVD_API int mpk_synth(const char *config_name, uint64_t seed, servd_dtype dtype, const char *hf_dir,
                        const char *pkg_path, const mpk_import_options *o);
SERVD_API const char *mpk_synth_configs(void); /* "tiny, small-1b, 200mb" */

#endif
