/* Zip reader over a mapped file: parses the end records (zip64 too), the central directory and
 * every local header, bounds-checking every length and offset. Packages are strict: entries tile
 * the file from offset 0 to the central directory (no holes, no overlap), no data descriptors, no
 * encryption, stored or deflated only, one disk, safe relative names, no duplicates. */
#include <stdlib.h>
#include <stdio.h>

#include "mpk-impl.h"
#include "mpk/writer.h"

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_EOCD 0x06054b50u
#define SIG_EOCD64 0x06064b50u
#define SIG_LOC64 0x07064b50u

static int cmp_name(const void *a, const void *b, void *ctx) {
  const mpk_zip *z = ctx;
  return strcmp(z->e[*(const size_t *)a].name, z->e[*(const size_t *)b].name);
}
static int cmp_lho(const void *a, const void *b, void *ctx) {
  const mpk_zip *z = ctx;
  uint64_t x = z->e[*(const size_t *)a].lho, y = z->e[*(const size_t *)b].lho;
  return x < y ? -1 : x > y;
}

/* Finds the zip64 extended information field and reads the values whose 32-bit field is saturated. */
static int read_zip64(const char *what, const char *name, const uint8_t *extra, size_t elen, uint64_t *usize,
                      uint64_t *csize, uint64_t *lho) {
  size_t i = 0;
  while (i + 4 <= elen) {
    uint16_t id = rd16(extra + i), sz = rd16(extra + i + 2);
    if (i + 4 + sz > elen)
      return servd_fail(SERVD_EFORMAT, "%s: entry \"%s\": extra field runs past its length", what, name);
    if (id == 0x0001) {
      const uint8_t *p = extra + i + 4;
      size_t left = sz;
      uint64_t *want[3] = {usize, csize, lho};
      for (int k = 0; k < 3; k++) {
        if (!want[k] || *want[k] != 0xFFFFFFFFu) continue;
        if (left < 8) return servd_fail(SERVD_EFORMAT, "%s: entry \"%s\": zip64 field too short", what, name);
        *want[k] = rd64(p);
        p += 8;
        left -= 8;
      }
      return 0;
    }
    i += 4 + (size_t)sz;
  }
  if ((usize && *usize == 0xFFFFFFFFu) || (csize && *csize == 0xFFFFFFFFu) || (lho && *lho == 0xFFFFFFFFu))
    return servd_fail(SERVD_EFORMAT, "%s: entry \"%s\": saturated size or offset without a zip64 field", what, name);
  return 0;
}

/* Unix modes (made by Unix or OS X: the high 16 bits of the external attributes) that extractors
 * honour: a symlink entry becomes a link on disk (code/x.py -> /etc/passwd), a device or FIFO a
 * special file, setuid/setgid/sticky bits privileges. Packages hold plain files and empty
 * folders only. A mode with no type bits (some writers set permissions only) is a plain file. */
static int check_mode(const char *what, const mpk_zip_entry *en, unsigned host, uint32_t ext) {
  if (host != 3 && host != 19) return 0; /* other hosts' attributes carry no Unix file type */
  unsigned mode = ext >> 16, type = mode & 0170000u;
  const char *bad = NULL;
  if (type == 0120000u) bad = "a symbolic link";
  else if (type == 0020000u || type == 0060000u) bad = "a device";
  else if (type == 0010000u) bad = "a FIFO";
  else if (type == 0140000u) bad = "a socket";
  else if (type != 0 && type != 0100000u && type != 0040000u) bad = "of an unknown file type";
  else if (mode & 07000u) bad = "setuid, setgid or sticky";
  else if (type == 0040000u && !en->is_dir) bad = "a folder with content";
  else if (type == 0100000u && en->is_dir) bad = "a regular file named like a folder";
  if (!bad) return 0;
  return servd_fail(SERVD_EFORMAT, "%s: entry \"%s\": mode 0%o is %s, expected a regular file or an empty folder", what,
                    en->name, mode, bad);
}

int mpk__zip_find(const mpk_zip *z, const char *name) {
  size_t lo = 0, hi = z->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    int c = strcmp(z->e[z->by_name[mid]].name, name);
    if (c == 0) return (int)z->by_name[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return -1;
}

void mpk__zip_free(mpk_zip *z) {
  if (!z) return;
  for (size_t i = 0; i < z->n; i++) free(z->e[i].name);
  free(z->e);
  free(z->by_name);
  memset(z, 0, sizeof *z);
}

int mpk__zip_parse(const char *what, const uint8_t *buf, size_t len, mpk_zip *z) {
  memset(z, 0, sizeof *z);
  int rc = 0;
  size_t *order = NULL;
  if (len < 22) return servd_fail(SERVD_EFORMAT, "%s: %zu bytes, too short for a zip (end record is 22)", what, len);

  /* End of central directory: the last signature whose comment reaches exactly to the end. */
  size_t eocd = SIZE_MAX;
  size_t lowest = len - 22 > 65535 ? len - 22 - 65535 : 0;
  for (size_t p = len - 22 + 1; p-- > lowest;) {
    if (rd32(buf + p) == SIG_EOCD && p + 22 + rd16(buf + p + 20) == len) {
      eocd = p;
      break;
    }
  }
  if (eocd == SIZE_MAX)
    return servd_fail(SERVD_EFORMAT, "%s: no zip end-of-central-directory record (truncated or not a zip)", what);
  const uint8_t *e = buf + eocd;
  if (rd16(e + 4) != 0 || rd16(e + 6) != 0)
    return servd_fail(SERVD_EFORMAT, "%s: end record: multi-disk archives are not supported", what);
  uint64_t n = rd16(e + 10), cd_size = rd32(e + 12), cd_off = rd32(e + 16);
  if (rd16(e + 8) != rd16(e + 10))
    return servd_fail(SERVD_EFORMAT, "%s: end record: entries on disk != total entries", what);
  uint64_t cd_end_limit = eocd; /* the central directory ends where the end records start */
  if (n == 0xFFFF || cd_size == 0xFFFFFFFFu || cd_off == 0xFFFFFFFFu) {
    if (eocd < 20 || rd32(buf + eocd - 20) != SIG_LOC64)
      return servd_fail(SERVD_EFORMAT, "%s: end record has saturated fields but no zip64 locator", what);
    uint64_t e64 = rd64(buf + eocd - 20 + 8);
    if (e64 > eocd - 20 || eocd - 20 - e64 < 56 || rd32(buf + e64) != SIG_EOCD64)
      return servd_fail(SERVD_EFORMAT, "%s: zip64 end record: offset %llu, expected a record before the locator", what,
                        (unsigned long long)e64);
    const uint8_t *r = buf + e64;
    if (rd32(r + 16) != 0 || rd32(r + 20) != 0 || rd64(r + 24) != rd64(r + 32))
      return servd_fail(SERVD_EFORMAT, "%s: zip64 end record: multi-disk archives are not supported", what);
    n = rd64(r + 32);
    cd_size = rd64(r + 40);
    cd_off = rd64(r + 48);
    cd_end_limit = e64;
  }
  uint64_t cd_end;
  if (!mpk__add(cd_off, cd_size, &cd_end) || cd_end != cd_end_limit)
    return servd_fail(SERVD_EFORMAT, "%s: central directory [%llu, +%llu) must end at the end record (%llu)", what,
                      (unsigned long long)cd_off, (unsigned long long)cd_size, (unsigned long long)cd_end_limit);
  if (n > cd_size / 46)
    return servd_fail(SERVD_EFORMAT, "%s: %llu entries cannot fit in a central directory of %llu bytes", what,
                      (unsigned long long)n, (unsigned long long)cd_size);
  z->cd_offset = cd_off;
  z->e = calloc(n ? n : 1, sizeof *z->e);
  z->by_name = calloc(n ? n : 1, sizeof *z->by_name);
  order = calloc(n ? n : 1, sizeof *order);
  if (!z->e || !z->by_name || !order) {
    rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", what);
    goto fail;
  }

  uint64_t p = cd_off;
  for (uint64_t i = 0; i < n; i++) {
    if (cd_end - p < 46 || rd32(buf + p) != SIG_CENTRAL) {
      rc = servd_fail(SERVD_EFORMAT, "%s: central directory entry %llu: bad signature or truncated", what,
                      (unsigned long long)i);
      goto fail;
    }
    const uint8_t *c = buf + p;
    uint16_t flags = rd16(c + 8), method = rd16(c + 10), nlen = rd16(c + 28), elen = rd16(c + 30), clen = rd16(c + 32);
    if (cd_end - p - 46 < (uint64_t)nlen + elen + clen) {
      rc = servd_fail(SERVD_EFORMAT, "%s: central directory entry %llu: name/extra/comment run past the directory",
                      what, (unsigned long long)i);
      goto fail;
    }
    mpk_zip_entry *en = &z->e[i];
    en->name = malloc((size_t)nlen + 1);
    if (!en->name) {
      rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", what);
      goto fail;
    }
    memcpy(en->name, c + 46, nlen);
    en->name[nlen] = 0;
    z->n = i + 1;
    if (memchr(c + 46, 0, nlen)) {
      rc = servd_fail(SERVD_EFORMAT, "%s: entry %llu: NUL byte in name", what, (unsigned long long)i);
      goto fail;
    }
    if ((rc = mpk_check_entry_path(what, en->name, nlen))) goto fail;
    if (flags & (1u | 8u | 64u)) {
      rc = servd_fail(SERVD_EFORMAT, "%s: entry \"%s\": flags 0x%x, expected no encryption and no data descriptor",
                      what, en->name, flags);
      goto fail;
    }
    if (method != 0 && method != 8) {
      rc = servd_fail(SERVD_EFORMAT, "%s: entry \"%s\": compression method %u, expected 0 (stored) or 8 (deflate)",
                      what, en->name, method);
      goto fail;
    }
    if (rd16(c + 34) != 0) {
      rc = servd_fail(SERVD_EFORMAT, "%s: entry \"%s\": on another disk", what, en->name);
      goto fail;
    }
    en->method = method;
    en->crc = rd32(c + 16);
    en->csize = rd32(c + 20);
    en->usize = rd32(c + 24);
    en->lho = rd32(c + 42);
    if ((rc = read_zip64(what, en->name, c + 46 + nlen, elen, &en->usize, &en->csize, &en->lho))) goto fail;
    en->is_dir = en->name[nlen - 1] == '/';
    if (en->is_dir && (en->usize || en->csize)) {
      rc = servd_fail(SERVD_EFORMAT, "%s: entry \"%s\": a folder entry with data", what, en->name);
      goto fail;
    }
    if ((rc = check_mode(what, en, rd16(c + 4) >> 8, rd32(c + 38)))) goto fail;
    if (method == 0 && en->csize != en->usize) {
      rc = servd_fail(SERVD_EFORMAT, "%s: entry \"%s\": stored with %llu bytes but %llu uncompressed", what, en->name,
                      (unsigned long long)en->csize, (unsigned long long)en->usize);
      goto fail;
    }
    /* The local header must agree with the central directory. */
    uint64_t lh = en->lho;
    if (lh >= cd_off || cd_off - lh < 30 || rd32(buf + lh) != SIG_LOCAL) {
      rc = servd_fail(SERVD_EFORMAT, "%s: entry \"%s\": local header at %llu: bad signature or outside [0, %llu)", what,
                      en->name, (unsigned long long)lh, (unsigned long long)cd_off);
      goto fail;
    }
    const uint8_t *l = buf + lh;
    uint16_t lnlen = rd16(l + 26), lelen = rd16(l + 28);
    if (cd_off - lh - 30 < (uint64_t)lnlen + lelen || lnlen != nlen || memcmp(l + 30, c + 46, nlen) != 0) {
      rc = servd_fail(SERVD_EFORMAT, "%s: entry \"%s\": local header name differs from the central directory", what,
                      en->name);
      goto fail;
    }
    uint64_t lcs = rd32(l + 18), lus = rd32(l + 22);
    if ((rc = read_zip64(what, en->name, l + 30 + lnlen, lelen, &lus, &lcs, NULL))) goto fail;
    if (rd16(l + 6) != flags || rd16(l + 8) != method || rd32(l + 14) != en->crc || lcs != en->csize ||
        lus != en->usize) {
      rc = servd_fail(SERVD_EFORMAT,
                      "%s: entry \"%s\": local header flags/method/crc/sizes differ from the central directory", what,
                      en->name);
      goto fail;
    }
    en->data = lh + 30 + lnlen + lelen;
    uint64_t dend;
    if (!mpk__add(en->data, en->csize, &dend) || dend > cd_off) {
      rc = servd_fail(SERVD_EFORMAT, "%s: entry \"%s\": data [%llu, +%llu) runs past the central directory at %llu",
                      what, en->name, (unsigned long long)en->data, (unsigned long long)en->csize,
                      (unsigned long long)cd_off);
      goto fail;
    }
    p += 46 + (uint64_t)nlen + elen + clen;
  }
  if (p != cd_end) {
    rc = servd_fail(SERVD_EFORMAT, "%s: central directory has %llu trailing bytes", what,
                    (unsigned long long)(cd_end - p));
    goto fail;
  }

  for (size_t i = 0; i < z->n; i++) z->by_name[i] = order[i] = i;
  qsort_r(z->by_name, z->n, sizeof *z->by_name, cmp_name, z);
  qsort_r(order, z->n, sizeof *order, cmp_lho, z);
  for (size_t i = 1; i < z->n; i++) {
    if (strcmp(z->e[z->by_name[i - 1]].name, z->e[z->by_name[i]].name) == 0) {
      rc = servd_fail(SERVD_EFORMAT, "%s: duplicate entry \"%s\"", what, z->e[z->by_name[i]].name);
      goto fail;
    }
  }
  /* Entries tile [0, cd_off): each local header starts where the previous data ended. */
  uint64_t expect = 0;
  for (size_t i = 0; i < z->n; i++) {
    const mpk_zip_entry *en = &z->e[order[i]];
    if (en->lho != expect) {
      rc = servd_fail(SERVD_EFORMAT, "%s: entry \"%s\" starts at %llu, expected %llu (%s)", what, en->name,
                      (unsigned long long)en->lho, (unsigned long long)expect, en->lho < expect ? "overlap" : "hole");
      goto fail;
    }
    expect = en->data + en->csize;
  }
  if (expect != cd_off) {
    rc = servd_fail(SERVD_EFORMAT, "%s: %llu bytes between the last entry and the central directory, expected none",
                    what, (unsigned long long)(cd_off - expect));
    goto fail;
  }
  free(order);
  return 0;
fail:
  free(order);
  mpk__zip_free(z);
  return rc;
}

size_t mpk__zip_end_records(uint8_t t[MPK_ZIP_END_MAX], uint64_t n, uint64_t cd_start, uint64_t cd_size, bool z64) {
  size_t tl = 0;
  if (z64) {
    wr32(t, 0x06064b50); /* ZIP64 end of central directory record */
    wr64(t + 4, 44);
    wr16(t + 12, (3 << 8) | 45);
    wr16(t + 14, 45);
    wr32(t + 16, 0);
    wr32(t + 20, 0);
    wr64(t + 24, n);
    wr64(t + 32, n);
    wr64(t + 40, cd_size);
    wr64(t + 48, cd_start);
    wr32(t + 56, 0x07064b50); /* its locator */
    wr32(t + 60, 0);
    wr64(t + 64, cd_start + cd_size);
    wr32(t + 72, 1);
    tl = 76;
  }
  uint8_t *e = t + tl;
  wr32(e, 0x06054b50);
  wr16(e + 4, 0);
  wr16(e + 6, 0);
  wr16(e + 8, z64 ? 0xFFFF : (uint16_t)n);
  wr16(e + 10, z64 ? 0xFFFF : (uint16_t)n);
  wr32(e + 12, z64 ? 0xFFFFFFFFu : (uint32_t)cd_size);
  wr32(e + 16, z64 ? 0xFFFFFFFFu : (uint32_t)cd_start);
  wr16(e + 20, 0);
  return tl + 22;
}
