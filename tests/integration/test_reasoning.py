"""Reasoning output against servd serving tiny random-weight Llamas with reasoning templates: "qwen3" with
Qwen3's real chat template (tests/integration/fixtures/qwen3_chat_template.jinja), its output forced to
"<think>...</think>answer" by guided_regex so the test is deterministic, and "r1" with a DeepSeek-R1-style
template whose prompt opens the thought. The thought comes back apart from the answer, streamed and not:
reasoning_content through the openai client, thinking blocks (before the text, Anthropic's block order)
through the anthropic client, reasoning items on /v1/responses, message.thinking through the ollama
client; chat_template_kwargs (enable_thinking) reaches the template, Anthropic's thinking and Ollama's
think map onto it; a tool call after the thought is still parsed."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, parse_args, python_deps, skip, tiny_llama_long  # noqa: E402

a = parse_args()
try:
    import anthropic
    import ollama
    import openai
except ImportError as e:
    skip(f"{e.name} is not installed (use .venv-test)")
deps = python_deps(a, "llguidance")  # guided_regex forces the thought
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "fixtures", "qwen3_chat_template.jinja")) as f:
    QWEN3 = f.read()
# DeepSeek-R1's templates end the generation prompt with "<think>\n": the output starts inside the thought.
R1 = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n"
      "{% if enable_thinking is defined and enable_thinking is false %}</think>\n\n{% endif %}{% endif %}")
s = Servd(a, ["--model", f"{tiny_llama_long(a, 'reasoning-qwen3', template=QWEN3)}:qwen3",
              "--model", f"{tiny_llama_long(a, 'reasoning-r1', template=R1)}:r1"], env={"SERVD_PY_DEPS": deps})
ask = [{"role": "user", "content": "What is the capital of France?"}]
THOUGHT, ANSWER = "The capital is Paris.", "Paris."
FORCED = r"<think>\nThe capital is Paris\.\n</think>\n\nParis\."
oai = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=120)

# ---- chat completions: reasoning_content ---------------------------------------------------------
r = oai.chat.completions.create(model="qwen3", messages=ask, max_tokens=64, extra_body={"guided_regex": FORCED})
m = r.choices[0].message
check(m.reasoning_content == THOUGHT and m.content == ANSWER, f"split: {m}")
check(r.choices[0].finish_reason == "stop", f"{r.choices[0]}")

chunks = list(oai.chat.completions.create(model="qwen3", messages=ask, max_tokens=64, stream=True,
                                          extra_body={"guided_regex": FORCED}))
kinds, think, text = [], "", ""
for c in chunks:
    for ch in c.choices:
        d = ch.delta
        rc = getattr(d, "reasoning_content", None) or (d.model_extra or {}).get("reasoning_content")
        if rc:
            think += rc
            kinds.append("r")
        if d.content:
            text += d.content
            kinds.append("c")
check(think == THOUGHT and text == ANSWER, f"streamed split: {think!r} {text!r}")
k = "".join(kinds)
check("c" in k and "r" not in k[k.index("c"):], f"the thought streams before the answer: {k}")
check(kinds.count("r") > 1, f"the thought streams in pieces: {kinds}")

# chat_template_kwargs reaches Qwen3's template: enable_thinking false closes the thought in the prompt
# ("<think>\n\n</think>\n\n"), and the parser then leaves the output alone.
st, t_on = s.json("POST", "/tokenize", {"model": "qwen3", "messages": ask})
st2, t_off = s.json("POST", "/tokenize", {"model": "qwen3", "messages": ask,
                                          "chat_template_kwargs": {"enable_thinking": False}})
check(st == 200 and st2 == 200, f"tokenize {st} {t_on} {st2} {t_off}")
st, d = s.json("POST", "/detokenize", {"model": "qwen3", "tokens": t_off["tokens"]})
check(d["prompt"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), f"enable_thinking false: {d}")
st, d = s.json("POST", "/detokenize", {"model": "qwen3", "tokens": t_on["tokens"]})
check(d["prompt"].endswith("<|im_start|>assistant\n"), f"default: {d}")
r = oai.chat.completions.create(model="qwen3", messages=ask, max_tokens=64,
                                extra_body={"guided_regex": FORCED, "chat_template_kwargs": {"enable_thinking": False}})
m = r.choices[0].message
check(getattr(m, "reasoning_content", None) is None and m.content.startswith("<think>"), f"thinking off: {m}")
st, e = s.json("POST", "/v1/chat/completions", {"model": "qwen3", "messages": ask, "chat_template_kwargs": [1]})
check(st == 400 and e["error"]["param"] == "chat_template_kwargs", f"{st} {e}")
st, e = s.json("POST", "/v1/completions", {"model": "qwen3", "prompt": "x", "chat_template_kwargs": {}})
check(st == 400 and e["error"]["param"] == "chat_template_kwargs", f"{st} {e}")

# A tool call after the thought: parsed from the answer, the thought kept.
tools = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}}}}]
CALL = r'<think>\nI will call f\.\n</think>\n\n<tool_call>\n\{"name": "f", "arguments": \{"x": 1\}\}\n</tool_call>'
r = oai.chat.completions.create(model="qwen3", messages=ask, max_tokens=96, tools=tools,
                                extra_body={"guided_regex": CALL})
m = r.choices[0].message
check(r.choices[0].finish_reason == "tool_calls" and m.reasoning_content == "I will call f." and not m.content,
      f"call after thought: {r.choices[0]}")
check(m.tool_calls[0].function.name == "f" and json.loads(m.tool_calls[0].function.arguments) == {"x": 1}, f"{m}")
chunks = list(oai.chat.completions.create(model="qwen3", messages=ask, max_tokens=96, tools=tools, stream=True,
                                          extra_body={"guided_regex": CALL}))
think = "".join((ch.delta.model_extra or {}).get("reasoning_content") or "" for c in chunks for ch in c.choices)
calls = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
content = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
check(think == "I will call f." and calls and calls[0].function.name == "f" and content == "",
      f"streamed call after thought: {think!r} {calls} {content!r}")

# ---- /v1/messages: thinking blocks first --------------------------------------------------------
ac = anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0, timeout=120)
r = ac.messages.create(model="qwen3", messages=ask, max_tokens=64, extra_body={"guided_regex": FORCED})
check([b.type for b in r.content] == ["thinking", "text"], f"blocks {r.content}")
check(r.content[0].thinking == THOUGHT and r.content[1].text == ANSWER and r.stop_reason == "end_turn", f"{r}")
st, h, data = s.request("POST", "/v1/messages", {"model": "qwen3", "messages": ask, "max_tokens": 64, "stream": True,
                                                 "guided_regex": FORCED})
ev = []
for chunk in data.decode().split("\n\n"):
    if chunk.strip():
        lines = dict(line.split(": ", 1) for line in chunk.split("\n"))
        ev.append((lines["event"], json.loads(lines["data"])))
seq = [e if e != "content_block_delta" else "delta:" + d["delta"]["type"] for e, d in ev]
dedup = [x for i, x in enumerate(seq) if i == 0 or x != seq[i - 1]]
check(dedup == ["message_start", "ping", "content_block_start", "delta:thinking_delta", "content_block_stop",
                "content_block_start", "delta:text_delta", "content_block_stop", "message_delta", "message_stop"],
      f"event order {dedup}")
starts = [d for e, d in ev if e == "content_block_start"]
check(starts[0]["index"] == 0 and starts[0]["content_block"]["type"] == "thinking" and starts[1]["index"] == 1 and
      starts[1]["content_block"]["type"] == "text", f"{starts}")
check("".join(d["delta"].get("thinking", "") for e, d in ev if e == "content_block_delta") == THOUGHT, "thinking")
with ac.messages.stream(model="qwen3", messages=ask, max_tokens=64, extra_body={"guided_regex": FORCED}) as stream:
    final = stream.get_final_message()
check([b.type for b in final.content] == ["thinking", "text"] and final.content[0].thinking == THOUGHT and
      final.content[1].text == ANSWER, f"stream helper {final.content}")
# thinking maps onto the template's switch: disabled closes the thought in the prompt.
n_on = ac.messages.count_tokens(model="qwen3", messages=ask, thinking={"type": "enabled", "budget_tokens": 1024})
n_off = ac.messages.count_tokens(model="qwen3", messages=ask, thinking={"type": "disabled"})
check(n_off.input_tokens > n_on.input_tokens, f"count {n_on} {n_off}")

# ---- /v1/responses: a reasoning item before the message ------------------------------------------
r = oai.responses.create(model="qwen3", input="What is the capital of France?", max_output_tokens=64,
                         extra_body={"guided_regex": FORCED})
check([i.type for i in r.output] == ["reasoning", "message"], f"items {r.output}")
check(r.output[0].content[0].text == THOUGHT and r.output_text == ANSWER, f"{r.output}")
check(r.usage.output_tokens_details.reasoning_tokens > 0, f"{r.usage}")
events = list(oai.responses.create(model="qwen3", input="What is the capital of France?", max_output_tokens=64,
                                   stream=True, extra_body={"guided_regex": FORCED}))
types = [e.type for e in events]
check("response.reasoning_text.delta" in types and types.index("response.reasoning_text.done") <
      types.index("response.output_text.delta"), f"responses events {types}")
done = [e for e in events if e.type == "response.completed"][0].response
check([i.type for i in done.output] == ["reasoning", "message"] and done.output_text == ANSWER, f"{done.output}")

# ---- a prompt that opens the thought (r1), and Ollama's message.thinking ------------------------
greedy = {"model": "r1", "messages": ask, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
st, c = s.json("POST", "/v1/chat/completions", greedy)
msg = c["choices"][0]["message"]
check(st == 200 and "reasoning_content" in msg and msg["content"] == "", f"opened thought, cut: {c}")
thought = msg["reasoning_content"]
st, c_off = s.json("POST", "/v1/chat/completions", dict(greedy, chat_template_kwargs={"enable_thinking": False}))
check("reasoning_content" not in c_off["choices"][0]["message"], f"closed by the template: {c_off}")

oc = ollama.Client(host=s.url, timeout=120)
opts = {"temperature": 0, "num_predict": 8}
r = oc.chat(model="r1", messages=ask, options=opts, think=True, stream=False)
check(r.message.thinking == thought and r.message.content == "" and r.done_reason == "length", f"ollama {r}")
parts = list(oc.chat(model="r1", messages=ask, options=opts, think=True, stream=True))
check("".join(p.message.thinking or "" for p in parts) == thought and
      "".join(p.message.content for p in parts) == "", f"ollama stream {parts}")
r = oc.chat(model="r1", messages=ask, options=opts, think=False, stream=False)
check(not r.message.thinking and r.message.content == c_off["choices"][0]["message"]["content"], f"think off {r}")
# generate renders the prompt as a user turn: the same prompt, the same thought beside the response.
r = oc.generate(model="r1", prompt=ask[0]["content"], options=opts, think=True)
check(r.thinking == thought and r.response == "", f"generate {r}")
print("ok")
