/* An interpreter started for GPU 0 on a machine without a usable GPU: servd.device() says cuda:0, and
 * every device call of the servd module fails with a RuntimeError naming the call (the device library
 * reports no devices), never a crash. Host tensors keep working. Skipped where a GPU is visible (the
 * GPU checks of tests/gpu cover that machine). The interpreter is started directly, as the pool would
 * refuse a GPU that is not there. */
#include "support.h"

#include <stdio.h>
#include <string.h>

static servd_interp g_it; /* 64-byte aligned by its type */

static int setup(void **state) {
  (void)state;
  int n = 0;
  if (servd_device_count(&n, NULL, 0) < 0 || n > 0) return 0; /* a GPU is here: the tests skip */
  servd_interp_config c = {.index = 0, .rank = 0, .world_size = 1, .device = 0};
  servd_py_error err;
  if (servd_interp__init(&g_it, &c, &err) < 0) {
    fprintf(stderr, "init: %s: %s\n", err.type, err.message);
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  servd_interp__fini(&g_it);
  return 0;
}

static void test_device_calls_fail_cleanly(void **state) {
  (void)state;
  if (!g_it.ns) {
    skip();
    return;
  }
  support_exec(&g_it, "import servd\nfrom servd import ops\nh = servd.tensor([[1.0, 2.0], [3.0, 4.0]])\n");
  support_expect_true(&g_it, "servd.device() == 'cuda:0' and servd.rank() == 0");
  support_expect_raises_prefix(&g_it, "servd.empty((2, 2), 'bf16', device='cuda')", "RuntimeError", "servd.empty: ");
  support_expect_raises_prefix(&g_it, "servd.empty(4, device='cuda:1')", "RuntimeError", "servd.empty: ");
  support_expect_raises_prefix(&g_it, "servd.upload(h)", "RuntimeError", "servd.upload: ");
  support_expect_raises_prefix(&g_it, "servd.to_device(h)", "RuntimeError", "servd.to_device: ");
  support_expect_raises_prefix(&g_it, "servd.sync()", "RuntimeError", "servd.sync: ");
  support_expect_raises_prefix(&g_it, "servd.to_device(h, dtype='nope')", "ValueError", "unknown dtype");
  support_expect_raises_prefix(&g_it, "servd.empty(4, device='gpu')", "ValueError", "servd.empty: device must be");
  /* the host side is unchanged */
  support_expect_true(&g_it, "servd.empty(3, device='cpu').device == 'cpu' and h.to_host() is h");
  support_exec(&g_it, "o = servd.empty((2, 2))\nops.add(o, h, h)\n");
  support_expect_true(&g_it, "o.tolist() == [[2.0, 4.0], [6.0, 8.0]]");
}

int main(int argc, char **argv) {
  support_early_init(argc, argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_device_calls_fail_cleanly),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
