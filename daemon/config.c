#include "config.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "lora_spec.h"
#include "engine/speculate.h"
#include "servd/status.h"

#define MAX_GRAPH_BATCH 4096

void servd_config_init(servd_config *c) {
  memset(c, 0, sizeof(*c));
  c->host = strdup("127.0.0.1");
  c->port = 8000;
  c->grpc_port = -1;
  c->grpc_max_message_bytes = 64u << 20;
  c->tp = 0; /* resolved after parsing: 1, or the number of GPUs */
  c->gpu_memory_fraction = 0.90;
  c->cuda_graphs = true;
  c->prefix_cache = true;
  c->isolation = SERVD_ISOLATION_AUTO; /* in-process unless a package declares native code */
  c->max_step_ms = SERVD_DEFAULT_MAX_STEP_MS;
  c->cuda_graph_max_batch = 64;
  c->step_timeout_s = 120;
  c->load_timeout_s = 300;
  c->interpreters = 1;
  c->max_queue = 256;
  c->access_log = SERVD_ACCESS_LOG_TEXT;
  c->drain_timeout_s = 30;
  c->read_timeout_s = 30;
  c->idle_timeout_s = 60;
  c->max_body_bytes = 8u << 20;
  c->max_header_bytes = 16u << 10;
  c->max_connections = 4096;
  c->max_n = 16;
}

void servd_config_free(servd_config *c) {
  if (!c) return;
  free(c->host);
  free(c->api_key);
  free(c->trusted_keys);
  free(c->tls_cert);
  free(c->tls_key);
  free(c->tls_ca);
  free(c->package_cache);
  free(c->prefix_cache_dir);
  free(c->kv_events_endpoint);
  free(c->kv_events_replay_endpoint);
  free(c->kv_events_topic);
  free(c->otlp_traces_endpoint);
  for (int i = 0; i < c->n_repository; i++) free(c->repository[i]);
  free(c->repository);
  for (int i = 0; i < c->n_models; i++) {
    free(c->models[i].path);
    free(c->models[i].name);
  }
  free(c->models);
  for (int i = 0; i < c->n_loras; i++) free(c->loras[i]);
  free(c->loras);
  memset(c, 0, sizeof(*c));
}

static int set_str(char **dst, const char *v) {
  char *s = strdup(v);
  if (!s) return servd_fail(SERVD_ENOMEM, "config: out of memory");
  free(*dst);
  *dst = s;
  return 0;
}

static int add_repository(servd_config *c, const char *dir) {
  char **r = realloc(c->repository, (size_t)(c->n_repository + 1) * sizeof(char *));
  if (!r) return servd_fail(SERVD_ENOMEM, "config: out of memory");
  c->repository = r;
  if (!(r[c->n_repository] = strdup(dir))) return servd_fail(SERVD_ENOMEM, "config: out of memory");
  c->n_repository++;
  return 0;
}

static int add_lora(servd_config *c, const char *spec) {
  servd_lora_spec parsed;
  int rc = servd_lora_spec_parse(spec, &parsed);
  if (rc) return rc;
  char **l = realloc(c->loras, (size_t)(c->n_loras + 1) * sizeof(char *));
  if (!l) return servd_fail(SERVD_ENOMEM, "config: out of memory");
  c->loras = l;
  if (!(l[c->n_loras] = strdup(spec))) return servd_fail(SERVD_ENOMEM, "config: out of memory");
  c->n_loras++;
  return 0;
}

static servd_model_config *add_model(servd_config *c) {
  servd_model_config *m = realloc(c->models, (size_t)(c->n_models + 1) * sizeof(*m));
  if (!m) return NULL;
  c->models = m;
  memset(&m[c->n_models], 0, sizeof(*m));
  return &m[c->n_models++];
}

/* "PATH[:NAME]": NAME is what follows the last ':' when it holds no '/'. */
static int add_model_spec(servd_config *c, const char *spec) {
  if (!spec[0]) return servd_fail(SERVD_EINVAL, "--model: expected PATH[:NAME], got an empty string");
  servd_model_config *m = add_model(c);
  if (!m) return servd_fail(SERVD_ENOMEM, "config: out of memory");
  const char *colon = strrchr(spec, ':');
  if (colon && !strchr(colon, '/') && colon[1]) {
    m->path = strndup(spec, (size_t)(colon - spec));
    m->name = strdup(colon + 1);
    if (!m->name) return servd_fail(SERVD_ENOMEM, "config: out of memory");
  } else {
    m->path = strdup(spec);
  }
  if (!m->path) return servd_fail(SERVD_ENOMEM, "config: out of memory");
  if (!m->path[0]) return servd_fail(SERVD_EINVAL, "--model '%s': the package path is empty", spec);
  return 0;
}

static int parse_int(const char *what, const char *v, long lo, long hi, int *out) {
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi)
    return servd_fail(SERVD_EINVAL, "%s: expected an integer in [%ld, %ld], got '%s'", what, lo, hi, v);
  *out = (int)x;
  return 0;
}

static int parse_double(const char *what, const char *v, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || end == v || *end || !(x >= lo && x <= hi))
    return servd_fail(SERVD_EINVAL, "%s: expected a number in [%g, %g], got '%s'", what, lo, hi, v);
  *out = x;
  return 0;
}

/* (0, 1]: a fraction of the free device memory. */
static int parse_fraction(const char *what, const char *v, double *out) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || end == v || *end || !(x > 0 && x <= 1))
    return servd_fail(SERVD_EINVAL, "%s: expected a fraction in (0, 1], e.g. 0.9, got '%s'", what, v);
  *out = x;
  return 0;
}

static int parse_on_off(const char *what, const char *v, bool *out) {
  if (strcmp(v, "on") == 0) *out = true;
  else if (strcmp(v, "off") == 0) *out = false;
  else return servd_fail(SERVD_EINVAL, "%s: expected on or off, got '%s'", what, v);
  return 0;
}

static int parse_isolation(const char *what, const char *v, servd_isolation *out) {
  if (strcmp(v, "none") == 0) *out = SERVD_ISOLATION_NONE;
  else if (strcmp(v, "process") == 0) *out = SERVD_ISOLATION_PROCESS;
  else return servd_fail(SERVD_EINVAL, "%s: expected none or process, got '%s'", what, v);
  return 0;
}

static int parse_access_log(const char *what, const char *v, int *out) {
  if (strcmp(v, "text") == 0) *out = SERVD_ACCESS_LOG_TEXT;
  else if (strcmp(v, "json") == 0) *out = SERVD_ACCESS_LOG_JSON;
  else if (strcmp(v, "off") == 0) *out = SERVD_ACCESS_LOG_OFF;
  else return servd_fail(SERVD_EINVAL, "%s: expected text, json or off, got '%s'", what, v);
  return 0;
}

/* ---- JSON file -------------------------------------------------------------------------------- */

typedef struct jctx {
  const char *file;
} jctx;

static int j_int(jctx *x, json_t *obj, const char *key, long lo, long hi, int *out) {
  json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
    return servd_fail(SERVD_EINVAL, "config %s: '%s' must be an integer in [%ld, %ld]", x->file, key, lo, hi);
  *out = (int)json_integer_value(v);
  return 0;
}

static int j_num(jctx *x, json_t *obj, const char *key, double lo, double hi, double *out) {
  json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_number(v) || json_number_value(v) < lo || json_number_value(v) > hi)
    return servd_fail(SERVD_EINVAL, "config %s: '%s' must be a number in [%g, %g]", x->file, key, lo, hi);
  *out = json_number_value(v);
  return 0;
}

static int j_str(jctx *x, json_t *obj, const char *key, char **out) {
  json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_string(v)) return servd_fail(SERVD_EINVAL, "config %s: '%s' must be a string", x->file, key);
  return set_str(out, json_string_value(v));
}

static int j_fraction(jctx *x, json_t *obj, const char *key, double *out) {
  json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_number(v) || !(json_number_value(v) > 0 && json_number_value(v) <= 1))
    return servd_fail(SERVD_EINVAL, "config %s: '%s' must be a fraction in (0, 1], e.g. 0.9", x->file, key);
  *out = json_number_value(v);
  return 0;
}

/* true/false, or "on"/"off" as on the command line. */
static int parse_speculative(const char *where, const char *v, int *out) {
  int mode = servd_spec_mode_parse(v);
  if (mode < 0) return servd_fail(SERVD_EINVAL, "%s must be auto, off, ngram or suffix, got '%s'", where, v ? v : "");
  *out = mode;
  return 0;
}

static int j_speculative(jctx *x, json_t *obj, int *out) {
  json_t *v = json_object_get(obj, "speculative");
  if (!v || json_is_null(v)) return 0;
  char where[600];
  snprintf(where, sizeof where, "config %s: 'speculative'", x->file);
  return parse_speculative(where, json_is_string(v) ? json_string_value(v) : NULL, out);
}

/* kv_cache_dtype: a dtype name; *out = 1 + the dtype. */
static int parse_kv_dtype(const char *where, const char *v, int *out) {
  servd_dtype t;
  if (servd_kv_dtype_parse(v, &t) != 0) {
    char msg[200];
    snprintf(msg, sizeof msg, "%s", servd_last_error());
    return servd_fail(SERVD_EINVAL, "%s: %s", where, msg);
  }
  *out = 1 + (int)t;
  return 0;
}

static int j_kv_dtype(jctx *x, json_t *obj, const char *at, int *out) {
  json_t *v = json_object_get(obj, "kv_cache_dtype");
  if (!v || json_is_null(v)) return 0;
  char where[600];
  snprintf(where, sizeof where, "config %s: %skv_cache_dtype", x->file, at);
  return parse_kv_dtype(where, json_is_string(v) ? json_string_value(v) : NULL, out);
}

static int j_on_off(jctx *x, json_t *obj, const char *key, bool *out) {
  json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) return 0;
  if (json_is_boolean(v)) {
    *out = json_is_true(v);
    return 0;
  }
  if (json_is_string(v) && (strcmp(json_string_value(v), "on") == 0 || strcmp(json_string_value(v), "off") == 0)) {
    *out = strcmp(json_string_value(v), "on") == 0;
    return 0;
  }
  return servd_fail(SERVD_EINVAL, "config %s: '%s' must be true, false, \"on\" or \"off\"", x->file, key);
}

static int check_keys(jctx *x, json_t *obj, const char *where, const char *const *allowed) {
  const char *key;
  json_t *v;
  json_object_foreach(obj, key, v) {
    bool ok = false;
    for (const char *const *a = allowed; *a && !ok; a++) ok = strcmp(*a, key) == 0;
    if (!ok) return servd_fail(SERVD_EINVAL, "config %s: unknown key '%s' in %s", x->file, key, where);
  }
  return 0;
}

static int load_model_entry(jctx *x, servd_config *c, json_t *e, size_t i) {
  static const char *const keys[] = {"path",
                                     "name",
                                     "interpreters",
                                     "tp",
                                     "max_queue",
                                     "max_batch_tokens",
                                     "max_seqs",
                                     "kv_blocks",
                                     "block_size",
                                     "max_batch_size",
                                     "max_batch_delay_ms",
                                     "isolation",
                                     "kv_cache_dtype",
                                     NULL};
  char where[32];
  snprintf(where, sizeof where, "models[%zu]", i);
  if (!json_is_object(e)) return servd_fail(SERVD_EINVAL, "config %s: %s must be an object", x->file, where);
  int rc = check_keys(x, e, where, keys);
  if (rc) return rc;
  json_t *p = json_object_get(e, "path");
  if (!json_is_string(p) || !json_string_length(p))
    return servd_fail(SERVD_EINVAL, "config %s: %s.path must be a package, GGUF file or Hugging Face folder path",
                      x->file, where);
  servd_model_config *m = add_model(c);
  if (!m) return servd_fail(SERVD_ENOMEM, "config: out of memory");
  if ((rc = j_str(x, e, "path", &m->path)) || (rc = j_str(x, e, "name", &m->name)) ||
      (rc = j_int(x, e, "interpreters", 1, 15, &m->interpreters)) || (rc = j_int(x, e, "tp", 1, 64, &m->tp)) ||
      (rc = j_int(x, e, "max_queue", 1, 1 << 20, &m->max_queue)) ||
      (rc = j_int(x, e, "max_batch_tokens", 1, 1 << 20, &m->max_batch_tokens)) ||
      (rc = j_int(x, e, "max_seqs", 1, 4096, &m->max_seqs)) ||
      (rc = j_int(x, e, "kv_blocks", 1, 1 << 24, &m->kv_blocks)) ||
      (rc = j_int(x, e, "block_size", 1, 1024, &m->block_size)) ||
      (rc = j_int(x, e, "max_batch_size", 1, 4096, &m->max_batch_size)) ||
      (rc = j_int(x, e, "max_batch_delay_ms", 0, 60000, &m->max_batch_delay_ms)))
    return rc;
  char at[48];
  snprintf(at, sizeof at, "%s.", where);
  if ((rc = j_kv_dtype(x, e, at, &m->kv_cache_dtype))) return rc;
  json_t *iso = json_object_get(e, "isolation");
  if (iso && !json_is_null(iso)) {
    char what[64];
    snprintf(what, sizeof what, "config %s.isolation", where);
    servd_isolation v;
    if (!json_is_string(iso)) return servd_fail(SERVD_EINVAL, "%s: expected \"none\" or \"process\"", what);
    if ((rc = parse_isolation(what, json_string_value(iso), &v))) return rc;
    m->isolation = 1 + (int)v;
  }
  return 0;
}

int servd_config_load_file(servd_config *c, const char *path) {
  static const char *const keys[] = {"host",
                                     "port",
                                     "threads",
                                     "activation_levels",
                                     "gpus",
                                     "tp",
                                     "interpreters",
                                     "max_queue",
                                     "max_batch_tokens",
                                     "max_seqs",
                                     "kv_blocks",
                                     "block_size",
                                     "api_key",
                                     "access_log",
                                     "drain_timeout",
                                     "request_timeout",
                                     "read_timeout",
                                     "idle_timeout",
                                     "max_body_bytes",
                                     "max_header_bytes",
                                     "max_connections",
                                     "max_n",
                                     "model_repository",
                                     "models",
                                     "gpu_memory_fraction",
                                     "cuda_graphs",
                                     "cuda_graph_max_batch",
                                     "step_timeout",
                                     "metrics_public",
                                     "verify_weights",
                                     "trusted_keys",
                                     "load_timeout",
                                     "prefix_cache",
                                     "max_step_ms",
                                     "speculative",
                                     "num_speculative_tokens",
                                     "max_model_len",
                                     "package_cache",
                                     "grpc_port",
                                     "grpc_max_message_bytes",
                                     "tls_cert",
                                     "tls_key",
                                     "tls_ca",
                                     "kv_cache_dtype",
                                     "prefix_cache_dir",
                                     "prefix_cache_dir_mb",
                                     NULL};
  json_error_t err;
  json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
  if (!root)
    return servd_fail(SERVD_EFORMAT, "config %s: %s (line %d, column %d)", path, err.text, err.line, err.column);
  jctx x = {path};
  int rc = 0;
  double body = (double)c->max_body_bytes, hdr = (double)c->max_header_bytes;
  double grpc_msg = (double)c->grpc_max_message_bytes;
  if (!json_is_object(root)) {
    rc = servd_fail(SERVD_EINVAL, "config %s: the top level must be an object", path);
    goto out;
  }
  if ((rc = check_keys(&x, root, "the top level", keys))) goto out;
  if ((rc = j_str(&x, root, "host", &c->host)) || (rc = j_int(&x, root, "port", 0, 65535, &c->port)) ||
      (rc = j_int(&x, root, "threads", 0, 4096, &c->threads)) || (rc = j_int(&x, root, "gpus", 0, 1024, &c->gpus)) ||
      (rc = j_int(&x, root, "activation_levels", 1, 2, &c->activation_levels)) ||
      (rc = j_int(&x, root, "tp", 1, 64, &c->tp)) || (rc = j_int(&x, root, "interpreters", 1, 15, &c->interpreters)) ||
      (rc = j_int(&x, root, "max_queue", 1, 1 << 20, &c->max_queue)) ||
      (rc = j_int(&x, root, "max_batch_tokens", 1, 1 << 20, &c->max_batch_tokens)) ||
      (rc = j_int(&x, root, "max_seqs", 1, 4096, &c->max_seqs)) ||
      (rc = j_int(&x, root, "kv_blocks", 1, 1 << 24, &c->kv_blocks)) ||
      (rc = j_int(&x, root, "block_size", 1, 1024, &c->block_size)) || (rc = j_str(&x, root, "api_key", &c->api_key)) ||
      (rc = j_on_off(&x, root, "metrics_public", &c->metrics_public)) ||
      (rc = j_on_off(&x, root, "verify_weights", &c->verify_weights)) ||
      (rc = j_on_off(&x, root, "prefix_cache", &c->prefix_cache)) ||
      (rc = j_int(&x, root, "max_step_ms", 0, 60000, &c->max_step_ms)) ||
      (rc = j_speculative(&x, root, &c->speculative)) ||
      (rc = j_int(&x, root, "num_speculative_tokens", 1, SERVD_SPEC_MAX_DRAFT, &c->num_speculative_tokens)) ||
      (rc = j_int(&x, root, "max_model_len", 0, 1 << 24, &c->max_model_len)) ||
      (rc = j_str(&x, root, "trusted_keys", &c->trusted_keys)) || (rc = j_str(&x, root, "tls_cert", &c->tls_cert)) ||
      (rc = j_str(&x, root, "tls_key", &c->tls_key)) || (rc = j_str(&x, root, "tls_ca", &c->tls_ca)) ||
      (rc = j_str(&x, root, "package_cache", &c->package_cache)) ||
      (rc = j_num(&x, root, "drain_timeout", 0, 86400, &c->drain_timeout_s)) ||
      (rc = j_num(&x, root, "request_timeout", 0, 86400, &c->request_timeout_s)) ||
      (rc = j_num(&x, root, "step_timeout", 0, 86400, &c->step_timeout_s)) ||
      (rc = j_num(&x, root, "load_timeout", 0, 86400, &c->load_timeout_s)) ||
      (rc = j_num(&x, root, "read_timeout", 0.001, 3600, &c->read_timeout_s)) ||
      (rc = j_num(&x, root, "idle_timeout", 0.001, 86400, &c->idle_timeout_s)) ||
      (rc = j_num(&x, root, "max_body_bytes", 1024, 1ull << 32, &body)) ||
      (rc = j_num(&x, root, "max_header_bytes", 1024, 1 << 20, &hdr)) ||
      (rc = j_int(&x, root, "max_connections", 1, 1 << 20, &c->max_connections)) ||
      (rc = j_int(&x, root, "max_n", 1, 256, &c->max_n)) ||
      (rc = j_fraction(&x, root, "gpu_memory_fraction", &c->gpu_memory_fraction)) ||
      (rc = j_on_off(&x, root, "cuda_graphs", &c->cuda_graphs)) ||
      (rc = j_int(&x, root, "cuda_graph_max_batch", 1, MAX_GRAPH_BATCH, &c->cuda_graph_max_batch)) ||
      (rc = j_int(&x, root, "grpc_port", -1, 65535, &c->grpc_port)) ||
      (rc = j_num(&x, root, "grpc_max_message_bytes", 1024, 4294967295.0, &grpc_msg)) ||
      (rc = j_kv_dtype(&x, root, "", &c->kv_cache_dtype)) ||
      (rc = j_str(&x, root, "prefix_cache_dir", &c->prefix_cache_dir)) ||
      (rc = j_int(&x, root, "prefix_cache_dir_mb", 1, 1 << 24, &c->prefix_cache_dir_mb)))
    goto out;
  c->grpc_max_message_bytes = (size_t)grpc_msg;
  c->max_body_bytes = (size_t)body;
  c->max_header_bytes = (size_t)hdr;
  json_t *al = json_object_get(root, "access_log");
  if (al && !json_is_null(al)) {
    if (!json_is_string(al)) {
      rc = servd_fail(SERVD_EINVAL, "config %s: 'access_log' must be \"text\", \"json\" or \"off\"", path);
      goto out;
    }
    if ((rc = parse_access_log("config access_log", json_string_value(al), &c->access_log))) goto out;
  }
  json_t *repo = json_object_get(root, "model_repository");
  if (repo && !json_is_null(repo)) {
    if (json_is_string(repo)) {
      if ((rc = add_repository(c, json_string_value(repo)))) goto out;
    } else if (json_is_array(repo)) {
      for (size_t i = 0; i < json_array_size(repo); i++) {
        json_t *d = json_array_get(repo, i);
        if (!json_is_string(d)) {
          rc = servd_fail(SERVD_EINVAL, "config %s: model_repository[%zu] must be a directory path", path, i);
          goto out;
        }
        if ((rc = add_repository(c, json_string_value(d)))) goto out;
      }
    } else {
      rc = servd_fail(SERVD_EINVAL, "config %s: 'model_repository' must be a directory or a list of them", path);
      goto out;
    }
  }
  json_t *models = json_object_get(root, "models");
  if (models && !json_is_null(models)) {
    if (!json_is_array(models)) {
      rc = servd_fail(SERVD_EINVAL, "config %s: 'models' must be a list", path);
      goto out;
    }
    for (size_t i = 0; i < json_array_size(models); i++)
      if ((rc = load_model_entry(&x, c, json_array_get(models, i), i))) goto out;
  }
out:
  json_decref(root);
  return rc;
}

/* ---- flags ------------------------------------------------------------------------------------ */

void servd_config_usage(FILE *f) {
  fputs("usage: servd [serve] [options]\n"
        "       servd generate ...   (run a model from the command line; see servd generate --help)\n"
        "\n"
        "  --model PATH[:NAME]     serve the package at PATH (as NAME); repeat for several models. PATH\n"
        "                          may also be a GGUF file or a Hugging Face folder: packed once into\n"
        "                          the package cache and reused while it is unchanged\n"
        "  --package-cache DIR     where those packages are kept (default $XDG_CACHE_HOME/servd/packages\n"
        "                          or ~/.cache/servd/packages)\n"
        "  --config FILE           JSON config file (flags given on the command line win)\n"
        "  --host ADDR             address to listen on (default 127.0.0.1)\n"
        "  --port N                port (default 8000; 0 picks a free port)\n"
        "  --interpreters N        interpreters per generic model (default 1, at most 15)\n"
        "  --threads N             compute threads (default: all online CPUs)\n"
        "  --activation-levels N   int8 levels of quantized matmuls' activations: 1 (default, ~8 bits)\n"
        "                          or 2 (~15 bits: ~100x closer to float64, ~1.2x decode time)\n"
        "  --gpus N                serve language models on GPUs 0..N-1 (default 0: CPU backend)\n"
        "  --tp N                  tensor-parallel ranks per language model (default 1; with --gpus N:\n"
        "                          N, and it must be N: one rank per GPU)\n"
        "  --gpu-memory-fraction F share of the GPU memory left free by the weights that the KV cache\n"
        "                          takes, in (0, 1] (default 0.9)\n"
        "  --cuda-graphs on|off    run decode steps as CUDA graphs (default on)\n"
        "  --cuda-graph-max-batch B  largest decode batch run as a CUDA graph (default 64)\n"
        "  --max-queue N           waiting requests per model before 429 (default 256)\n"
        "  --max-seqs N            running sequences per language model\n"
        "  --max-batch-tokens N    token budget per scheduler step\n"
        "  --kv-blocks N           KV cache blocks per language model\n"
        "  --kv-cache-dtype T      KV cache dtype of language models: f16, bf16, q8_0 (~1.9x the tokens of\n"
        "                          f16 per byte), q4_0 or f32 (default: the package's, else f16)\n"
        "  --api-key KEY           require 'Authorization: Bearer KEY' (or set SERVD_API_KEY)\n"
        "  --no-prefix-cache       compute every prompt in full (no sharing of common prompt beginnings)\n"
        "  --prefix-cache-dir DIR  also keep the prefix cache's full blocks in files under DIR, found again\n"
        "                          after a restart (CPU models)\n"
        "  --prefix-cache-dir-mb N bound on each model's files in that directory (default 4096)\n"
        "  --max-step-ms MS        target duration of a step carrying decodes: its prefill chunk is cut to\n"
        "                          fit (default 100; 0: the token budget only)\n"
        "  --speculative MODE      speculative decoding: auto (default: drafts from the request's own text and\n"
        "                          recent requests, as many as the step's cost model says pay), off, ngram\n"
        "                          (own text only) or suffix (own text, then recent requests), always drafting\n"
        "  --num-speculative-tokens N  drafts per step and sequence at most (default 8, at most 16)\n"
        "  --lora NAME=PATH[,base=MODEL]  serve the LoRA adapter at PATH (a PEFT folder, GGUF LoRA or package)\n"
        "                          as model NAME on MODEL (default: the only language model); repeatable\n"
        "  --max-loras N           LoRA adapters resident per model (default 4); idle ones beyond are evicted\n"
        "                          least recently used first and read again when asked for\n"
        "  --max-model-len N       cap each language model's context at N tokens (longer prompts: 400\n"
        "                          context_length_exceeded); the KV cache is sized for it\n"
        "  --metrics-public        serve GET /metrics without the API key (Prometheus scrapers)\n"
        "  --verify-weights        check the SHA-256 of the weights at load too (reads the whole model)\n"
        "  --trusted-keys PATH     load only packages signed by one of these Ed25519 public keys (a PEM\n"
        "                          file, or a folder of *.pem files); see modelpkg sign\n"
        "  --access-log FMT        text, json or off (default text, to stderr)\n"
        "  --drain-timeout S       on SIGTERM, let requests finish for S seconds (default 30)\n"
        "  --request-timeout S     default per-request deadline (default none)\n"
        "  --step-timeout S        interrupt a language model's forward step that has not returned after\n"
        "                          S seconds and fail that step's requests (default 120; 0: never)\n"
        "  --isolation MODE        none or process: run each generic model's interpreters in a child\n"
        "                          process of its own, restarted if it crashes (default none)\n"
        "  --load-timeout S        fail a model load whose package import has not finished after S\n"
        "                          seconds (default 300; 0: never)\n"
        "  --model-repository DIR  directory of packages for POST /v2/repository/models/NAME/load\n"
        "  --max-body-bytes N      largest request body (default 8388608)\n"
        "  --grpc-port N           also serve KServe v2 gRPC on port N (default: no gRPC listener;\n"
        "                          0 picks a free port)\n"
        "  --grpc-max-message-bytes N  largest gRPC request message (default 67108864)\n"
        "  --tls-cert FILE         serve HTTPS: PEM certificate chain (with --tls-key; both are\n"
        "                          re-read on SIGHUP)\n"
        "  --tls-key FILE          PEM private key of --tls-cert\n"
        "  --tls-ca FILE           require client certificates signed by these PEM CAs (mutual TLS)\n"
        "  --kv-events-endpoint E  publish the prefix cache's KV-cache events (vLLM's format: ZeroMQ PUB,\n"
        "                          msgpack) on E, e.g. tcp://*:5557 (default: none)\n"
        "  --kv-events-replay-endpoint E  answer replay requests for missed event batches on E (ROUTER)\n"
        "  --otlp-traces-endpoint URL  export a span per language-model request (queue, prefill, decode)\n"
        "                          over OTLP/HTTP protobuf to URL, e.g. http://otel-collector:4318/v1/traces\n"
        "  --idle-unload-seconds N unload a model that has had no request for N seconds; its next request\n"
        "                          loads it again (answered 503 with Retry-After meanwhile; default 0: never)\n"
        "  --kv-events-topic T     topic per model; {model} and {host} ($POD_IP or the host name) are\n"
        "                          replaced (default kv@{host}@{model})\n"
        "  --help, --version\n",
        f);
}

static const char *flag_value(int argc, char **argv, int *i, const char *flag, bool *err) {
  const char *a = argv[*i];
  size_t n = strlen(flag);
  if (a[n] == '=') return a + n + 1;
  if (*i + 1 >= argc) {
    servd_fail(SERVD_EINVAL, "%s: a value is required", flag);
    *err = true;
    return NULL;
  }
  return argv[++*i];
}

static bool flag_is(const char *arg, const char *flag) {
  size_t n = strlen(flag);
  return strncmp(arg, flag, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

/* With GPUs, every tensor-parallel rank has a GPU of its own (NCCL runs one rank per GPU): tp
 * defaults to the number of GPUs and must equal it, server-wide and per model. */
static int resolve_tp(servd_config *c) {
  if (c->gpus == 0) {
    if (c->tp == 0) c->tp = 1;
    return 0;
  }
  if (c->tp != 0 && c->tp != c->gpus)
    return servd_fail(SERVD_EINVAL,
                      "--tp %d with --gpus %d: on GPUs each tensor-parallel rank needs a GPU of its own "
                      "(NCCL runs one rank per GPU), so --tp must equal --gpus; use --tp %d, or --gpus %d if that "
                      "many GPUs are present",
                      c->tp, c->gpus, c->gpus, c->tp);
  for (int i = 0; i < c->n_models; i++)
    if (c->models[i].tp != 0 && c->models[i].tp != c->gpus)
      return servd_fail(SERVD_EINVAL,
                        "model '%s': tp %d with --gpus %d: on GPUs each tensor-parallel rank needs a "
                        "GPU of its own (NCCL runs one rank per GPU), so tp must equal --gpus",
                        c->models[i].name ? c->models[i].name : c->models[i].path, c->models[i].tp, c->gpus);
  c->tp = c->gpus;
  return 0;
}

int servd_config_parse_args(servd_config *c, int argc, char **argv, bool *exit_now) {
  *exit_now = false;
  int rc;
  bool err = false;
  /* The file first, so that flags override it wherever --config appears. */
  for (int i = 1; i < argc; i++) {
    if (flag_is(argv[i], "--config")) {
      const char *v = flag_value(argc, argv, &i, "--config", &err);
      if (err) return SERVD_EINVAL;
      if ((rc = servd_config_load_file(c, v))) return rc;
    }
  }
  const char *env_key = getenv("SERVD_API_KEY");
  if (env_key && env_key[0] && (rc = set_str(&c->api_key, env_key))) return rc;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = NULL;
    double d = 0;
#define VAL(flag) (v = flag_value(argc, argv, &i, flag, &err), err ? SERVD_EINVAL : 0)
    if (strcmp(a, "serve") == 0 && i == 1) continue;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      servd_config_usage(stdout);
      *exit_now = true;
      return 0;
    }
    if (strcmp(a, "--version") == 0) {
      printf("servd 0.1.0\n");
      *exit_now = true;
      return 0;
    }
    if (flag_is(a, "--config")) {
      if ((rc = VAL("--config"))) return rc;
    } else if (flag_is(a, "--model")) {
      if ((rc = VAL("--model")) || (rc = add_model_spec(c, v))) return rc;
    } else if (flag_is(a, "--package-cache")) {
      if ((rc = VAL("--package-cache")) || (rc = set_str(&c->package_cache, v))) return rc;
    } else if (flag_is(a, "--host")) {
      if ((rc = VAL("--host")) || (rc = set_str(&c->host, v))) return rc;
    } else if (flag_is(a, "--port")) {
      if ((rc = VAL("--port")) || (rc = parse_int("--port", v, 0, 65535, &c->port))) return rc;
    } else if (flag_is(a, "--interpreters")) {
      if ((rc = VAL("--interpreters")) || (rc = parse_int("--interpreters", v, 1, 15, &c->interpreters))) return rc;
    } else if (flag_is(a, "--threads")) {
      if ((rc = VAL("--threads")) || (rc = parse_int("--threads", v, 0, 4096, &c->threads))) return rc;
    } else if (flag_is(a, "--activation-levels")) {
      if ((rc = VAL("--activation-levels")) || (rc = parse_int("--activation-levels", v, 1, 2, &c->activation_levels)))
        return rc;
    } else if (flag_is(a, "--gpus")) {
      if ((rc = VAL("--gpus")) || (rc = parse_int("--gpus", v, 0, 1024, &c->gpus))) return rc;
    } else if (flag_is(a, "--tp")) {
      if ((rc = VAL("--tp")) || (rc = parse_int("--tp", v, 1, 64, &c->tp))) return rc;
    } else if (flag_is(a, "--gpu-memory-fraction")) {
      if ((rc = VAL("--gpu-memory-fraction")) ||
          (rc = parse_fraction("--gpu-memory-fraction", v, &c->gpu_memory_fraction)))
        return rc;
    } else if (flag_is(a, "--cuda-graphs")) {
      if ((rc = VAL("--cuda-graphs")) || (rc = parse_on_off("--cuda-graphs", v, &c->cuda_graphs))) return rc;
    } else if (flag_is(a, "--cuda-graph-max-batch")) {
      if ((rc = VAL("--cuda-graph-max-batch")) ||
          (rc = parse_int("--cuda-graph-max-batch", v, 1, MAX_GRAPH_BATCH, &c->cuda_graph_max_batch)))
        return rc;
    } else if (flag_is(a, "--max-queue")) {
      if ((rc = VAL("--max-queue")) || (rc = parse_int("--max-queue", v, 1, 1 << 20, &c->max_queue))) return rc;
    } else if (flag_is(a, "--max-seqs")) {
      if ((rc = VAL("--max-seqs")) || (rc = parse_int("--max-seqs", v, 1, 4096, &c->max_seqs))) return rc;
    } else if (flag_is(a, "--max-batch-tokens")) {
      if ((rc = VAL("--max-batch-tokens")) ||
          (rc = parse_int("--max-batch-tokens", v, 1, 1 << 20, &c->max_batch_tokens)))
        return rc;
    } else if (flag_is(a, "--kv-blocks")) {
      if ((rc = VAL("--kv-blocks")) || (rc = parse_int("--kv-blocks", v, 1, 1 << 24, &c->kv_blocks))) return rc;
    } else if (flag_is(a, "--prefix-cache-dir")) {
      if ((rc = VAL("--prefix-cache-dir")) || (rc = set_str(&c->prefix_cache_dir, v))) return rc;
    } else if (flag_is(a, "--prefix-cache-dir-mb")) {
      if ((rc = VAL("--prefix-cache-dir-mb")) ||
          (rc = parse_int("--prefix-cache-dir-mb", v, 1, 1 << 24, &c->prefix_cache_dir_mb)))
        return rc;
    } else if (flag_is(a, "--kv-cache-dtype")) {
      if ((rc = VAL("--kv-cache-dtype")) || (rc = parse_kv_dtype("--kv-cache-dtype", v, &c->kv_cache_dtype))) return rc;
    } else if (flag_is(a, "--max-step-ms")) {
      if ((rc = VAL("--max-step-ms")) || (rc = parse_int("--max-step-ms", v, 0, 60000, &c->max_step_ms))) return rc;
    } else if (flag_is(a, "--speculative")) {
      if ((rc = VAL("--speculative")) || (rc = parse_speculative("--speculative", v, &c->speculative))) return rc;
    } else if (flag_is(a, "--num-speculative-tokens")) {
      if ((rc = VAL("--num-speculative-tokens")) ||
          (rc = parse_int("--num-speculative-tokens", v, 1, SERVD_SPEC_MAX_DRAFT, &c->num_speculative_tokens)))
        return rc;
    } else if (flag_is(a, "--lora")) {
      if ((rc = VAL("--lora")) || (rc = add_lora(c, v))) return rc;
    } else if (flag_is(a, "--max-loras")) {
      if ((rc = VAL("--max-loras")) || (rc = parse_int("--max-loras", v, 1, 1024, &c->max_loras))) return rc;
    } else if (flag_is(a, "--max-model-len")) {
      if ((rc = VAL("--max-model-len")) || (rc = parse_int("--max-model-len", v, 1, 1 << 24, &c->max_model_len)))
        return rc;
    } else if (strcmp(a, "--no-prefix-cache") == 0) {
      c->prefix_cache = false;
    } else if (strcmp(a, "--metrics-public") == 0) {
      c->metrics_public = true;
    } else if (strcmp(a, "--verify-weights") == 0) {
      c->verify_weights = true;
    } else if (flag_is(a, "--trusted-keys")) {
      if ((rc = VAL("--trusted-keys")) || (rc = set_str(&c->trusted_keys, v))) return rc;
    } else if (flag_is(a, "--api-key")) {
      if ((rc = VAL("--api-key")) || (rc = set_str(&c->api_key, v))) return rc;
    } else if (flag_is(a, "--access-log")) {
      if ((rc = VAL("--access-log")) || (rc = parse_access_log("--access-log", v, &c->access_log))) return rc;
    } else if (flag_is(a, "--drain-timeout")) {
      if ((rc = VAL("--drain-timeout")) || (rc = parse_double("--drain-timeout", v, 0, 86400, &c->drain_timeout_s)))
        return rc;
    } else if (flag_is(a, "--load-timeout")) {
      if ((rc = VAL("--load-timeout")) || (rc = parse_double("--load-timeout", v, 0, 86400, &c->load_timeout_s)))
        return rc;
    } else if (flag_is(a, "--isolation")) {
      if ((rc = VAL("--isolation")) || (rc = parse_isolation("--isolation", v, &c->isolation))) return rc;
    } else if (flag_is(a, "--step-timeout")) {
      if ((rc = VAL("--step-timeout")) || (rc = parse_double("--step-timeout", v, 0, 86400, &c->step_timeout_s)))
        return rc;
    } else if (flag_is(a, "--request-timeout")) {
      if ((rc = VAL("--request-timeout")) ||
          (rc = parse_double("--request-timeout", v, 0, 86400, &c->request_timeout_s)))
        return rc;
    } else if (flag_is(a, "--model-repository")) {
      if ((rc = VAL("--model-repository")) || (rc = add_repository(c, v))) return rc;
    } else if (flag_is(a, "--tls-cert")) {
      if ((rc = VAL("--tls-cert")) || (rc = set_str(&c->tls_cert, v))) return rc;
    } else if (flag_is(a, "--tls-key")) {
      if ((rc = VAL("--tls-key")) || (rc = set_str(&c->tls_key, v))) return rc;
    } else if (flag_is(a, "--tls-ca")) {
      if ((rc = VAL("--tls-ca")) || (rc = set_str(&c->tls_ca, v))) return rc;
    } else if (flag_is(a, "--grpc-port")) {
      if ((rc = VAL("--grpc-port")) || (rc = parse_int("--grpc-port", v, 0, 65535, &c->grpc_port))) return rc;
    } else if (flag_is(a, "--grpc-max-message-bytes")) {
      if ((rc = VAL("--grpc-max-message-bytes")) ||
          (rc = parse_double("--grpc-max-message-bytes", v, 1024, 4294967295.0, &d)))
        return rc;
      c->grpc_max_message_bytes = (size_t)d;
    } else if (flag_is(a, "--kv-events-endpoint")) {
      if ((rc = VAL("--kv-events-endpoint")) || (rc = set_str(&c->kv_events_endpoint, v))) return rc;
    } else if (flag_is(a, "--kv-events-replay-endpoint")) {
      if ((rc = VAL("--kv-events-replay-endpoint")) || (rc = set_str(&c->kv_events_replay_endpoint, v))) return rc;
    } else if (flag_is(a, "--otlp-traces-endpoint")) {
      if ((rc = VAL("--otlp-traces-endpoint")) || (rc = set_str(&c->otlp_traces_endpoint, v))) return rc;
    } else if (flag_is(a, "--idle-unload-seconds")) {
      if ((rc = VAL("--idle-unload-seconds")) ||
          (rc = parse_double("--idle-unload-seconds", v, 0, 1e7, &c->idle_unload_s)))
        return rc;
    } else if (flag_is(a, "--kv-events-topic")) {
      if ((rc = VAL("--kv-events-topic")) || (rc = set_str(&c->kv_events_topic, v))) return rc;
    } else if (flag_is(a, "--max-body-bytes")) {
      if ((rc = VAL("--max-body-bytes")) || (rc = parse_double("--max-body-bytes", v, 1024, 4294967296.0, &d)))
        return rc;
      c->max_body_bytes = (size_t)d;
    } else {
      return servd_fail(SERVD_EINVAL, "unknown argument '%s' (see servd --help)", a);
    }
#undef VAL
  }
  for (int i = 0; i < c->n_models; i++)
    for (int k = 0; k < i; k++)
      if (c->models[i].name && c->models[k].name && strcmp(c->models[i].name, c->models[k].name) == 0)
        return servd_fail(SERVD_EINVAL, "two models are named '%s'", c->models[i].name);
  if (!c->tls_cert != !c->tls_key)
    return servd_fail(SERVD_EINVAL, "%s: TLS needs both --tls-cert and --tls-key (tls_cert and tls_key)",
                      c->tls_cert ? "--tls-cert without --tls-key" : "--tls-key without --tls-cert");
  if (c->tls_ca && !c->tls_cert)
    return servd_fail(SERVD_EINVAL, "--tls-ca needs --tls-cert and --tls-key (client certificates are asked for "
                                    "only over TLS)");
  return resolve_tp(c);
}

void servd_config_model_options(const servd_config *c, int i, servd_model_options *o) {
  const servd_model_config *m = &c->models[i];
  servd_model_options_default(o);
  o->path = m->path;
  o->name = m->name;
#define PICK(field, global) \
  if (m->field > 0) o->field = m->field; \
  else if ((global) > 0) o->field = (global);
  PICK(interpreters, c->interpreters)
  PICK(tp, c->tp)
  PICK(max_queue, c->max_queue)
  PICK(max_batch_tokens, c->max_batch_tokens)
  PICK(max_seqs, c->max_seqs)
  PICK(kv_blocks, c->kv_blocks)
  PICK(block_size, c->block_size)
  PICK(max_batch_size, 0)
#undef PICK
  if (m->max_batch_delay_ms > 0) o->max_batch_delay_ms = m->max_batch_delay_ms;
  o->gpus = c->gpus;
  o->gpu_memory_fraction = c->gpu_memory_fraction;
  o->cuda_graphs = c->cuda_graphs;
  o->cuda_graph_max_batch = c->cuda_graph_max_batch;
  o->step_timeout_s = c->step_timeout_s;
  o->verify_weights = c->verify_weights;
  o->prefix_cache = c->prefix_cache;
  o->max_step_ms = c->max_step_ms;
  o->speculative = c->speculative;
  o->num_speculative_tokens = c->num_speculative_tokens;
  if (c->max_loras > 0) o->max_loras = c->max_loras;
  if (c->max_model_len > 0) o->max_context = c->max_model_len; /* as servd generate --max-context */
  o->trusted_keys = c->trusted_keys;
  o->load_timeout_s = c->load_timeout_s;
  o->isolation = m->isolation ? (servd_isolation)(m->isolation - 1) : c->isolation;
  o->prefix_cache_dir = c->prefix_cache_dir;
  o->prefix_cache_dir_mb = c->prefix_cache_dir_mb;
  int kvd = m->kv_cache_dtype ? m->kv_cache_dtype : c->kv_cache_dtype;
  if (kvd) o->kv_dtype = (servd_dtype)(kvd - 1);
}
