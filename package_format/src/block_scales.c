/* Block-quantized tensors from outside (GGUF) carry f16 scales; a NaN or infinite one would turn
 * every output that touches its block into NaN far from the cause, so pack refuses it naming the
 * tensor, the block and the field. */
#include <stdio.h>

#include "import-impl.h"
#include "mpk-impl.h"
#include "servd/tensor.h"

typedef struct scale_fields {
  int n;
  int offset[2];
  const char *name[2];
} scale_fields;

static scale_fields fields_of(servd_dtype dt) {
  switch (dt) {
  case SERVD_Q8_0:
  case SERVD_Q4_0:
  case SERVD_Q5_0:
  case SERVD_IQ4_NL:
  case SERVD_IQ4_XS: return (scale_fields){1, {0}, {"d"}};
  case SERVD_Q4_1:
  case SERVD_Q5_1: return (scale_fields){2, {0, 2}, {"d", "m"}};
  case SERVD_Q4_K:
  case SERVD_Q5_K: return (scale_fields){2, {0, 2}, {"d", "dmin"}};
  case SERVD_Q2_K: return (scale_fields){2, {80, 82}, {"d", "dmin"}};
  case SERVD_Q3_K: return (scale_fields){1, {108}, {"d"}};
  case SERVD_Q6_K: return (scale_fields){1, {208}, {"d"}};
  default: return (scale_fields){0, {0}, {NULL}};
  }
}

int mpk__check_block_scales(const char *what, const char *tensor, servd_dtype dt, const void *data, uint64_t nbytes) {
  const scale_fields f = fields_of(dt);
  const size_t bb = servd_dtype_block_bytes(dt);
  if (f.n == 0 || bb == 0) return 0;
  const uint8_t *p = data;
  for (uint64_t b = 0; b < nbytes / bb; b++, p += bb) {
    for (int i = 0; i < f.n; i++) {
      const uint16_t h = rd16(p + f.offset[i]);
      if ((h & 0x7c00) == 0x7c00)
        return servd_fail(
            SERVD_EFORMAT, "%s: tensor \"%s\": %s block %llu: scale %s is %s (f16 0x%04x), expected a finite number",
            what, tensor, servd_dtype_name(dt), (unsigned long long)b, f.name[i], h & 0x3ff ? "NaN" : "infinite", h);
    }
  }
  return 0;
}
