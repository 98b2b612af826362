#!/usr/bin/env python3
"""Writes the bad-input corpus: one directory per case, with its input files and `case.toml`
(the day0 arguments, the exit code and a piece of the expected error). Run from this directory;
the files it writes are committed, so the suite needs no Python.

Each case is something a user may hand day0 on release day: a config or checkpoint that is cut
short, has the wrong types or impossible sizes, a device preset with nonsense figures, or a
workload that does not fit the model."""
import json, os, shutil, struct

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.join(HERE, "..", "..", "model", "testdata", "tiny", "deepseek_v3", "config.json")
KIMI = os.path.join(HERE, "..", "..", "model", "testdata", "kimi_k2_config.json")


def case(name, args, exit_code, error, files):
    d = os.path.join(HERE, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for fname, data in files.items():
        with open(os.path.join(d, fname), "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
    with open(os.path.join(d, "case.toml"), "w") as f:
        f.write(f"# Written by make.py.\nargs = {json.dumps(args)}\nexit = {exit_code}\n")
        f.write(f"error = {json.dumps(error)}\n")


def cfg(path, **changes):
    c = json.load(open(path))
    for k, v in changes.items():
        if v is None:
            c.pop(k, None)
        else:
            c[k] = v
    return json.dumps(c, indent=1)


def safetensors(tensors, data=b"", header_len=None, raw_header=None):
    header = raw_header if raw_header is not None else json.dumps(tensors).encode()
    n = len(header) if header_len is None else header_len
    return struct.pack("<Q", n) + header + data


COV = ["coverage", "--config", "config.json"]
COST = ["forward", "--config", "config.json", "--cost-only", "--prompt-len", "16", "--output-len", "1"]
FWD = ["forward", "--model-dir", ".", "--tokens", "1,2,3"]
SUITE = ["suite", "--device", "preset.toml"]

# Configs.
case("config-not-json", COV, 1, "malformed JSON", {"config.json": "{ hidden_size: 7168 "})
case("config-array", COV, 1, "must be a JSON object", {"config.json": "[1, 2]"})
case("config-missing-hidden-size", COV, 1, "required field `hidden_size` is missing",
     {"config.json": cfg(KIMI, hidden_size=None)})
case("config-zero-heads", COV, 1, "`num_attention_heads`: must be at least 1",
     {"config.json": cfg(KIMI, num_attention_heads=0)})
case("config-negative-size", COV, 1, "`hidden_size` must be a non-negative integer",
     {"config.json": cfg(KIMI, hidden_size=-5)})
case("config-string-size", COV, 1, "`hidden_size` must be a non-negative integer",
     {"config.json": cfg(KIMI, hidden_size="7168")})
case("config-huge-hidden", COST, 1, "`hidden_size`: 1000000000000000 is above",
     {"config.json": cfg(KIMI, hidden_size=10**15)})
case("config-huge-experts", COST, 1, "`moe_intermediate_size`: 1073741824 is above",
     {"config.json": cfg(KIMI, moe_intermediate_size=2**30)})
case("config-topk-above-experts", COV, 1, "1000 experts per token but only 384 experts",
     {"config.json": cfg(KIMI, num_experts_per_tok=1000)})
case("config-missing-file", ["coverage", "--config", "absent.json"], 1, "absent.json", {})

# Checkpoints (the tiny DeepSeek-V3 config with a broken safetensors file).
tiny = cfg(TINY)
case("safetensors-truncated", FWD, 1, "model.safetensors",
     {"config.json": tiny, "model.safetensors": b"\x10\x00"})
case("safetensors-header-length-huge", FWD, 1, "model.safetensors",
     {"config.json": tiny, "model.safetensors": safetensors({}, header_len=2**64 - 1)})
case("safetensors-header-not-json", FWD, 1, "model.safetensors",
     {"config.json": tiny, "model.safetensors": safetensors(None, raw_header=b"{not json!}")})
case("safetensors-offsets-past-end", FWD, 1, "model.safetensors",
     {"config.json": tiny, "model.safetensors": safetensors(
         {"model.embed_tokens.weight": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}},
         data=b"\x00" * 8)})
case("safetensors-missing-tensors", FWD, 1, "is missing (expected shape",
     {"config.json": tiny, "model.safetensors": safetensors(
         {"lm_head.weight": {"dtype": "F32", "shape": [1, 2], "data_offsets": [0, 8]}},
         data=struct.pack("<2f", 0.5, -0.25))})
case("safetensors-wrong-shape", FWD, 1, "model.embed_tokens.weight",
     {"config.json": tiny, "model.safetensors": safetensors(
         {"model.embed_tokens.weight": {"dtype": "F32", "shape": [1, 2], "data_offsets": [0, 8]}},
         data=struct.pack("<2f", 0.5, -0.25))})

# Device presets.
good_preset = open(os.path.join(HERE, "..", "..", "accel-sim", "presets", "npu-910b.toml")).read()
case("preset-not-toml", SUITE, 1, "preset.toml", {"preset.toml": "cores = [[["})
case("preset-missing-field", SUITE, 1, "preset.toml",
     {"preset.toml": "\n".join(l for l in good_preset.splitlines() if not l.startswith("cores"))})
case("preset-zero-cores", SUITE, 1, "cores",
     {"preset.toml": "\n".join("cores = 0" if l.startswith("cores") else l for l in good_preset.splitlines())})
case("preset-absurd-clock", SUITE, 1, "clock_ghz",
     {"preset.toml": "\n".join("clock_ghz = 1e300" if l.startswith("clock_ghz") else l
                               for l in good_preset.splitlines())})

# Workloads.
kimi = cfg(KIMI)
case("workload-batch-zero", ["forward", "--config", "config.json", "--cost-only", "--batch", "0"], 1,
     "--batch", {"config.json": kimi})
case("workload-context-too-long",
     ["forward", "--config", "config.json", "--cost-only", "--batch", "1", "--context", "999999999"], 1,
     "--context", {"config.json": kimi})
case("workload-unknown-routing", COST + ["--routing", "round-robin"], 1, "--routing",
     {"config.json": kimi})
case("workload-token-beyond-vocab",
     ["forward", "--model-dir", "../../../model/testdata/tiny/deepseek_v3", "--tokens", "1,99999999"],
     1, "vocab", {})
case("workload-no-tokens", ["forward", "--model-dir", "../../../model/testdata/tiny/deepseek_v3",
                            "--tokens", "1,x"], 2, "--tokens", {})
case("replay-from-another-model", COST + ["--routing", "replay:routing.json"], 1, "--routing",
     {"config.json": kimi, "routing.json": json.dumps({"model": {"model_type": "deepseek_v3",
      "num_hidden_layers": 3, "n_routed_experts": 8, "num_experts_per_tok": 2}, "steps": []})})
