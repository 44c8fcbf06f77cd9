/* Row conversions of the low-bit block dtypes (convert_lowbit.c), called from servd_row_to_f32 and
 * servd_row_from_f32 (convert.c); nb is the number of blocks. */
#ifndef SERVD_CONVERT_IMPL_H
#define SERVD_CONVERT_IMPL_H

#include <stdint.h>

void servd__dequant_q2_k(const void *src, float *y, int64_t nb);
void servd__dequant_q3_k(const void *src, float *y, int64_t nb);
void servd__dequant_iq4_nl(const void *src, float *y, int64_t nb);
void servd__dequant_iq4_xs(const void *src, float *y, int64_t nb);
void servd__quantize_q2_k(const float *x, void *dst, int64_t nb);
void servd__quantize_q3_k(const float *x, void *dst, int64_t nb);
void servd__quantize_iq4_nl(const float *x, void *dst, int64_t nb);
void servd__quantize_iq4_xs(const float *x, void *dst, int64_t nb);

#endif
