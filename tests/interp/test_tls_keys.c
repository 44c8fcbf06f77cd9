/* pthread key slots: each namespace's libc numbers its keys from 0, yet a thread's key slots are
 * shared by every libc in the process. Keys of the main program (the CUDA driver's, cuBLAS's, the
 * device layer's) and keys of an interpreter's CPython or of the libraries it imports must never
 * share a slot, or a value set by one is read (and, at thread exit, destroyed) by the other.
 *
 * Oracle: values set through one libc's keys read back unchanged after the other libc's keys were
 * made and set on the same thread, whichever order the keys are made in. */
#include "support.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define MAIN_KEYS 40 /* what CUDA's libraries, NCCL and OpenSSL make in the main program, and more */
#define GUEST_KEYS 8 /* keys an interpreter's imports may add: SERVD_GUEST_KEYS_MIN are guaranteed */

static servd_pool *make_pool(int n) {
  servd_pool_options o = {.n_interpreters = n, .world_size = 1};
  servd_pool *p = NULL;
  int rc = servd_pool_create(NULL, &o, &p);
  if (rc < 0) fprintf(stderr, "pool: %s\n", servd_last_error());
  assert_int_equal(rc, 0);
  return p;
}

/* In the interpreter: make n keys through its own libc (ctypes loads the namespace's libc), set each
 * to a value of its own on this thread; `guest_keys` holds them. */
static void guest_make_keys(servd_interp *it, int n) {
  char code[1024];
  snprintf(code, sizeof code,
           "import ctypes\n"
           "libc = ctypes.CDLL('libc.so.6')\n"
           "libc.pthread_getspecific.restype = ctypes.c_void_p\n"
           "libc.pthread_setspecific.argtypes = [ctypes.c_uint, ctypes.c_void_p]\n"
           "guest_keys = []\n"
           "for i in range(%d):\n"
           "    k = ctypes.c_uint()\n"
           "    assert libc.pthread_key_create(ctypes.byref(k), None) == 0, 'key %%d' %% i\n"
           "    guest_keys.append(k.value)\n"
           "    assert libc.pthread_setspecific(k.value, 0x5e000 + i) == 0\n"
           "def guest_intact():\n"
           "    return all(libc.pthread_getspecific(k) == 0x5e000 + i for i, k in enumerate(guest_keys))\n"
           "def guest_delete():\n"
           "    for k in guest_keys: libc.pthread_key_delete(k)\n",
           n);
  support_exec(it, code);
}

static void main_make_keys(pthread_key_t *keys, int n) {
  for (int i = 0; i < n; i++) {
    assert_int_equal(pthread_key_create(&keys[i], NULL), 0);
    assert_int_equal(pthread_setspecific(keys[i], (void *)(uintptr_t)(0xa1000 + i)), 0);
  }
}

static void expect_main_intact(const pthread_key_t *keys, int n) {
  for (int i = 0; i < n; i++) {
    void *v = pthread_getspecific(keys[i]);
    if (v != (void *)(uintptr_t)(0xa1000 + i))
      fail_msg("main key %u (%d of %d) holds %p after the interpreters set their keys", keys[i], i, n, v);
  }
}

static void delete_main_keys(const pthread_key_t *keys, int n) {
  for (int i = 0; i < n; i++) pthread_key_delete(keys[i]);
}

/* Two interpreters, each with keys of its own, used on this thread along with the main program's. */
static void test_main_keys_first(void **state) {
  (void)state;
  servd_pool *p = make_pool(2);
  pthread_key_t keys[MAIN_KEYS];
  main_make_keys(keys, MAIN_KEYS);
  for (int i = 0; i < 2; i++) guest_make_keys(servd_pool_get(p, i), GUEST_KEYS);
  expect_main_intact(keys, MAIN_KEYS);
  for (int i = 0; i < 2; i++) support_expect_true(servd_pool_get(p, i), "guest_intact()");
  /* The guests' keys are all in the slots reserved for them, below SERVD_GUEST_KEYS. */
  support_expect_true(servd_pool_get(p, 0), "max(guest_keys) < 16");
  delete_main_keys(keys, MAIN_KEYS);
  for (int i = 0; i < 2; i++) support_exec(servd_pool_get(p, i), "guest_delete()"); /* namespaces are reused */
  servd_pool_destroy(p);
}

/* The main program makes its keys after the interpreters made theirs (CUDA is loaded lazily). */
static void test_guest_keys_first(void **state) {
  (void)state;
  servd_pool *p = make_pool(1);
  servd_interp *it = servd_pool_get(p, 0);
  guest_make_keys(it, GUEST_KEYS);
  pthread_key_t keys[MAIN_KEYS];
  main_make_keys(keys, MAIN_KEYS);
  support_expect_true(it, "guest_intact()");
  expect_main_intact(keys, MAIN_KEYS);
  for (int i = 0; i < MAIN_KEYS; i++)
    if (keys[i] < SERVD_GUEST_KEYS) fail_msg("main key %u is in a slot reserved for interpreters", keys[i]);
  delete_main_keys(keys, MAIN_KEYS);
  support_exec(it, "guest_delete()");
  servd_pool_destroy(p);
}

/* A namespace that wants more keys than its slots gets a clear Python error, not a shared slot. */
static void test_guest_runs_out_cleanly(void **state) {
  (void)state;
  servd_pool *p = make_pool(1);
  servd_interp *it = servd_pool_get(p, 0);
  support_exec(it, "import ctypes\nlibc = ctypes.CDLL('libc.so.6')\nmade = []\n"
                   "while len(made) < 64:\n"
                   "    k = ctypes.c_uint()\n"
                   "    if libc.pthread_key_create(ctypes.byref(k), None) != 0: break\n"
                   "    made.append(k.value)\n");
  support_expect_true(it, "0 < len(made) < 16 and max(made) < 16");
  support_exec(it, "[libc.pthread_key_delete(k) for k in made]");
  servd_pool_destroy(p);
}

int main(int argc, char **argv) {
  support_early_init(argc, argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_main_keys_first),
      cmocka_unit_test(test_guest_keys_first),
      cmocka_unit_test(test_guest_runs_out_cleanly),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
