"""Regenerates the seed corpus of fuzz_kserve_infer (standard library only):
    python3 tests/fuzz/make_kserve_seeds.py
Each seed is one KServe v2 inference request body: every datatype, flat and nested data, parameters,
outputs, and the ways a body is refused (shape and data that disagree, ragged lists, bad types)."""
import json
import os

here = os.path.dirname(os.path.abspath(__file__))
out_dir = os.path.join(here, "corpus", "kserve_infer")


def inp(name="x", dt="FP32", shape=(2,), data=(1.0, 2.0)):
    return {"name": name, "datatype": dt, "shape": list(shape), "data": data}


seeds = {
    "fp32_flat": {"inputs": [inp()]},
    "fp16_nested": {"inputs": [inp(dt="FP16", shape=(2, 2), data=[[1.5, -2], [65504, 1e-8]])]},
    "bf16": {"inputs": [inp(dt="BF16", shape=(3,), data=[3.0e38, -0.0, 7])]},
    "int32": {"inputs": [inp(dt="INT32", shape=(1, 3), data=[[-2147483648, 0, 2147483647]])]},
    "two_inputs": {"id": "r1", "inputs": [inp("a"), inp("b", "INT32", (2,), [1, 2])],
                   "outputs": [{"name": "y"}], "parameters": {"timeout": 2.5}},
    "scalar": {"inputs": [inp(shape=(), data=[4.0])]},
    "empty": {"inputs": [inp(shape=(0, 3), data=[])]},
    "deep": {"inputs": [inp(shape=(1, 1, 1, 2), data=[[[[1, 2]]]])]},
    "bad_ragged": {"inputs": [inp(shape=(2, 2), data=[[1, 2, 3], [4]])]},
    "bad_count": {"inputs": [inp(shape=(3,), data=[1, 2])]},
    "bad_dtype": {"inputs": [inp(dt="FP64")]},
    "bad_int": {"inputs": [inp(dt="INT32", shape=(1,), data=[2147483648])]},
    "bad_dup": {"inputs": [inp("a"), inp("a")]},
    "bad_timeout": {"inputs": [inp()], "parameters": {"timeout": -1}},
    "bad_outputs": {"inputs": [inp()], "outputs": [{"name": 3}]},
}

os.makedirs(out_dir, exist_ok=True)
for name, body in seeds.items():
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(body, f)
with open(os.path.join(out_dir, "bad_json"), "w") as f:
    f.write('{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1,]}]}')
