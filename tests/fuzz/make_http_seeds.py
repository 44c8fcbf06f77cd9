"""Regenerates the seed corpus of fuzz_http_request (standard library only):
    python3 tests/fuzz/make_http_seeds.py
Each seed is one connection's bytes: valid and broken requests for every route whose body servd
validates, plus framing cases (pipelining, chunked bodies, limits, malformed request lines). The regress_* files
next to them are reproducers of past findings, kept as they are (this script leaves them alone)."""
import json
import os

here = os.path.dirname(os.path.abspath(__file__))
out_dir = os.path.join(here, "corpus", "http_request")


def req(path, body, method="POST", headers=(), version="1.1", chunked=False):
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    lines = [f"{method} {path} HTTP/{version}", "Host: localhost:8000"]
    lines += list(headers)
    if chunked:
        lines.append("Transfer-Encoding: chunked")
        mid = len(body) // 2
        parts = [body[:mid], body[mid:]]
        payload = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"
    else:
        lines.append("Content-Type: application/json")
        lines.append(f"Content-Length: {len(body)}")
        payload = body
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


MSG = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]

seeds = {
    # /v1/completions
    "completions_min": req("/v1/completions", {"model": "lm", "prompt": "Hello"}),
    "completions_full": req("/v1/completions", {
        "model": "lm", "prompt": ["a", "b"], "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "top_k": 40,
        "min_p": 0.05, "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.5, "seed": 42,
        "n": 2, "best_of": 2, "stop": ["\n", "END"], "stop_token_ids": [2, 3], "ignore_eos": False, "stream": True,
        "stream_options": {"include_usage": True}, "logprobs": 3, "echo": False, "timeout": 2.5, "user": "u1",
        "response_format": {"type": "text"}}),
    "completions_ids": req("/v1/completions", {"model": "lm", "prompt": [[1, 2, 3], [4, 5]], "max_tokens": 4.0}),
    "completions_bad_types": req("/v1/completions", {"model": "lm", "prompt": "x", "temperature": "hot",
                                                     "stop": 5, "n": 1000}),
    "completions_bad_json": req("/v1/completions", '{"model": "lm", "prompt": "x",'),
    "completions_dup_key": req("/v1/completions", '{"prompt": "x", "prompt": "y"}'),
    "completions_not_object": req("/v1/completions", "[1, 2, 3]"),
    "completions_bad_utf8": req("/v1/completions", b'{"prompt": "\xff\xfe", "x": 1}'),
    "completions_unsupported": req("/v1/completions", {"prompt": "x", "suffix": "y", "tools": [],
                                                       "logit_bias": {"1": 2}, "echo": True}),
    # /v1/chat/completions
    "chat_min": req("/v1/chat/completions", {"model": "lm", "messages": MSG}),
    "chat_full": req("/v1/chat/completions", {
        "model": "lm", "messages": MSG + [{"role": "assistant", "content": [{"type": "text", "text": "Hey"}],
                                           "name": "bot"}, {"role": "tool", "content": None}],
        "max_completion_tokens": 32, "logprobs": True, "top_logprobs": 5, "stream": False, "seed": -1,
        "stop": "\n\n"}),
    "chat_bad_role": req("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}),
    "chat_bad_parts": req("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    "chat_empty": req("/v1/chat/completions", {"messages": []}),
    "chat_chunked": req("/v1/chat/completions", {"messages": MSG, "stream": True}, chunked=True),
    # /tokenize and /detokenize
    "tokenize_prompt": req("/tokenize", {"model": "lm", "prompt": "Hello world", "add_special_tokens": False}),
    "tokenize_messages": req("/tokenize", {"messages": MSG, "add_generation_prompt": False}),
    "tokenize_two_prompts": req("/tokenize", {"prompt": ["a", "b"]}),
    "detokenize": req("/detokenize", {"model": "lm", "tokens": [1, 2, 3]}),
    "detokenize_bad": req("/detokenize", {"tokens": [1, -2, 3.5]}),
    # KServe v2 infer
    "infer_fp32": req("/v2/models/add/infer", {
        "id": "r1", "inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4.5]]},
                               {"name": "y", "shape": [3], "datatype": "INT32", "data": [1, -2, 3]}],
        "outputs": [{"name": "out"}], "parameters": {"timeout": 5}}),
    "infer_versions": req("/v2/models/add/versions/1/infer", {
        "inputs": [{"name": "h", "shape": [1, 4], "datatype": "FP16", "data": [0.5, 1, 2, 65504]},
                   {"name": "b", "shape": [], "datatype": "BF16", "data": [3]}]}),
    "infer_bad_shape": req("/v2/models/add/infer", {
        "inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2]}]}),
    "infer_bad_dtype": req("/v2/models/add/infer", {
        "inputs": [{"name": "x", "shape": [1], "datatype": "Q4_0" + "\u00e9" * 600, "data": [1]}]}),
    "infer_twice": req("/v2/models/add/infer", {
        "inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": [1]},
                   {"name": "x", "shape": [1], "datatype": "INT32", "data": [2]}]}),
    "infer_huge_shape": req("/v2/models/add/infer", {
        "inputs": [{"name": "x", "shape": [0, 2147483648, 2147483648, 2147483648], "datatype": "FP32", "data": []}]}),
    # framing
    "pipelined": req("/v1/completions", {"prompt": "a"}) + req("/tokenize", {"prompt": "b"}, method="PUT")
    + req("/v2/models/m/infer", {"inputs": []}),
    "expect_continue": req("/v1/completions", {"prompt": "x"}, headers=["Expect: 100-continue"]),
    "http10": req("/v1/completions", {"prompt": "x"}, version="1.0", headers=["Connection: keep-alive"]),
    "head_get": b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\nHEAD /health HTTP/1.1\r\n\r\n",
    "percent_path": req("/v1/%63ompletions?x=1&y=%zz", {"prompt": "x"}),
    "bad_percent": req("/v1/completions%", {"prompt": "x"}),
    "too_large_body": b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n{}",
    "too_many_headers": b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(120)) + b"\r\n",
    "long_header": b"GET / HTTP/1.1\r\nX-Long: " + b"a" * 17000 + b"\r\n\r\n",
    "header_no_value": b"POST /tokenize HTTP/1.1\r\nX-Empty:\r\nContent-Length: 2\r\n\r\n{}",
    "bad_request_line": b"POST /v1/completions HTTP/9.9\r\n\r\n",
    "bad_chunk": b"POST /tokenize HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "garbage": b"\x00\x01\x02GET\r\n\r\n",
}


def main():
    os.makedirs(out_dir, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
    print(f"{len(seeds)} seeds in {out_dir}")


if __name__ == "__main__":
    main()
