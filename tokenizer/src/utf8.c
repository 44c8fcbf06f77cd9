/* UTF-8 classification (Unicode's "maximal subpart" replacement policy, as Rust's from_utf8_lossy
 * and Python's errors="replace" apply it) and GPT-2's byte-level alphabet. */
#include <pthread.h>

#include "tokenizer-impl.h"

int utf8__classify(const uint8_t *s, size_t n, size_t *len) {
  uint8_t c = s[0];
  if (c < 0x80) {
    *len = 1;
    return UTF8_VALID;
  }
  int need;
  uint8_t lo = 0x80, hi = 0xBF; /* range allowed for the second byte */
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F; /* surrogates */
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    *len = 1;
    return UTF8_INVALID;
  }
  size_t i = 1;
  for (; i <= (size_t)need; i++) {
    if (i >= n) {
      *len = i;
      return UTF8_INCOMPLETE;
    }
    uint8_t b = s[i];
    bool ok = i == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      *len = i;
      return UTF8_INVALID;
    }
  }
  *len = i;
  return UTF8_VALID;
}

size_t utf8__first_invalid(const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    /* ASCII fast path, 8 bytes at a time */
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, s + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (s[i] < 0x80) {
      i++;
      continue;
    }
    size_t l;
    if (utf8__classify(s + i, n - i, &l) != UTF8_VALID) return i;
    i += l;
  }
  return (size_t)-1;
}

int utf8__encode(uint32_t cp, char *out) {
  if (cp < 0x80) {
    out[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | (cp >> 18));
  out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

int utf8__decode(const uint8_t *s, size_t n, uint32_t *cp) {
  size_t l;
  if (utf8__classify(s, n, &l) != UTF8_VALID) return 0;
  switch (l) {
  case 1: *cp = s[0]; break;
  case 2: *cp = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F); break;
  case 3: *cp = ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F); break;
  default:
    *cp = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
          (s[3] & 0x3F);
  }
  return (int)l;
}

uint32_t bytelevel__byte_to_cp[256];
int16_t bytelevel__cp_to_byte[324];

static void bytelevel_build(void) {
  /* GPT-2: printable bytes map to themselves, the others to 256, 257, ... in byte order. */
  for (int i = 0; i < 324; i++) bytelevel__cp_to_byte[i] = -1;
  int next = 256;
  for (int b = 0; b < 256; b++) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    uint32_t cp = printable ? (uint32_t)b : (uint32_t)next++;
    bytelevel__byte_to_cp[b] = cp;
    bytelevel__cp_to_byte[cp] = (int16_t)b;
  }
}

void bytelevel__init(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, bytelevel_build);
}
