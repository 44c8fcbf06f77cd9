/* The CPU traits of each dtype as a matmul weight (ggml's type_traits_cpu): which quantization of x
 * its kernels read and its kernel per ISA. matmul.c's prepare() reads the row; nothing else in the
 * CPU kernels picks by dtype. A kernel may serve several dtypes (it reads p->wt inside); a NULL ISA
 * entry falls back to the next lower one, a NULL scalar entry means the dtype is not a weight (i32).
 *
 * The rows here are what the selection did when it was a chain of ifs, kept exactly: the VNNI
 * kernels run only where servd__cpu_has_vnni() (an AVX-512 CPU with VNNI, AVX-512 active), and the
 * block kernels have no AVX-512 build without VNNI, so such a CPU runs their AVX2 one. */
#include "matmul-impl.h"
#include "matmul_lowbit-impl.h"

/* Designated fields: a row names what it sets, the rest is zero (false, NULL). */
#define FLOAT(act_) \
  { .act = act_, .scalar = servd__mm_float_scalar, .avx2 = servd__mm_float_avx2, .avx512 = servd__mm_float_avx512 }
#define Q8(scalar_, avx2_, vnni_) \
  { .act = SERVD__ACT_Q8, .scalar = scalar_, .avx2 = avx2_, .avx512vnni = vnni_ }
/* as Q8, its VNNI kernel adding the residual activation level inside its own dots (Q8_FUSED2: its
 * AVX2 kernel too) */
#define Q8_FUSED(scalar_, avx2_, vnni_) \
  { .act = SERVD__ACT_Q8, .vnni_fuses_residual = true, .scalar = scalar_, .avx2 = avx2_, .avx512vnni = vnni_ }
#define Q8_FUSED2(scalar_, avx2_, vnni_) \
  { \
    .act = SERVD__ACT_Q8, .vnni_fuses_residual = true, .scalar = scalar_, .avx2 = avx2_, .avx512vnni = vnni_, \
    .avx2_fuses_residual = true \
  }
#define Q8K(perm_, scalar_, avx2_, vnni_) \
  { .act = SERVD__ACT_Q8K, .q8k_perm = perm_, .scalar = scalar_, .avx2 = avx2_, .avx512vnni = vnni_ }
/* as Q8K, its VNNI kernel adding the residual activation level inside its own dots */
#define Q8K_FUSED(perm_, scalar_, avx2_, vnni_) \
  { \
    .act = SERVD__ACT_Q8K, .q8k_perm = perm_, .vnni_fuses_residual = true, .scalar = scalar_, .avx2 = avx2_, \
    .avx512vnni = vnni_ \
  }

const servd__dtype_cpu servd__dtype_cpu_traits[] = {
    [SERVD_F32] = FLOAT(SERVD__ACT_F32),
    [SERVD_F16] = FLOAT(SERVD__ACT_F32),
    [SERVD_BF16] = FLOAT(SERVD__ACT_F32_EVEN_ODD),
    [SERVD_I32] = {.act = SERVD__ACT_F32},
    [SERVD_Q8_0] = Q8_FUSED2(servd__mm_quant_scalar, servd__mm_quant_avx2, servd__mm_quant_avx512vnni),
    [SERVD_Q4_0] = Q8_FUSED2(servd__mm_quant_scalar, servd__mm_quant_avx2, servd__mm_quant_avx512vnni),
    [SERVD_Q4_1] = Q8_FUSED2(servd__mm_quant_scalar, servd__mm_quant_avx2, servd__mm_quant_avx512vnni),
    [SERVD_Q4_K] = Q8K_FUSED(true, servd__mm_kquant_scalar, servd__mm_kquant_avx2, servd__mm_kquant_avx512vnni),
    [SERVD_Q6_K] = Q8K_FUSED(false, servd__mm_kquant_scalar, servd__mm_kquant_avx2, servd__mm_kquant_avx512vnni),
    [SERVD_Q5_K] = Q8K_FUSED(true, servd__mm_kquant_scalar, servd__mm_kquant_avx2, servd__mm_kquant_avx512vnni),
    [SERVD_Q5_0] = Q8_FUSED(servd__mm_q5_scalar, servd__mm_q5_avx2, servd__mm_q5_avx512vnni),
    [SERVD_Q5_1] = Q8_FUSED(servd__mm_q5_scalar, servd__mm_q5_avx2, servd__mm_q5_avx512vnni),
    [SERVD_Q2_K] = Q8K_FUSED(false, servd__mm_kquant_scalar, servd__mm_lowbit_avx2, servd__mm_lowbit_k_avx512vnni),
    [SERVD_Q3_K] = Q8K_FUSED(false, servd__mm_kquant_scalar, servd__mm_lowbit_avx2, servd__mm_lowbit_k_avx512vnni),
    [SERVD_IQ4_NL] = Q8_FUSED(servd__mm_iq4nl_scalar, servd__mm_lowbit_avx2, servd__mm_quant_avx512vnni),
    [SERVD_IQ4_XS] = Q8K_FUSED(false, servd__mm_kquant_scalar, servd__mm_lowbit_avx2, servd__mm_lowbit_k_avx512vnni),
};
/* New dtypes are appended to servd/dtypes.def: a missing row here is a missing last row. */
_Static_assert(sizeof servd__dtype_cpu_traits / sizeof servd__dtype_cpu_traits[0] == SERVD_DTYPE_COUNT,
               "one CPU traits row per dtype (servd/dtypes.def)");

servd__mm_fn servd__dtype_cpu_kernel(const servd__dtype_cpu *c, servd_isa isa, bool vnni) {
  if (vnni && c->avx512vnni) return c->avx512vnni;
  if (isa == SERVD_ISA_AVX512 && c->avx512) return c->avx512;
  if (isa >= SERVD_ISA_AVX2 && c->avx2) return c->avx2;
  return c->scalar;
}
