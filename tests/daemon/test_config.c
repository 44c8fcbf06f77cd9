/* servd's GPU options on the command line and in the JSON config file: defaults, good values, bad
 * values with clear errors, --tp against --gpus, and what reaches the engine's model options. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"
#include "lora_spec.h"
#include "servd/status.h"

/* Parses argv (NULL-terminated, after "servd") into a fresh config; returns the status. */
static int parse(servd_config *c, const char *const *args) {
  char *argv[32] = {"servd"};
  int argc = 1;
  for (; args[argc - 1]; argc++) argv[argc] = (char *)args[argc - 1];
  servd_config_init(c);
  bool exit_now = false;
  return servd_config_parse_args(c, argc, argv, &exit_now);
}

#define PARSE(c, ...) parse(c, (const char *const[]){__VA_ARGS__, NULL})

static void expect_error(const char *const *args, const char *needle) {
  servd_config c;
  int rc = parse(&c, args);
  assert_int_equal(rc, SERVD_EINVAL);
  if (!strstr(servd_last_error(), needle)) fail_msg("error '%s' lacks '%s'", servd_last_error(), needle);
  servd_config_free(&c);
}

#define EXPECT_ERROR(needle, ...) expect_error((const char *const[]){__VA_ARGS__, NULL}, needle)

static void test_defaults(void **state) {
  (void)state;
  servd_config c;
  assert_int_equal(PARSE(&c, "serve"), 0);
  assert_int_equal(c.gpus, 0);
  assert_int_equal(c.tp, 1);
  assert_true(c.gpu_memory_fraction == 0.90);
  assert_true(c.cuda_graphs);
  assert_int_equal(c.cuda_graph_max_batch, 64);
  assert_true(c.step_timeout_s == 120);
  servd_config_free(&c);
}

static void test_gpu_flags(void **state) {
  (void)state;
  servd_config c;
  assert_int_equal(
      PARSE(&c, "--gpus", "2", "--gpu-memory-fraction", "0.5", "--cuda-graphs", "off", "--cuda-graph-max-batch=8"), 0);
  assert_int_equal(c.gpus, 2);
  assert_int_equal(c.tp, 2); /* defaults to the GPUs */
  assert_true(c.gpu_memory_fraction == 0.5);
  assert_false(c.cuda_graphs);
  assert_int_equal(c.cuda_graph_max_batch, 8);
  servd_config_free(&c);

  assert_int_equal(PARSE(&c, "--gpus", "4", "--tp", "4", "--gpu-memory-fraction", "1", "--cuda-graphs", "on"), 0);
  assert_int_equal(c.tp, 4);
  assert_true(c.gpu_memory_fraction == 1.0);
  assert_true(c.cuda_graphs);
  servd_config_free(&c);

  /* Without GPUs --tp keeps its CPU meaning. */
  assert_int_equal(PARSE(&c, "--tp", "2"), 0);
  assert_int_equal(c.tp, 2);
  servd_config_free(&c);
}

static void test_bad_flags(void **state) {
  (void)state;
  EXPECT_ERROR("--tp 2 with --gpus 1", "--tp", "2", "--gpus", "1");
  EXPECT_ERROR("one rank per GPU", "--gpus", "2", "--tp", "1");
  EXPECT_ERROR("--gpu-memory-fraction: expected a fraction in (0, 1]", "--gpu-memory-fraction", "0");
  EXPECT_ERROR("got '1.5'", "--gpu-memory-fraction", "1.5");
  EXPECT_ERROR("got '-0.1'", "--gpu-memory-fraction", "-0.1");
  EXPECT_ERROR("got 'nan'", "--gpu-memory-fraction", "nan");
  EXPECT_ERROR("got '0.9x'", "--gpu-memory-fraction", "0.9x");
  EXPECT_ERROR("--gpu-memory-fraction: a value is required", "--gpu-memory-fraction");
  EXPECT_ERROR("--cuda-graphs: expected on or off, got 'yes'", "--cuda-graphs", "yes");
  EXPECT_ERROR("--cuda-graph-max-batch: expected an integer in [1, 4096], got '0'", "--cuda-graph-max-batch", "0");
  EXPECT_ERROR("got '5000'", "--cuda-graph-max-batch", "5000");
  EXPECT_ERROR("got 'many'", "--cuda-graph-max-batch", "many");
  EXPECT_ERROR("--gpus: expected an integer", "--gpus", "-1");
}

static char *write_file(const char *text) {
  char *path = strdup("/tmp/servd-test-config-XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  fputs(text, f);
  fclose(f);
  return path;
}

static int parse_file(servd_config *c, const char *json, const char *const *extra) {
  char *path = write_file(json);
  const char *args[16] = {"--config", path};
  int n = 2;
  for (; extra && *extra; extra++) args[n++] = *extra;
  args[n] = NULL;
  int rc = parse(c, args);
  unlink(path);
  free(path);
  return rc;
}

static void test_config_file(void **state) {
  (void)state;
  servd_config c;
  assert_int_equal(parse_file(&c,
                              "{\"gpus\": 2, \"gpu_memory_fraction\": 0.8, \"cuda_graphs\": false, "
                              "\"cuda_graph_max_batch\": 32}",
                              NULL),
                   0);
  assert_int_equal(c.gpus, 2);
  assert_int_equal(c.tp, 2);
  assert_true(c.gpu_memory_fraction == 0.8);
  assert_false(c.cuda_graphs);
  assert_int_equal(c.cuda_graph_max_batch, 32);
  servd_config_free(&c);

  /* "on"/"off" as on the command line; flags win over the file. */
  assert_int_equal(parse_file(&c, "{\"cuda_graphs\": \"off\", \"gpu_memory_fraction\": 0.8}",
                              (const char *const[]){"--cuda-graphs", "on", "--gpu-memory-fraction", "0.7", NULL}),
                   0);
  assert_true(c.cuda_graphs);
  assert_true(c.gpu_memory_fraction == 0.7);
  servd_config_free(&c);

  static const struct {
    const char *json, *needle;
  } bad[] = {
      {"{\"gpu_memory_fraction\": 0}", "'gpu_memory_fraction' must be a fraction in (0, 1]"},
      {"{\"gpu_memory_fraction\": 1.01}", "'gpu_memory_fraction' must be a fraction in (0, 1]"},
      {"{\"gpu_memory_fraction\": \"0.9\"}", "'gpu_memory_fraction' must be a fraction in (0, 1]"},
      {"{\"cuda_graphs\": \"maybe\"}", "'cuda_graphs' must be true, false, \"on\" or \"off\""},
      {"{\"cuda_graphs\": 1}", "'cuda_graphs' must be true, false"},
      {"{\"cuda_graph_max_batch\": 0}", "'cuda_graph_max_batch' must be an integer in [1, 4096]"},
      {"{\"cuda_graph_max_batch\": 8.5}", "'cuda_graph_max_batch' must be an integer"},
      {"{\"cuda_graph\": true}", "unknown key 'cuda_graph'"},
      {"{\"gpus\": 1, \"tp\": 2}", "--tp 2 with --gpus 1"},
      {"{\"gpus\": 2, \"models\": [{\"path\": \"a.mpk\", \"name\": \"a\", \"tp\": 1}]}",
       "model 'a': tp 1 with --gpus 2"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int rc = parse_file(&c, bad[i].json, NULL);
    if (rc != SERVD_EINVAL || !strstr(servd_last_error(), bad[i].needle))
      fail_msg("%s: rc %d, error '%s', expected '%s'", bad[i].json, rc, servd_last_error(), bad[i].needle);
    servd_config_free(&c);
  }
}

static void test_model_options(void **state) {
  (void)state;
  servd_config c;
  assert_int_equal(
      PARSE(&c, "--gpus", "2", "--gpu-memory-fraction", "0.6", "--cuda-graph-max-batch", "16", "--model", "/x/m.mpk:m"),
      0);
  servd_model_options o;
  servd_config_model_options(&c, 0, &o);
  assert_int_equal(o.gpus, 2);
  assert_int_equal(o.tp, 2);
  assert_true(o.gpu_memory_fraction == 0.6);
  assert_true(o.cuda_graphs);
  assert_int_equal(o.cuda_graph_max_batch, 16);
  servd_config_free(&c);

  /* Process-wide defaults reach options made elsewhere (the repository API). */
  servd_engine_set_gpu_defaults(3, 0.75, false, 24);
  servd_model_options_default(&o);
  assert_int_equal(o.gpus, 3);
  assert_int_equal(o.tp, 3);
  assert_true(o.gpu_memory_fraction == 0.75);
  assert_false(o.cuda_graphs);
  assert_int_equal(o.cuda_graph_max_batch, 24);
  servd_engine_set_gpu_defaults(0, 0.9, true, 64);
  servd_model_options_default(&o);
  assert_int_equal(o.gpus, 0);
  assert_int_equal(o.tp, 1);
}

static void test_help_mentions_gpu_flags(void **state) {
  (void)state;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  servd_config_usage(f);
  fclose(f);
  const char *flags[] = {"--gpus N", "--tp N", "--gpu-memory-fraction F", "--cuda-graphs on|off",
                         "--cuda-graph-max-batch B"};
  for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
    if (!strstr(buf, flags[i])) fail_msg("--help lacks %s", flags[i]);
  free(buf);
}

static void test_step_timeout(void **state) {
  (void)state;
  servd_config c;
  assert_int_equal(PARSE(&c, "--step-timeout", "2.5", "--model", "/x.mpk"), 0);
  assert_true(c.step_timeout_s == 2.5);
  servd_model_options o;
  servd_config_model_options(&c, 0, &o);
  assert_true(o.step_timeout_s == 2.5);
  servd_config_free(&c);
  assert_int_equal(PARSE(&c, "--step-timeout=0"), 0);
  assert_true(c.step_timeout_s == 0); /* no limit */
  servd_config_free(&c);
  assert_int_equal(parse_file(&c, "{\"step_timeout\": 30}", NULL), 0);
  assert_true(c.step_timeout_s == 30);
  servd_config_free(&c);
  EXPECT_ERROR("--step-timeout", "--step-timeout", "-1");
  EXPECT_ERROR("--step-timeout", "--step-timeout", "soon");
}

/* --isolation sets the default of every model; a model's "isolation" key wins over it. */
static void test_isolation(void **state) {
  (void)state;
  servd_config c;
  servd_model_options o;
  assert_int_equal(PARSE(&c, "--model", "/x.mpk"), 0);
  servd_config_model_options(&c, 0, &o);
  assert_int_equal(o.isolation, SERVD_ISOLATION_AUTO); /* none, unless the package declares native code */
  servd_config_free(&c);
  assert_int_equal(PARSE(&c, "--isolation", "none", "--model", "/x.mpk"), 0);
  servd_config_model_options(&c, 0, &o);
  assert_int_equal(o.isolation, SERVD_ISOLATION_NONE);
  servd_config_free(&c);
  assert_int_equal(PARSE(&c, "--isolation", "process", "--model", "/x.mpk"), 0);
  servd_config_model_options(&c, 0, &o);
  assert_int_equal(o.isolation, SERVD_ISOLATION_PROCESS);
  servd_config_free(&c);
  const char *const extra[] = {"--isolation", "process", NULL};
  assert_int_equal(parse_file(&c,
                              "{\"models\": [{\"path\": \"/a.mpk\", \"isolation\": \"process\"}, "
                              "{\"path\": \"/b.mpk\"}, {\"path\": \"/c.mpk\", \"isolation\": \"none\"}]}",
                              NULL),
                   0);
  servd_config_model_options(&c, 0, &o);
  assert_int_equal(o.isolation, SERVD_ISOLATION_PROCESS);
  servd_config_model_options(&c, 1, &o);
  assert_int_equal(o.isolation, SERVD_ISOLATION_AUTO);
  servd_config_free(&c);
  assert_int_equal(parse_file(&c,
                              "{\"models\": [{\"path\": \"/c.mpk\", \"isolation\": \"none\"}, "
                              "{\"path\": \"/b.mpk\"}]}",
                              extra),
                   0);
  servd_config_model_options(&c, 0, &o);
  assert_int_equal(o.isolation, SERVD_ISOLATION_NONE);
  servd_config_model_options(&c, 1, &o);
  assert_int_equal(o.isolation, SERVD_ISOLATION_PROCESS);
  servd_config_free(&c);
  EXPECT_ERROR("expected none or process", "--isolation", "container");
  assert_int_equal(parse_file(&c, "{\"models\": [{\"path\": \"/a.mpk\", \"isolation\": \"vm\"}]}", NULL), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "models[0].isolation"));
  servd_config_free(&c);
}

/* Prefix caching is on unless --no-prefix-cache or "prefix_cache": false; it reaches every model. */
static void test_prefix_cache(void **state) {
  (void)state;
  servd_config c;
  servd_model_options o;
  assert_int_equal(PARSE(&c, "--model", "/x.mpk"), 0);
  servd_config_model_options(&c, 0, &o);
  assert_true(o.prefix_cache);
  servd_config_free(&c);
  assert_int_equal(PARSE(&c, "--no-prefix-cache", "--model", "/x.mpk"), 0);
  servd_config_model_options(&c, 0, &o);
  assert_false(o.prefix_cache);
  servd_config_free(&c);
  assert_int_equal(parse_file(&c, "{\"prefix_cache\": false, \"models\": [{\"path\": \"/a.mpk\"}]}", NULL), 0);
  servd_config_model_options(&c, 0, &o);
  assert_false(o.prefix_cache);
  servd_config_free(&c);
  assert_int_equal(parse_file(&c, "{\"prefix_cache\": 3}", NULL), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "prefix_cache"));
  servd_config_free(&c);
}

/* --max-model-len / "max_model_len" caps every model's context (the engine's max_context). */
static void test_max_model_len(void **state) {
  (void)state;
  servd_config c;
  servd_model_options o;
  assert_int_equal(PARSE(&c, "--model", "/x.mpk"), 0);
  servd_config_model_options(&c, 0, &o);
  assert_int_equal(o.max_context, 0);
  servd_config_free(&c);
  assert_int_equal(PARSE(&c, "--max-model-len", "512", "--model", "/x.mpk"), 0);
  servd_config_model_options(&c, 0, &o);
  assert_int_equal(o.max_context, 512);
  servd_config_free(&c);
  assert_int_equal(parse_file(&c, "{\"max_model_len\": 64, \"models\": [{\"path\": \"/a.mpk\"}]}", NULL), 0);
  servd_config_model_options(&c, 0, &o);
  assert_int_equal(o.max_context, 64);
  servd_config_free(&c);
  assert_int_equal(PARSE(&c, "--max-model-len", "0", "--model", "/x.mpk"), SERVD_EINVAL);
  servd_config_free(&c);
}

/* --lora NAME=PATH[,base=MODEL] (repeatable, checked at parse) and --max-loras into every model. */
static void test_lora_flags(void **state) {
  (void)state;
  servd_config c;
  servd_model_options o;
  assert_int_equal(PARSE(&c, "--model", "/x.mpk", "--lora", "a=/ad/a", "--lora", "b=/ad/b,base=x", "--max-loras", "3"),
                   0);
  assert_int_equal(c.n_loras, 2);
  assert_string_equal(c.loras[1], "b=/ad/b,base=x");
  servd_config_model_options(&c, 0, &o);
  assert_int_equal(o.max_loras, 3);
  servd_config_free(&c);
  servd_lora_spec sp;
  assert_int_equal(servd_lora_spec_parse("b=/ad/b,base=x", &sp), 0);
  assert_true(!strcmp(sp.name, "b") && !strcmp(sp.path, "/ad/b") && !strcmp(sp.base, "x"));
  assert_int_equal(servd_lora_spec_parse("a=/p", &sp), 0);
  assert_true(!strcmp(sp.path, "/p") && sp.base[0] == 0);
  const char *bad[] = {"a", "=p", "a=", "a=/p,base=", "a=,base=x"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(PARSE(&c, "--model", "/x.mpk", "--lora", bad[i]), SERVD_EINVAL);
    assert_non_null(strstr(servd_last_error(), "--lora"));
    servd_config_free(&c);
  }
  assert_int_equal(PARSE(&c, "--model", "/x.mpk", "--max-loras", "0"), SERVD_EINVAL);
  servd_config_free(&c);
}

/* --kv-cache-dtype / "kv_cache_dtype" (top level or per model, the model's winning): unset leaves
 * the choice to the package (SERVD_DTYPE_COUNT); a name that is not a cache dtype is refused. */
static void test_kv_cache_dtype(void **state) {
  (void)state;
  servd_config c;
  servd_model_options o;
  assert_int_equal(PARSE(&c, "--model", "/x.mpk"), 0);
  servd_config_model_options(&c, 0, &o);
  assert_int_equal(o.kv_dtype, SERVD_DTYPE_COUNT);
  servd_config_free(&c);
  assert_int_equal(PARSE(&c, "--kv-cache-dtype", "q8_0", "--model", "/x.mpk"), 0);
  servd_config_model_options(&c, 0, &o);
  assert_int_equal(o.kv_dtype, SERVD_Q8_0);
  servd_config_free(&c);
  assert_int_equal(parse_file(&c,
                              "{\"kv_cache_dtype\": \"bf16\", \"models\": [{\"path\": \"/a.mpk\"}, "
                              "{\"path\": \"/b.mpk\", \"kv_cache_dtype\": \"q4_0\"}]}",
                              NULL),
                   0);
  servd_config_model_options(&c, 0, &o);
  assert_int_equal(o.kv_dtype, SERVD_BF16);
  servd_config_model_options(&c, 1, &o);
  assert_int_equal(o.kv_dtype, SERVD_Q4_0);
  servd_config_free(&c);
  EXPECT_ERROR("--kv-cache-dtype: expected f16, bf16, q8_0, q4_0 or f32, got 'q4_1'", "--kv-cache-dtype", "q4_1");
  EXPECT_ERROR("got 'int8'", "--kv-cache-dtype=int8");
  assert_int_equal(parse_file(&c, "{\"models\": [{\"path\": \"/a.mpk\", \"kv_cache_dtype\": 8}]}", NULL), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "models[0].kv_cache_dtype"));
  servd_config_free(&c);
}

/* The step target: 100 ms by default, --max-step-ms or "max_step_ms" (0 turns it off); every model. */
static void test_max_step_ms(void **state) {
  (void)state;
  servd_config c;
  servd_model_options o;
  assert_int_equal(PARSE(&c, "--model", "/x.mpk"), 0);
  servd_config_model_options(&c, 0, &o);
  assert_int_equal(o.max_step_ms, 100);
  servd_config_free(&c);
  assert_int_equal(PARSE(&c, "--max-step-ms", "0", "--model", "/x.mpk"), 0);
  servd_config_model_options(&c, 0, &o);
  assert_int_equal(o.max_step_ms, 0);
  servd_config_free(&c);
  assert_int_equal(parse_file(&c, "{\"max_step_ms\": 40, \"models\": [{\"path\": \"/a.mpk\"}]}", NULL), 0);
  servd_config_model_options(&c, 0, &o);
  assert_int_equal(o.max_step_ms, 40);
  servd_config_free(&c);
  assert_int_equal(PARSE(&c, "--max-step-ms", "-1", "--model", "/x.mpk"), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "--max-step-ms"));
  servd_config_free(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),       cmocka_unit_test(test_gpu_flags),
      cmocka_unit_test(test_step_timeout),   cmocka_unit_test(test_isolation),
      cmocka_unit_test(test_bad_flags),      cmocka_unit_test(test_config_file),
      cmocka_unit_test(test_model_options),  cmocka_unit_test(test_help_mentions_gpu_flags),
      cmocka_unit_test(test_prefix_cache),   cmocka_unit_test(test_max_step_ms),
      cmocka_unit_test(test_max_model_len),  cmocka_unit_test(test_lora_flags),
      cmocka_unit_test(test_kv_cache_dtype),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
