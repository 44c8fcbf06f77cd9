/* The tile table shared by the AVX-512 VNNI block-quantized kernels (matmul_avx512vnni.c,
 * matmul_q5_avx512vnni.c). The including file defines RQ (rows of x per tile at most) and
 * `static void tile(const servd__mm *p, int64_t i0, int64_t j, int R, int NW, servd_dtype wt)`
 * (always inlined, so each TILE instance is specialized for its R, NW and dtype), then calls
 * TILES(dtype, suffix) once per weight dtype to get `tiles_<suffix>[RQ + 1][2]`:
 * [R-1][0]: NW = 2 (4 when m == 1: row RQ); [R-1][1]: NW = 1. */
#ifndef SERVD_MATMUL_AVX512VNNI_IMPL_H
#define SERVD_MATMUL_AVX512VNNI_IMPL_H

typedef void (*tile_fn)(const servd__mm *p, int64_t i0, int64_t j);
#define TILE(wt, R, NW, name) \
  static void name(const servd__mm *p, int64_t i0, int64_t j) { tile(p, i0, j, R, NW, wt); }
// clang-format off: a list of macro uses, one a line
#define TILES(wt, sfx) \
  TILE(wt, 1, 4, t1x4_##sfx) \
  TILE(wt, 1, 2, t1x2_##sfx) \
  TILE(wt, 1, 1, t1x1_##sfx) \
  TILE(wt, 2, 2, t2x2_##sfx) \
  TILE(wt, 2, 1, t2x1_##sfx) \
  TILE(wt, 3, 2, t3x2_##sfx) \
  TILE(wt, 3, 1, t3x1_##sfx) \
  TILE(wt, 4, 2, t4x2_##sfx) \
  TILE(wt, 4, 1, t4x1_##sfx) \
  static const tile_fn tiles_##sfx[RQ + 1][2] = {{t1x2_##sfx, t1x1_##sfx}, \
                                                 {t2x2_##sfx, t2x1_##sfx}, \
                                                 {t3x2_##sfx, t3x1_##sfx}, \
                                                 {t4x2_##sfx, t4x1_##sfx}, \
                                                 {t1x4_##sfx, t1x1_##sfx}};
// clang-format on

#endif
