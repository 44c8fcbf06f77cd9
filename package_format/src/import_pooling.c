/* Embedding pooling of a Hugging Face folder: a sentence-transformers model keeps it in
 * 1_Pooling/config.json (pooling_mode_lasttoken, pooling_mode_mean_tokens, pooling_mode_cls_token);
 * the package's config carries it as "pooling" (last, mean, cls), which servd's embeddings read. */
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
