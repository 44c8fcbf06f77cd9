/* finish_reason on the OpenAI routes: clients switch on OpenAI's set (stop, length, tool_calls,
 * content_filter, function_call) and some reject anything else, so the engine's own endings are
 * mapped onto it; the response keeps the engine's word in servd_finish_detail. */
#include <string.h>

#include "api/openai-impl.h"

const char *api_oai_finish_reason(const char *engine_reason) {
  if (!engine_reason || !*engine_reason) return "stop";
  if (strcmp(engine_reason, "length") == 0 || strcmp(engine_reason, "deadline") == 0) return "length";
  if (strcmp(engine_reason, "tool_calls") == 0 || strcmp(engine_reason, "function_call") == 0 ||
      strcmp(engine_reason, "content_filter") == 0)
    return engine_reason;
  return "stop"; /* stop, cancelled */
}
