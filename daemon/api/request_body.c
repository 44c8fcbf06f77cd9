/* Request bodies as JSON objects, and error messages made fit for a JSON response. */
#include <stdio.h>
#include <string.h>

#include "api/request_params.h"

/* Length of the valid UTF-8 sequence at s (as jansson accepts: no overlong forms, no surrogates,
 * at most U+10FFFF); 0 when invalid, -1 when valid so far but cut by the end of the string. */
static int utf8_seq(const unsigned char *s) {
  unsigned c = s[0];
  int n;
  unsigned cp;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) n = 2, cp = c & 0x1F;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, cp = c & 0x0F;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, cp = c & 0x07;
  else return 0;
  for (int i = 1; i < n; i++) {
    if (s[i] == 0) return -1;
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

void api_utf8_fix(char *s) {
  unsigned char *u = (unsigned char *)s;
  size_t i = 0;
  while (u[i]) {
    int n = utf8_seq(u + i);
    if (n > 0) {
      i += (size_t)n;
    } else if (n < 0) {
      u[i] = 0; /* a character cut at the end */
      return;
    } else {
      u[i++] = '?';
    }
  }
}

int api_body_parse(const char *text, size_t len, json_t **out, api_param_error *err) {
  memset(err, 0, sizeof(*err));
  json_error_t jerr;
  /* The body is parsed as JSON whatever Content-Type says: curl -d sends form encoding by default. */
  json_t *body = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  *out = NULL;
  err->status = 400;
  if (!body) {
    snprintf(err->message, sizeof err->message, "malformed JSON in the request body: %s (line %d, column %d)",
             jerr.text, jerr.line, jerr.column);
    api_utf8_fix(err->message);
    return -1;
  }
  if (!json_is_object(body)) {
    json_decref(body);
    snprintf(err->message, sizeof err->message, "the request body must be a JSON object");
    return -1;
  }
  err->status = 0;
  *out = body;
  return 0;
}
