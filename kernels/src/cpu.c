/* CPU feature detection, the forced ISA for tests, and per-thread scratch buffers. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu-impl.h"

/* -1 until detected; libgcc's __builtin_cpu_supports also checks XCR0, so the OS saves the
 * registers of every ISA reported here. */
static atomic_int best_isa = -1;
static atomic_int forced_isa = -1;
static atomic_int has_vnni = -1, has_bf16 = -1;
static atomic_int batch_invariant = 0;
static atomic_int activation_levels = 1;

static void detect(void) {
  __builtin_cpu_init();
  int best = SERVD_ISA_SCALAR;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = SERVD_ISA_AVX2;
  /* F16C has no __builtin_cpu_supports name in every compiler; every AVX2 CPU in service has it. */
  if (best == SERVD_ISA_AVX2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    best = SERVD_ISA_AVX512;
  atomic_store(&has_vnni, best == SERVD_ISA_AVX512 && __builtin_cpu_supports("avx512vnni"));
  atomic_store(&has_bf16, best == SERVD_ISA_AVX512 && __builtin_cpu_supports("avx512bf16"));
  atomic_store(&best_isa, best);
  /* SERVD_ISA=scalar|avx2|avx512 runs a whole process on that path (checking a model on the scalar
   * reference); a name this CPU cannot run is refused with a warning. */
  /* SERVD_BATCH_INVARIANT=1: batch invariance also where it costs (servd/ops.h) */
  const char *bi = getenv("SERVD_BATCH_INVARIANT");
  if (bi && *bi && strcmp(bi, "0") != 0) atomic_store(&batch_invariant, 1);
  /* SERVD_ACTIVATION_LEVELS=1|2: how finely quantized matmuls carry x (servd/ops.h) */
  const char *al = getenv("SERVD_ACTIVATION_LEVELS");
  if (al && *al) {
    if (!strcmp(al, "1") || !strcmp(al, "2")) atomic_store(&activation_levels, al[0] - '0');
    else fprintf(stderr, "servd: warning: SERVD_ACTIVATION_LEVELS=%s ignored (expected 1 or 2)\n", al);
  }
  const char *env = getenv("SERVD_ISA");
  for (int i = 0; env && *env && i <= SERVD_ISA_COUNT; i++) {
    if (i == SERVD_ISA_COUNT || i > best) {
      fprintf(stderr, "servd: warning: SERVD_ISA=%s ignored (expected scalar, avx2 or avx512, up to %s)\n", env,
              servd_isa_name((servd_isa)best));
      break;
    }
    if (!strcmp(env, servd_isa_name((servd_isa)i))) {
      atomic_store(&forced_isa, i);
      break;
    }
  }
}

servd_isa servd_cpu_best_isa(void) {
  int b = atomic_load_explicit(&best_isa, memory_order_relaxed);
  if (b < 0) {
    detect();
    b = atomic_load(&best_isa);
  }
  return (servd_isa)b;
}

const char *servd_isa_name(servd_isa isa) {
  switch (isa) {
  case SERVD_ISA_SCALAR: return "scalar";
  case SERVD_ISA_AVX2: return "avx2";
  case SERVD_ISA_AVX512: return "avx512";
  default: return "auto";
  }
}

int servd_cpu_force_isa(servd_isa isa) {
  if (isa == SERVD_ISA_COUNT) {
    atomic_store(&forced_isa, -1);
    return 0;
  }
  if ((unsigned)isa > (unsigned)servd_cpu_best_isa())
    return servd_fail(SERVD_EUNSUPPORTED, "cpu_force_isa: this CPU does not support %s (best: %s)", servd_isa_name(isa),
                      servd_isa_name(servd_cpu_best_isa()));
  atomic_store(&forced_isa, (int)isa);
  return 0;
}

servd_isa servd__isa(void) {
  const servd_isa best = servd_cpu_best_isa(); /* detects first: SERVD_ISA is read there */
  int f = atomic_load_explicit(&forced_isa, memory_order_relaxed);
  return f >= 0 ? (servd_isa)f : best;
}

void servd_cpu_set_batch_invariant(bool on) {
  (void)servd_cpu_best_isa(); /* the environment is read once, at detection: not after this */
  atomic_store(&batch_invariant, on ? 1 : 0);
}

bool servd_cpu_batch_invariant(void) {
  (void)servd_cpu_best_isa();
  return atomic_load_explicit(&batch_invariant, memory_order_relaxed) == 1;
}

int servd_cpu_set_activation_levels(int levels) {
  (void)servd_cpu_best_isa(); /* the environment is read once, at detection: not after this */
  if (levels != 1 && levels != 2)
    return servd_fail(SERVD_EINVAL, "cpu_set_activation_levels: %d levels (expected 1 or 2)", levels);
  atomic_store(&activation_levels, levels);
  return 0;
}

int servd_cpu_activation_levels(void) {
  (void)servd_cpu_best_isa();
  return atomic_load_explicit(&activation_levels, memory_order_relaxed);
}

servd_isa servd_cpu_active_isa(void) { return servd__isa(); }

bool servd__cpu_has_vnni(void) {
  return servd__isa() == SERVD_ISA_AVX512 && atomic_load_explicit(&has_vnni, memory_order_relaxed) == 1;
}

bool servd__cpu_has_bf16(void) {
  return servd__isa() == SERVD_ISA_AVX512 && atomic_load_explicit(&has_bf16, memory_order_relaxed) == 1;
}

/* ---- per-thread scratch ----------------------------------------------------------------------- */

typedef struct scratch {
  void *buf[SERVD__SCRATCH_SLOTS];
  size_t cap[SERVD__SCRATCH_SLOTS];
} scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static _Thread_local scratch *tls_scratch;

static void scratch_free(void *p) {
  scratch *s = p;
  for (int i = 0; i < SERVD__SCRATCH_SLOTS; i++) free(s->buf[i]);
  free(s);
}

static void scratch_key_init(void) { (void)pthread_key_create(&scratch_key, scratch_free); }

void *servd__scratch(int slot, size_t bytes) {
  if (slot < 0 || slot >= SERVD__SCRATCH_SLOTS) return NULL;
  scratch *s = tls_scratch;
  if (!s) {
    pthread_once(&scratch_once, scratch_key_init);
    s = calloc(1, sizeof *s);
    if (!s) return NULL;
    /* The key's destructor frees the buffers when the thread exits. */
    if (pthread_setspecific(scratch_key, s) != 0) {
      free(s);
      return NULL;
    }
    tls_scratch = s;
  }
  if (s->cap[slot] < bytes) {
    size_t cap = (bytes + bytes / 4 + 4095) & ~(size_t)4095;
    void *p = aligned_alloc(SERVD_ALIGN, cap);
    if (!p) return NULL;
    free(s->buf[slot]);
    s->buf[slot] = p;
    s->cap[slot] = cap;
  }
  return s->buf[slot];
}
