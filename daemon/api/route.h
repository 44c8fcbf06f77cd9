/* The route table of the HTTP API: one row per (methods, path pattern), with the metric label, the
 * flags the router enforces and the handler it calls. The table is api_routes (routes.c); the
 * router (router.c) matches a request against it, answers 401, 404 and 405 itself (405 with an
 * Allow header built from every row whose pattern matches), and calls the row's handler.
 *
 * Patterns are literal segments and captures: "{model}" and "{version}" each match one non-empty
 * path segment. A {version} other than API_MODEL_VERSION is a 404 (every model has one version).
 */
#ifndef SERVD_API_ROUTE_H
#define SERVD_API_ROUTE_H

#include <stdbool.h>
#include <stddef.h>

#include "api/api.h"

#define API_MODEL_VERSION "1"

struct api_model;

/* What the router hands a handler. Strings live in the request's arena (valid until the response
 * completes); am is borrowed from the API's model list. */
typedef struct api_route_args {
  const char *model;    /* the {model} capture, or NULL */
  const char *version;  /* the {version} capture, or NULL */
  struct api_model *am; /* with API_ROUTE_MODEL: the model named by {model}, never NULL */
  const char *lora;     /* {model} named a LoRA adapter of am (engine.h), else NULL */
} api_route_args;

typedef void (*api_handler)(servd_api *a, servd_http_req *r, const api_route_args *args);

/* Methods a row accepts (a bit set). */
enum { API_GET = 1u << 0, API_HEAD = 1u << 1, API_POST = 1u << 2 };

/* What the router does before the handler runs. */
enum {
  API_ROUTE_PUBLIC = 1u << 0,    /* no API key needed (health probes) */
  API_ROUTE_OAI = 1u << 1,       /* errors in OpenAI's shape, else KServe v2's */
  API_ROUTE_MODEL = 1u << 2,     /* {model} must name a model known to the server: 404 otherwise */
  API_ROUTE_METRICS = 1u << 3,   /* public when servd_api_options.metrics_public (Prometheus scrapers) */
  API_ROUTE_ANTHROPIC = 1u << 4, /* errors in Anthropic's shape (api_anthropic_error) */
};

typedef struct api_route {
  unsigned methods;
  const char *pattern;
  const char *label; /* metric label and access log route: the template, shared by versioned rows */
  unsigned flags;
  api_handler handler;
} api_route;

extern const api_route api_routes[];
extern const size_t api_n_routes;

/* A capture: a span of the path. */
typedef struct api_route_span {
  const char *p;
  size_t n;
} api_route_span;

/* Whether path matches pattern; fills model and version with the captures (n = 0 when the pattern
 * has none). Pure: the router's matching, exposed for the tests. */
bool api_route_match(const char *pattern, const char *path, api_route_span *model, api_route_span *version);

/* The method's bit (API_GET, ...), 0 for a method no row can accept. */
unsigned api_route_method_bit(const char *method);

#endif
