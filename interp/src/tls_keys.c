/* pthread keys across link-map namespaces.
 *
 * Every libc numbers its pthread keys from 0 in a table of its own, but a thread's key slots live in
 * its thread descriptor, which all the libcs of the process share. Without care, key 8 of the main
 * program (say, one of the CUDA driver's) and key 8 of an interpreter's libc (say, OpenSSL's, imported
 * by jinja2) are one slot: each reads the other's value on any thread that runs both, and the main
 * libc even runs its destructor on the other's value at thread exit.
 *
 * So the slots are partitioned. Early, the main program takes the free keys below SERVD_GUEST_KEYS
 * and never sets them: main-program keys made later get other slots. Each new namespace's libc, before
 * CPython starts in it, takes every key except those reserved ones: its later keys (CPython's, its
 * extension libraries') can only land in the reserved slots. The guests' slots are all in the first
 * block of 32, which needs no allocation: a slot past it would make the guest's libc allocate a
 * second-level block that the main libc frees at thread exit with the wrong allocator. */
#include "interp-impl.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define KEYS_MAX 1024 /* glibc's PTHREAD_KEYS_MAX; the loops below stop at the first failure anyway */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static uint32_t g_guest_slots; /* bit k: slot k is the main program's, reserved for the guests */

static void reserve_main(void) {
  for (int i = 0; i < KEYS_MAX; i++) {
    pthread_key_t k;
    if (pthread_key_create(&k, NULL) != 0) break;
    if (k >= SERVD_GUEST_KEYS) {
      pthread_key_delete(k); /* past the reserved range: the main program may have it back */
      break;
    }
    g_guest_slots |= 1u << k;
  }
}

uint32_t servd_tls_keys__reserve_main(void) {
  pthread_once(&g_once, reserve_main);
  return g_guest_slots;
}

int servd_tls_keys__confine(void *ns_handle, const char *what) {
  uint32_t slots = servd_tls_keys__reserve_main();
  if (__builtin_popcount(slots) < SERVD_GUEST_KEYS_MIN)
    return servd_fail(SERVD_EUNSUPPORTED,
                      "interp: %s: only %d pthread key slots below %d were free for the interpreters (%d needed): "
                      "call servd_interp_early_init() first in main",
                      what, __builtin_popcount(slots), SERVD_GUEST_KEYS, SERVD_GUEST_KEYS_MIN);
  int (*create)(pthread_key_t *, void (*)(void *)) =
      (int (*)(pthread_key_t *, void (*)(void *)))dlsym(ns_handle, "pthread_key_create");
  int (*delete)(pthread_key_t) = (int (*)(pthread_key_t))dlsym(ns_handle, "pthread_key_delete");
  if (!create || !delete)
    return servd_fail(SERVD_EUNSUPPORTED, "interp: %s: pthread_key_create/delete not found in the namespace's libc",
                      what);
  /* Take every key the namespace's libc has, then give back the reserved slots. A key it had made
   * before (a library constructor) must be one of the reserved slots, or it may share a slot with a
   * key of the main program. */
  uint64_t got[KEYS_MAX / 64] = {0};
  for (int i = 0; i < KEYS_MAX; i++) {
    pthread_key_t k;
    if (create(&k, NULL) != 0) break;
    if (k < KEYS_MAX) got[k / 64] |= 1ull << (k % 64);
  }
  int foreign = -1;
  for (int k = 0; k < KEYS_MAX && foreign < 0; k++)
    if (!(got[k / 64] & (1ull << (k % 64))) && !(k < 32 && (slots & (1u << k)))) foreign = k;
  for (pthread_key_t k = 0; k < 32; k++)
    if ((slots & (1u << k)) && (got[0] & (1ull << k))) delete (k);
  if (foreign >= 0)
    return servd_fail(SERVD_EUNSUPPORTED,
                      "interp: %s: the namespace's libc already used pthread key %d, a slot of "
                      "the main program",
                      what, foreign);
  return 0;
}
