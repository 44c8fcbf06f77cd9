/* Kept in a file of its own: only programs that use the real engine link against it. */
#include "api/model_ops.h"
#include "servd/interp.h"

const servd_model_ops servd_engine_model_ops = {
    .options_default = servd_model_options_default,
    .gen_params_default = servd_gen_params_default,
    .load = servd_model_load,
    .unload = servd_model_unload,
    .name = servd_model_name,
    .kind = servd_model_get_kind,
    .ready = servd_model_ready,
    .metadata = servd_model_metadata,
    .tokenize = servd_model_tokenize,
    .detokenize = servd_model_detokenize,
    .apply_chat_template = servd_model_apply_chat_template,
    .context_length = servd_model_context_length,
    .submit = servd_model_submit,
    .cancel = servd_request_cancel,
    .release = servd_request_release,
    .predict = servd_model_predict,
    .get_stats = servd_model_get_stats,
    .guide_compile = servd_model_guide_compile,
    .restarting = servd_model_restarting,
    .quarantined_interpreters = servd_engine_quarantined_interpreters,
    .tools_render = servd_model_tools_render,
    .tools_parse = servd_model_tools_parse,
    .model_gen_params_default = servd_model_gen_params_default,
    .vocab_size = servd_model_vocab_size,
    .embedding_info = servd_model_embedding_info,
    .interpreter_namespaces_free = servd_interp_namespaces_free,
    .release_kv = servd_model_release_kv,
};
