/* Seeded pseudo-random numbers: xoshiro256** seeded by splitmix64, so a --seed reproduces a run on
 * every platform (rand() differs between libcs). */
#include <math.h>

#include "bench.h"

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t bench_mix(uint64_t a, uint64_t b) {
  uint64_t x = a ^ (b * 0xd1342543de82ef95ULL);
  splitmix64(&x);
  return splitmix64(&x);
}

void bench_rng_seed(bench_rng *r, uint64_t seed) {
  uint64_t x = seed;
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t bench_rng_next(bench_rng *r) {
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double bench_rng_uniform(bench_rng *r) { return (double)(bench_rng_next(r) >> 11) * 0x1.0p-53; }

double bench_rng_exponential(bench_rng *r, double rate) {
  /* 1 - u lies in (0, 1], so the log is finite. */
  return -log(1.0 - bench_rng_uniform(r)) / rate;
}
