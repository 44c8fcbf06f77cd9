/* Messages between servd and an isolated model's process: see isolated_wire.h. */
#include "engine/isolated_wire.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define ALIGN64(x) (((x) + 63) & ~(uint64_t)63)

static int write_all(int sock, struct iovec *iov, int n, int fd) {
  char cbuf[CMSG_SPACE(sizeof(int))];
  bool send_fd = fd >= 0;
  while (n > 0) {
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    if (send_fd) {
      memset(cbuf, 0, sizeof cbuf);
      mh.msg_control = cbuf;
      mh.msg_controllen = sizeof cbuf;
      struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    ssize_t w = sendmsg(sock, &mh, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return servd_fail(SERVD_EIO, "isolated model: send: %s", strerror(errno));
    }
    send_fd = false; /* the descriptor went with the first byte */
    while (n > 0 && (size_t)w >= iov->iov_len) {
      w -= (ssize_t)iov->iov_len;
      iov++;
      n--;
    }
    if (n > 0) {
      iov->iov_base = (char *)iov->iov_base + w;
      iov->iov_len -= (size_t)w;
    }
  }
  return 0;
}

/* Contiguous bytes of t into dst (plain dtypes may be strided views: copied element by element). */
static int copy_out(const servd_tensor *t, char *dst) {
  if (servd_tensor_is_contiguous(t)) {
    memcpy(dst, servd_tensor_data(t), servd_tensor_nbytes(t));
    return 0;
  }
  if (servd_dtype_is_quantized(t->dtype))
    return servd_fail(SERVD_EUNSUPPORTED, "isolated model: a non-contiguous %s tensor", servd_dtype_name(t->dtype));
  size_t es = servd_dtype_block_bytes(t->dtype);
  int64_t idx[SERVD_MAX_DIMS] = {0}, n = servd_tensor_numel(t);
  const char *base = servd_tensor_data(t);
  for (int64_t k = 0; k < n; k++) {
    int64_t off = 0;
    for (int d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
    memcpy(dst + (size_t)k * es, base + off, es);
    for (int d = t->ndim - 1; d >= 0; d--) {
      if (++idx[d] < t->shape[d]) break;
      idx[d] = 0;
    }
  }
  return 0;
}

static size_t data_bytes(const servd_tensor *t) {
  if (servd_tensor_is_contiguous(t)) return servd_tensor_nbytes(t);
  return (size_t)servd_tensor_numel(t) * servd_dtype_block_bytes(t->dtype); /* plain dtypes (copy_out) */
}

int iso_send(int sock, iso_msg type, uint64_t id, const void *head, size_t head_len, const servd_named_tensor *t,
             int n) {
  if (n < 0 || n > ISO_MAX_TENSORS) return servd_fail(SERVD_EINVAL, "isolated model: %d tensors", n);
  iso_tensor *desc = n ? calloc((size_t)n, sizeof *desc) : NULL;
  if (n && !desc) return servd_fail(SERVD_ENOMEM, "isolated model: tensor descriptors");
  uint64_t inline_len = 0, shm_len = 0;
  for (int i = 0; i < n; i++) {
    const servd_tensor *x = t[i].tensor;
    iso_tensor *d = &desc[i];
    if (x->device >= 0) {
      free(desc);
      return servd_fail(SERVD_EUNSUPPORTED, "isolated model: tensor \"%s\" is on a device", t[i].name);
    }
    memcpy(d->name, t[i].name, sizeof d->name);
    d->name[sizeof d->name - 1] = 0;
    d->dtype = (int32_t)x->dtype;
    d->ndim = x->ndim;
    memcpy(d->shape, x->shape, sizeof d->shape);
    d->nbytes = data_bytes(x);
    d->in_shm = d->nbytes >= ISO_INLINE_MAX;
    uint64_t *len = d->in_shm ? &shm_len : &inline_len;
    d->offset = ALIGN64(*len);
    *len = d->offset + d->nbytes;
  }
  /* Inline data starts 64-byte aligned within the payload, so the receiver can wrap it in place. */
  uint64_t pre = head_len + (uint64_t)n * sizeof(iso_tensor), pad = inline_len ? ALIGN64(pre) - pre : 0;
  char *inl = NULL, *shm = MAP_FAILED;
  int memfd = -1, rc = 0;
  if (inline_len && !(inl = malloc(inline_len))) {
    rc = servd_fail(SERVD_ENOMEM, "isolated model: %llu bytes of tensors", (unsigned long long)inline_len);
    goto out;
  }
  if (shm_len) {
    if ((memfd = memfd_create("servd-tensors", MFD_CLOEXEC)) < 0 || ftruncate(memfd, (off_t)shm_len) < 0 ||
        (shm = mmap(NULL, shm_len, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0)) == MAP_FAILED) {
      rc = servd_fail(SERVD_ENOMEM, "isolated model: shared memory of %llu bytes: %s", (unsigned long long)shm_len,
                      strerror(errno));
      goto out;
    }
  }
  for (int i = 0; i < n; i++)
    if ((rc = copy_out(t[i].tensor, (desc[i].in_shm ? shm : inl) + desc[i].offset))) goto out;
  static const char zeros[64];
  iso_hdr h = {.magic = ISO_MAGIC, .type = type, .id = id, .len = pre + pad + inline_len, .has_fd = memfd >= 0};
  struct iovec iov[5] = {{&h, sizeof h},
                         {(void *)head, head_len},
                         {desc, (size_t)n * sizeof(iso_tensor)},
                         {(void *)zeros, (size_t)pad},
                         {inl, (size_t)inline_len}};
  rc = write_all(sock, iov, 5, memfd);
out:
  if (shm != MAP_FAILED) munmap(shm, shm_len);
  if (memfd >= 0) close(memfd);
  free(inl);
  free(desc);
  return rc;
}

/* Reads exactly len bytes; takes a descriptor that comes with them into *fd. */
static int read_all(int sock, void *buf, size_t len, int *fd, bool *eof_at_start) {
  size_t got = 0;
  while (got < len) {
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {(char *)buf + got, len - got};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    ssize_t r = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR) continue;
      return servd_fail(SERVD_EIO, "isolated model: receive: %s", strerror(errno));
    }
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        int got_fd;
        memcpy(&got_fd, CMSG_DATA(c), sizeof got_fd);
        if (fd && *fd < 0) *fd = got_fd;
        else close(got_fd);
      }
    }
    if (r == 0) {
      if (eof_at_start) *eof_at_start = got == 0;
      return servd_fail(SERVD_ECANCELED, "isolated model: the connection ended");
    }
    got += (size_t)r;
  }
  return 0;
}

int iso_recv(int sock, iso_frame *f) {
  memset(f, 0, sizeof *f);
  f->fd = -1;
  bool clean = false;
  int rc = read_all(sock, &f->h, sizeof f->h, &f->fd, &clean);
  if (rc) {
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    return rc == SERVD_ECANCELED && !clean ? servd_fail(SERVD_EIO, "isolated model: a message was cut short") : rc;
  }
  if (f->h.magic != ISO_MAGIC || f->h.len > ISO_MAX_PAYLOAD || (f->h.has_fd != 0) != (f->fd >= 0)) {
    rc = servd_fail(SERVD_EFORMAT, "isolated model: a malformed message (type %u, %llu bytes)", f->h.type,
                    (unsigned long long)f->h.len);
    goto fail;
  }
  if (f->h.len) {
    if (!(f->payload = aligned_alloc(64, ALIGN64(f->h.len)))) {
      rc = servd_fail(SERVD_ENOMEM, "isolated model: a message of %llu bytes", (unsigned long long)f->h.len);
      goto fail;
    }
    if ((rc = read_all(sock, f->payload, f->h.len, NULL, NULL))) {
      if (rc == SERVD_ECANCELED) rc = servd_fail(SERVD_EIO, "isolated model: a message was cut short");
      goto fail;
    }
  }
  return 0;
fail:
  iso_frame_free(f);
  return rc;
}

void iso_frame_free(iso_frame *f) {
  free(f->payload);
  f->payload = NULL;
  if (f->fd >= 0) close(f->fd);
  f->fd = -1;
}

typedef struct shm_map {
  void *p;
  size_t len;
} shm_map;

static void unmap(void *ctx) {
  shm_map *m = ctx;
  munmap(m->p, m->len);
  free(m);
}

int iso_take_tensors(iso_frame *f, size_t head_len, uint32_t n, servd_named_tensor **out) {
  *out = NULL;
  if (n > ISO_MAX_TENSORS) return servd_fail(SERVD_EFORMAT, "isolated model: %u tensors", n);
  uint64_t pre = head_len + (uint64_t)n * sizeof(iso_tensor), start = ALIGN64(pre);
  if (f->h.len < pre || (n && !f->payload)) return servd_fail(SERVD_EFORMAT, "isolated model: a short message");
  const iso_tensor *desc = (const iso_tensor *)((const char *)f->payload + head_len);
  uint64_t inline_len = f->h.len > start ? f->h.len - start : 0;
  servd_storage *inl = NULL, *shm = NULL;
  servd_named_tensor *t = calloc((size_t)n + 1, sizeof *t);
  int rc = 0;
  if (!t) return servd_fail(SERVD_ENOMEM, "isolated model: tensors");
  if (f->fd >= 0) {
    off_t size = lseek(f->fd, 0, SEEK_END);
    shm_map *m = calloc(1, sizeof *m);
    void *p = size > 0 ? mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, f->fd, 0) : MAP_FAILED;
    if (!m || p == MAP_FAILED || !(shm = servd_storage_wrap(p, (size_t)size, unmap, m))) {
      if (p != MAP_FAILED) munmap(p, (size_t)size);
      free(m);
      rc = servd_fail(SERVD_ENOMEM, "isolated model: mapping shared tensors: %s", strerror(errno));
      goto out;
    }
    m->p = p;
    m->len = (size_t)size;
    close(f->fd);
    f->fd = -1;
  }
  for (uint32_t i = 0; i < n; i++) {
    const iso_tensor *d = &desc[i];
    servd_storage *s = d->in_shm ? shm : inl;
    if (!d->in_shm && !inl) {
      /* The payload becomes the inline tensors' storage (freed with the last of them). */
      if (!(s = inl = servd_storage_wrap((char *)f->payload + start, inline_len, free, f->payload))) {
        rc = servd_fail(SERVD_ENOMEM, "isolated model: tensors");
        goto out;
      }
      f->payload = NULL;
    }
    if (!s || d->ndim < 0 || d->ndim > SERVD_MAX_DIMS || d->offset + d->nbytes < d->offset ||
        d->offset + d->nbytes > servd_storage_bytes(s)) {
      rc = servd_fail(SERVD_EFORMAT, "isolated model: tensor %u lies outside its message", i);
      goto out;
    }
    memcpy(t[i].name, d->name, sizeof t[i].name);
    t[i].name[sizeof t[i].name - 1] = 0;
    if (!(t[i].tensor = servd_tensor_from_storage(s, d->offset, (servd_dtype)d->dtype, d->ndim, d->shape))) {
      rc = servd_fail(SERVD_EFORMAT, "isolated model: tensor \"%s\": %s", t[i].name, servd_last_error());
      goto out;
    }
  }
out:
  servd_storage_release(inl); /* the tensors hold their own references */
  servd_storage_release(shm);
  if (rc) {
    for (uint32_t i = 0; i < n; i++) servd_tensor_release(t[i].tensor);
    free(t);
    return rc;
  }
  *out = t;
  return 0;
}
