/* Embedding pooling of a Hugging Face folder: a sentence-transformers model keeps it in
 * 1_Pooling/config.json (pooling_mode_lasttoken, pooling_mode_mean_tokens, pooling_mode_cls_token);
 * the package's config carries it as "pooling" (last, mean, cls), which servd's embeddings read.
 * Its modules.json may end in a sentence_transformers.models.Normalize module (L2 normalization:
 * config "normalize": true) and its sentence_bert_config.json caps the input ("max_seq_length"). */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "import-impl.h"
#include "servd/status.h"

int mpk__hf_pooling(const char *dir, json_t *config) {
  if (json_object_get(config, "pooling")) return 0; /* the config's own choice wins */
  char path[4096];
  snprintf(path, sizeof path, "%s/1_Pooling/config.json", dir);
  struct stat st;
  if (stat(path, &st) != 0) return 0; /* not a sentence-transformers folder: a causal LM's last token */
  json_t *p = NULL;
  int rc = mpk__source_regular(path);
  if (!rc) rc = mpk__load_json_file(path, &p);
  if (rc) return rc;
  static const struct {
    const char *key, *mode;
  } modes[] = {{"pooling_mode_lasttoken", "last"},
               {"pooling_mode_mean_tokens", "mean"},
               {"pooling_mode_cls_token", "cls"}};
  const char *mode = NULL;
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
    if (json_is_true(json_object_get(p, modes[i].key))) {
      if (mode) {
        json_decref(p);
        return servd_fail(SERVD_EFORMAT, "%s: more than one pooling mode is set (%s and %s): servd pools one way", path,
                          mode, modes[i].mode);
      }
      mode = modes[i].mode;
    }
  json_decref(p);
  if (!mode)
    return servd_fail(SERVD_EFORMAT,
                      "%s: no pooling mode servd knows is set (expected pooling_mode_lasttoken, "
                      "pooling_mode_mean_tokens or pooling_mode_cls_token true)",
                      path);
  return json_object_set_new(config, "pooling", json_string(mode)) ? servd_fail(SERVD_ENOMEM, "out of memory") : 0;
}

/* A side file of the folder, when there is one: *out NULL when absent. */
static int side_json(const char *dir, const char *file, json_t **out) {
  char path[4096];
  struct stat st;
  *out = NULL;
  snprintf(path, sizeof path, "%s/%s", dir, file);
  if (stat(path, &st) != 0) return 0;
  int rc = mpk__source_regular(path);
  return rc ? rc : mpk__load_json_file(path, out);
}

int mpk__hf_sentence_modules(const char *dir, json_t *config) {
  json_t *mods = NULL, *sb = NULL;
  int rc = side_json(dir, "modules.json", &mods);
  if (!rc) rc = side_json(dir, "sentence_bert_config.json", &sb);
  if (rc) goto done;
  for (size_t i = 0; i < json_array_size(mods); i++) {
    const char *type = json_string_value(json_object_get(json_array_get(mods, i), "type"));
    if (type && !strcmp(type, "sentence_transformers.models.Normalize") && !json_object_get(config, "normalize") &&
        json_object_set_new(config, "normalize", json_true())) {
      rc = servd_fail(SERVD_ENOMEM, "out of memory");
      goto done;
    }
  }
  json_t *msl = json_object_get(sb, "max_seq_length");
  if (msl && !json_object_get(config, "max_seq_length")) {
    if (!json_is_integer(msl) || json_integer_value(msl) < 1 || json_integer_value(msl) > (1 << 20)) {
      rc = servd_fail(SERVD_EFORMAT, "%s/sentence_bert_config.json: max_seq_length: expected an integer in [1, %d]",
                      dir, 1 << 20);
      goto done;
    }
    if (json_object_set(config, "max_seq_length", msl)) rc = servd_fail(SERVD_ENOMEM, "out of memory");
  }
done:
  json_decref(mods);
  json_decref(sb);
  return rc;
}
