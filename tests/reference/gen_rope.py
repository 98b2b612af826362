#!/usr/bin/env python3
"""Golden data for day0's RoPE tables (inverse frequencies, YaRN attention factor, cos/sin).

Builds each model's own rotary-embedding module from a config (transformers
`DeepseekV3RotaryEmbedding`, `Qwen3NextRotaryEmbedding`, `LlamaRotaryEmbedding`), which calls
`modeling_rope_utils._compute_yarn_parameters` / `_compute_linear_scaling_rope_parameters` /
`_compute_llama3_parameters` or the
model's `compute_default_rope_parameters`, and records `inv_freq`, `attention_scaling` and the
`cos`/`sin` its `forward` returns for fixed positions (first half of the last dimension only: the
second half repeats it). Writes `golden/rope.json`.

Float32 values are written with 9 significant digits (they read back to the same f32). No random
numbers: the same library versions give byte-identical files. Needs torch and transformers.
"""

import json
import os
import platform

import torch
import transformers
from transformers import DeepseekV3Config, LlamaConfig, Qwen3NextConfig
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRotaryEmbedding

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
POSITIONS = [0, 1, 2, 3, 17, 100, 1000, 4095, 4096, 4097, 32767, 100000, 163839]


def f32(t):
    """A tensor as a flat list of f32 values, 9 significant digits (exact round trip)."""
    return [float("%.9g" % v) for v in t.detach().to(torch.float32).reshape(-1).tolist()]


def deepseek(rot_dim, rope_parameters):
    cfg = DeepseekV3Config(
        hidden_size=64,
        num_attention_heads=2,
        qk_rope_head_dim=rot_dim,
        qk_nope_head_dim=16,
        v_head_dim=16,
        max_position_embeddings=163840,
        rope_parameters=rope_parameters,
    )
    return DeepseekV3RotaryEmbedding(cfg)


def qwen3_next(head_dim, partial_rotary_factor, theta):
    cfg = Qwen3NextConfig(
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=head_dim,
        partial_rotary_factor=partial_rotary_factor,
        rope_parameters={"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": partial_rotary_factor},
    )
    return Qwen3NextRotaryEmbedding(cfg)


def llama(head_dim, rope_parameters):
    cfg = LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=131072,
        rope_parameters=rope_parameters,
    )
    return LlamaRotaryEmbedding(cfg)


def case(name, module, rot_dim, scaling):
    x = torch.zeros(1, len(POSITIONS), rot_dim)
    cos, sin = module(x, torch.tensor([POSITIONS]))
    half = rot_dim // 2
    assert torch.equal(cos[..., :half], cos[..., half:]) and torch.equal(sin[..., :half], sin[..., half:])
    return {
        "name": name,
        "rot_dim": rot_dim,
        "theta": float(module.config.rope_parameters["rope_theta"]),
        "scaling": scaling,
        "positions": POSITIONS,
        "inv_freq": f32(module.inv_freq),
        "attention_factor": float(module.attention_scaling),
        "cos": f32(cos[0, :, :half]),
        "sin": f32(sin[0, :, :half]),
    }


def main():
    yarn_v3 = {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
        "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
        "mscale": 1.0, "mscale_all_dim": 1.0,
    }
    yarn_mscale = {
        "rope_type": "yarn", "rope_theta": 50000.0, "factor": 8.0,
        "original_max_position_embeddings": 2048, "beta_fast": 24, "beta_slow": 2,
        "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": False,
    }
    yarn_plain = {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 1024, "beta_fast": 32, "beta_slow": 1,
    }
    llama31 = {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
    }
    cases = [
        case("default_64", deepseek(64, {"rope_type": "default", "rope_theta": 10000.0}), 64,
             {"type": "none"}),
        case("linear_16", deepseek(16, {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}), 16,
             {"type": "linear", "factor": 4.0}),
        case("yarn_deepseek_v3_64", deepseek(64, yarn_v3), 64,
             {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
              "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "truncate": True}),
        case("yarn_mscale_no_truncate_32", deepseek(32, yarn_mscale), 32,
             {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 2048,
              "beta_fast": 24.0, "beta_slow": 2.0, "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": False}),
        case("yarn_no_mscale_8", deepseek(8, yarn_plain), 8,
             {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
              "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.0, "mscale_all_dim": 0.0, "truncate": True}),
        case("qwen3_next_partial_64_of_256", qwen3_next(256, 0.25, 10000000.0), 64, {"type": "none"}),
        case("qwen3_next_partial_4_of_16", qwen3_next(16, 0.25, 10000000.0), 4, {"type": "none"}),
        # Llama 3.1's published rope_scaling (128-dim heads, θ 500000, ×8 from 8192).
        case("llama3_llama31_128", llama(128, llama31), 128,
             {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}),
    ]
    data = {
        "provenance": {
            "generator": "tests/reference/gen_rope.py",
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "device": "cpu",
            "dtype": "float32",
        },
        "cases": cases,
    }
    path = os.path.join(OUT, "rope.json")
    with open(path, "w") as f:
        json.dump(data, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
