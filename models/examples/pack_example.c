/* servd-example-pack: builds the example generic packages with deterministic weights.
 *
 *   servd-example-pack mlp_classifier OUT.mpk [--seed N]
 *   servd-example-pack deep_tiny OUT.mpk [--seed N]
 *
 * The code folder models/examples/<model>/ goes into the package as code/<model>/ (the package's
 * import root is code/), the weights are generated here from a seeded splitmix64 stream per tensor
 * (uniform in +-1/sqrt(fan_in); norm weights 1 +- 0.1), so every build gets the same bytes.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpk/writer.h"

#ifndef EXAMPLES_DIR
#define EXAMPLES_DIR "models/examples"
#endif

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t name_hash(const char *s) { /* FNV-1a */
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
  return h;
}

/* f32 (rows, cols): uniform in center +- scale. */
static int add_weight(mpk_writer *w, uint64_t seed, const char *name, int64_t rows, int64_t cols, float center,
                      float scale) {
  int64_t shape[2] = {rows, cols};
  int ndim = cols > 0 ? 2 : 1;
  int64_t n = rows * (cols > 0 ? cols : 1);
  float *v = malloc(sizeof(float) * (size_t)n);
  if (!v) return servd_fail(SERVD_ENOMEM, "example weights");
  uint64_t s = seed ^ name_hash(name);
  for (int64_t i = 0; i < n; i++) {
    double u = (double)(splitmix64(&s) >> 11) / 9007199254740992.0; /* [0, 1) */
    v[i] = center + scale * (float)(2.0 * u - 1.0);
  }
  int rc = mpk_writer_add_tensor(w, name, SERVD_F32, ndim, shape, v, sizeof(float) * (size_t)n);
  free(v);
  return rc;
}

/* The manifest's "inputs" and "outputs": what predict takes and gives (the model's docstring), as
 * KServe v2 metadata lists tensors; -1 is the batch size, which any call may choose. */
static json_t *tensor_spec(const char *name, const char *datatype, int64_t d1) {
  return d1 > 0 ? json_pack("{s:s,s:s,s:[i,I]}", "name", name, "datatype", datatype, "shape", -1, (json_int_t)d1)
                : json_pack("{s:s,s:s,s:[i]}", "name", name, "datatype", datatype, "shape", -1);
}

static int set_signature(mpk_writer *w, json_t *inputs, json_t *outputs) {
  int rc = mpk_writer_set(w, "inputs", inputs);
  return rc ? rc : mpk_writer_set(w, "outputs", outputs);
}

static int add_code(mpk_writer *w, const char *model) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/%s", EXAMPLES_DIR, model);
  DIR *d = opendir(dir);
  if (!d) return servd_fail(SERVD_EIO, "%s: cannot open the code folder", dir);
  int rc = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir(d))) {
    size_t len = strlen(e->d_name);
    if (len < 4 || strcmp(e->d_name + len - 3, ".py")) continue;
    char path[2048], entry[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    snprintf(entry, sizeof entry, "code/%s/%s", model, e->d_name);
    FILE *f = fopen(path, "rb");
    if (!f) {
      rc = servd_fail(SERVD_EIO, "%s: cannot read", path);
      break;
    }
    char *buf = malloc(1 << 20);
    size_t n = buf ? fread(buf, 1, 1 << 20, f) : 0;
    fclose(f);
    rc = buf ? mpk_writer_add_file(w, entry, buf, n) : servd_fail(SERVD_ENOMEM, "%s", path);
    free(buf);
  }
  closedir(d);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s mlp_classifier|deep_tiny OUT.mpk [--seed N]\n", argv[0]);
    return 2;
  }
  const char *model = argv[1], *out = argv[2];
  uint64_t seed = 1234;
  if (argc == 5 && !strcmp(argv[3], "--seed")) seed = strtoull(argv[4], NULL, 10);
  mpk_writer *w = NULL;
  int rc = mpk_writer_create(out, &w);
  if (rc == 0 && !strcmp(model, "mlp_classifier")) {
    const int d_in = 64, hidden = 256, n_classes = 10;
    json_t *labels = json_array();
    for (int i = 0; i < n_classes; i++) json_array_append_new(labels, json_sprintf("class_%d", i));
    rc = mpk_writer_set(w, "name", json_string("mlp-classifier"));
    if (!rc) rc = mpk_writer_set(w, "model_version", json_string("1"));
    if (!rc) rc = mpk_writer_set(w, "kind", json_string("generic"));
    if (!rc) rc = mpk_writer_set(w, "entry_point", json_string("mlp_classifier.model:MLPClassifier"));
    if (!rc)
      rc = mpk_writer_set(w, "config",
                          json_pack("{s:i,s:i,s:i,s:f,s:o}", "d_in", d_in, "hidden", hidden, "n_classes", n_classes,
                                    "eps", 1e-5, "labels", labels));
    if (!rc)
      rc = set_signature(w, json_pack("[o]", tensor_spec("x", "FP32", d_in)),
                         json_pack("[o,o]", tensor_spec("probs", "FP32", n_classes), tensor_spec("label", "INT32", 0)));
    if (!rc) rc = add_weight(w, seed, "norm.weight", d_in, 0, 1.0f, 0.1f);
    if (!rc) rc = add_weight(w, seed, "gate.weight", hidden, d_in, 0.0f, 1.0f / 8.0f);
    if (!rc) rc = add_weight(w, seed, "up.weight", hidden, d_in, 0.0f, 1.0f / 8.0f);
    if (!rc) rc = add_weight(w, seed, "out.weight", n_classes, hidden, 0.0f, 1.0f / 16.0f);
  } else if (rc == 0 && !strcmp(model, "deep_tiny")) {
    const int d = 32, f = 64, n_layers = 16;
    rc = mpk_writer_set(w, "name", json_string("deep-tiny"));
    if (!rc) rc = mpk_writer_set(w, "model_version", json_string("1"));
    if (!rc) rc = mpk_writer_set(w, "kind", json_string("generic"));
    if (!rc) rc = mpk_writer_set(w, "entry_point", json_string("deep_tiny.model:DeepTiny"));
    if (!rc)
      rc = mpk_writer_set(w, "config",
                          json_pack("{s:i,s:i,s:i,s:f}", "d", d, "f", f, "n_layers", n_layers, "eps", 1e-5));
    if (!rc)
      rc = set_signature(w, json_pack("[o]", tensor_spec("x", "FP32", d)),
                         json_pack("[o]", tensor_spec("y", "FP32", d)));
    for (int i = 0; rc == 0 && i < n_layers; i++) {
      char name[64];
      snprintf(name, sizeof name, "layers.%d.norm", i);
      rc = add_weight(w, seed, name, d, 0, 1.0f, 0.1f);
      snprintf(name, sizeof name, "layers.%d.gate", i);
      if (!rc) rc = add_weight(w, seed, name, f, d, 0.0f, 0.17677669f); /* 1/sqrt(32) */
      snprintf(name, sizeof name, "layers.%d.up", i);
      if (!rc) rc = add_weight(w, seed, name, f, d, 0.0f, 0.17677669f);
      snprintf(name, sizeof name, "layers.%d.down", i);
      if (!rc) rc = add_weight(w, seed, name, d, f, 0.0f, 0.125f); /* 1/sqrt(64) */
    }
  } else if (rc == 0) {
    rc = servd_fail(SERVD_EINVAL, "unknown example \"%s\" (mlp_classifier or deep_tiny)", model);
  }
  if (rc == 0) rc = add_code(w, model);
  if (rc == 0) rc = mpk_writer_finish(w);
  mpk_writer_destroy(w);
  if (rc < 0) {
    fprintf(stderr, "servd-example-pack: %s\n", servd_last_error());
    return 1;
  }
  return 0;
}
