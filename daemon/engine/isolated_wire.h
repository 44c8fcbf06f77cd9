/* Messages between servd and the process of an isolated model (isolated.h), over one end of a
 * SOCK_STREAM socketpair each. Both ends run the same servd binary, so the layout is the host's.
 *
 * A message is an iso_hdr followed by hdr.len payload bytes; a message may carry one file
 * descriptor (SCM_RIGHTS, sent with its first byte): a sealed-size memfd holding its large tensors.
 *
 *   HELLO   servd -> child   JSON text: the model's options (path, name, interpreters, ...)
 *   READY   child -> servd   iso_status: the load's result
 *   PREDICT servd -> child   iso_call_head, n iso_tensor, inline data        (id: the call)
 *   RESULT  child -> servd   iso_status, n iso_tensor, inline data           (id: the call)
 *
 * Tensors smaller than ISO_INLINE_MAX bytes travel in the payload (64-byte aligned offsets from
 * the start of the inline data); larger ones in the memfd, mapped by the receiver (no copy there).
 */
#ifndef SERVD_ENGINE_ISOLATED_WIRE_H
#define SERVD_ENGINE_ISOLATED_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/types.h"

#define ISO_MAGIC 0x6f737673u /* "svso" */
#define ISO_INLINE_MAX (64u << 10)
#define ISO_MAX_TENSORS 1024
#define ISO_MAX_PAYLOAD (1ull << 32)

typedef enum iso_msg { ISO_HELLO = 1, ISO_READY = 2, ISO_PREDICT = 3, ISO_RESULT = 4 } iso_msg;

typedef struct iso_hdr {
  uint32_t magic, type;
  uint64_t id;
  uint64_t len;   /* payload bytes */
  int32_t has_fd; /* one descriptor came with this header */
  int32_t pad;
} iso_hdr;

typedef struct iso_call_head {
  int64_t deadline_ms;
  uint32_t n;
  uint32_t pad;
} iso_call_head;

typedef struct iso_status {
  int32_t rc;
  uint32_t n;    /* tensors that follow */
  char type[64]; /* servd_model_error */
  char message[512];
  char error[1024]; /* servd_last_error() of the failure */
} iso_status;

typedef struct iso_tensor {
  char name[64];
  int32_t dtype, ndim;
  int64_t shape[SERVD_MAX_DIMS];
  uint64_t nbytes, offset;
  uint32_t in_shm, pad;
} iso_tensor;

/* A message received: the payload (64-byte aligned, malloc'd) and the descriptor it carried (-1). */
typedef struct iso_frame {
  iso_hdr h;
  void *payload;
  int fd;
} iso_frame;

/* Sends header + head (head_len bytes) + the tensors (descriptors, inline data, a memfd for the large
 * ones). Not thread-safe on one socket: callers serialize. 0 or a negative SERVD_E*. */
int iso_send(int sock, iso_msg type, uint64_t id, const void *head, size_t head_len, const servd_named_tensor *t,
             int n);
/* Receives one message into *f (iso_frame_free releases it). 0, SERVD_ECANCELED at a clean end of the
 * stream (the peer closed it), or another negative SERVD_E*. */
int iso_recv(int sock, iso_frame *f);
void iso_frame_free(iso_frame *f);
/* Tensors of a PREDICT/RESULT payload after a head of head_len bytes whose count is n. The frame's
 * payload and memfd are handed to the tensors' storage (no copy); f is emptied. *out (calloc'd, the
 * caller frees it and releases the tensors) has n entries. */
int iso_take_tensors(iso_frame *f, size_t head_len, uint32_t n, servd_named_tensor **out);

#endif
