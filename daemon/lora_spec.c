/* servd --lora: see lora_spec.h. */
#include "lora_spec.h"

#include <stdio.h>
#include <string.h>

#include "servd/status.h"

int servd_lora_spec_parse(const char *spec, servd_lora_spec *out) {
  memset(out, 0, sizeof *out);
  const char *eq = strchr(spec, '=');
  if (!eq || eq == spec || !eq[1] || (size_t)(eq - spec) >= sizeof out->name)
    return servd_fail(SERVD_EINVAL, "--lora %s: expected NAME=PATH[,base=MODEL] (a name of 1 to %zu bytes)", spec,
                      sizeof out->name - 1);
  memcpy(out->name, spec, (size_t)(eq - spec));
  const char *path = eq + 1, *opt = strstr(path, ",base=");
  size_t plen = opt ? (size_t)(opt - path) : strlen(path);
  if (!plen || plen >= sizeof out->path) return servd_fail(SERVD_EINVAL, "--lora %s: expected a path after '='", spec);
  memcpy(out->path, path, plen);
  if (opt) {
    const char *base = opt + 6;
    if (!base[0] || strlen(base) >= sizeof out->base || strchr(base, ','))
      return servd_fail(SERVD_EINVAL, "--lora %s: expected base=MODEL, the name of a served model, last", spec);
    snprintf(out->base, sizeof out->base, "%s", base);
  }
  return 0;
}
