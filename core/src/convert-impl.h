/* The reference row conversions of every row of servd/dtypes.def, defined in convert.c (plain dtypes,
 * blocks of 32, q4_k q5_k q6_k) and convert_lowbit.c (q2_k q3_k iq4_nl iq4_xs), called through the
 * table in convert.c by servd_row_to_f32 / servd_row_from_f32, which have checked the arguments.
 * nb is the number of blocks (of elements for plain dtypes); every value converts (an i32 row that
 * does not fit is refused before). */
#ifndef SERVD_CONVERT_IMPL_H
#define SERVD_CONVERT_IMPL_H

#include <stdint.h>

#include "servd/tensor.h"

#define SERVD_DTYPE(ID, value, name, ...) \
  void servd__##name##_to_f32(const void *src, float *dst, int64_t nb); \
  void servd__##name##_from_f32(const float *src, void *dst, int64_t nb);
#include "servd/dtypes.def"

#endif
