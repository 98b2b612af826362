#!/usr/bin/env python3
"""Golden data for day0's linear attention (Gated DeltaNet, KDA), from Hugging Face transformers.

Runs the reference code's own torch fallbacks on small random inputs with a non-zero initial
state and writes the inputs, outputs and final states to `golden/linear_attention_*.json`:

- `linear_attention_gdn.json`: `torch_chunk_gated_delta_rule` and `torch_recurrent_gated_delta_rule`
  (transformers `models/qwen3_next/modeling_qwen3_next.py`), grouped value heads, with the
  Qwen3-Next gates computed from raw `a`, `b`, `A_log`, `dt_bias` exactly as
  `Qwen3NextGatedDeltaNet.forward` writes them;
- `linear_attention_kda.json`: `chunk_kimi_delta_attention` and `recurrent_kimi_delta_attention`
  (transformers `models/kimi_linear/modeling_kimi_linear.py`), per-channel decay from the real
  `KimiLinearForgetGate` module;
- `linear_attention_conv_norm.json`: `causal_conv1d_fn` (prefill) then `causal_conv1d_update`
  (decode, token by token, rolling state), and `Qwen3NextRMSNormGated` / `KimiLinearRMSNormGated`.

Float32 values are written with 9 significant digits (they read back to the same f32). Fixed seed:
the same library versions give byte-identical files. Needs torch and transformers; see README.md.
"""

import json
import os
import platform
import sys

import torch
import torch.nn.functional as F
import transformers
from transformers.models.kimi_linear import modeling_kimi_linear as kimi
from transformers.models.kimi_linear.configuration_kimi_linear import KimiLinearConfig
from transformers.models.qwen3_next import modeling_qwen3_next as qwen

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")


def f32(t):
    """A tensor as a flat list of f32 values, 9 significant digits (exact round trip)."""
    return [float("%.9g" % v) for v in t.detach().to(torch.float32).reshape(-1).tolist()]


def provenance(what):
    return {
        "generator": "tests/reference/gen_linear_attention.py",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": "cpu",
        "dtype": "float32",
        "what": what,
    }


def write(name, data):
    path = os.path.join(OUT, name)
    with open(path, "w") as f:
        json.dump(data, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def gdn_case(gen, name, seq, k_heads, v_heads, dk, dv, chunk):
    """One Gated DeltaNet case: gates from raw projections, then both torch fallbacks."""
    r = torch.randn
    q = r(1, seq, k_heads, dk, generator=gen)
    k = r(1, seq, k_heads, dk, generator=gen)
    v = r(1, seq, v_heads, dv, generator=gen)
    # Mild decays (g ≈ −0.05 per token) so the initial state still matters at the end.
    a = r(1, seq, v_heads, generator=gen) * 0.5 - 3.0
    b = r(1, seq, v_heads, generator=gen)
    a_log = torch.log(torch.rand(v_heads, generator=gen) + 0.5)
    dt_bias = (torch.rand(v_heads, generator=gen) - 0.5)
    # As in Qwen3NextGatedDeltaNet.forward:
    beta = b.sigmoid()
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias)
    s0 = r(1, v_heads, dk, dv, generator=gen) * 0.5
    kw = dict(initial_state=s0.clone(), output_final_state=True, use_qk_l2norm_in_kernel=True)
    o_c, s_c = qwen.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, chunk_size=chunk, **kw)
    o_r, s_r = qwen.torch_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, **kw)
    return {
        "name": name,
        "decay": "scalar",
        "seq": seq, "k_heads": k_heads, "v_heads": v_heads, "dk": dk, "dv": dv, "chunk": chunk,
        "q": f32(q), "k": f32(k), "v": f32(v),
        "a": f32(a), "b": f32(b), "A_log": f32(a_log), "dt_bias": f32(dt_bias),
        "g": f32(g), "beta": f32(beta), "initial_state": f32(s0),
        "chunk_o": f32(o_c), "chunk_state": f32(s_c),
        "recurrent_o": f32(o_r), "recurrent_state": f32(s_r),
    }


def kda_case(gen, name, seq, heads, dk, dv, chunk):
    """One KDA case: per-channel gates from the real KimiLinearForgetGate, both torch fallbacks."""
    r = torch.randn
    hidden = 8
    cfg = KimiLinearConfig(
        hidden_size=hidden,
        linear_attn_config={"head_dim": dk, "num_heads": heads, "short_conv_kernel_size": 4,
                            "kda_layers": [1]},
    )
    gate = kimi.KimiLinearForgetGate(cfg)
    with torch.no_grad():
        gate.f_a_proj.weight.copy_(r(dk, hidden, generator=gen) * 0.3)
        gate.f_b_proj.weight.copy_(r(heads * dk, dk, generator=gen) * 0.3)
        gate.dt_bias.copy_(torch.rand(heads * dk, generator=gen) - 3.0)
        gate.A_log.copy_(torch.log(torch.rand(1, 1, heads, 1, generator=gen) + 0.5))
    x = r(1, seq, hidden, generator=gen)
    with torch.no_grad():
        f = gate.f_b_proj(gate.f_a_proj(x))
        g = gate(x)
    q = r(1, seq, heads, dk, generator=gen)
    k = r(1, seq, heads, dk, generator=gen)
    v = r(1, seq, heads, dv, generator=gen)
    beta = r(1, seq, heads, generator=gen).sigmoid()
    s0 = r(1, heads, dk, dv, generator=gen) * 0.5
    kw = dict(initial_state=s0.clone(), output_final_state=True, use_qk_l2norm_in_kernel=True)
    with torch.no_grad():
        o_c, s_c = kimi.chunk_kimi_delta_attention(q, k, v, g=g, beta=beta, chunk_size=chunk, **kw)
        o_r, s_r = kimi.recurrent_kimi_delta_attention(q, k, v, g=g, beta=beta, **kw)
    return {
        "name": name,
        "decay": "per_channel",
        "seq": seq, "k_heads": heads, "v_heads": heads, "dk": dk, "dv": dv, "chunk": chunk,
        "q": f32(q), "k": f32(k), "v": f32(v),
        "f": f32(f), "A_log": f32(gate.A_log.reshape(-1)), "dt_bias": f32(gate.dt_bias),
        "g": f32(g), "beta": f32(beta), "initial_state": f32(s0),
        "chunk_o": f32(o_c), "chunk_state": f32(s_c),
        "recurrent_o": f32(o_r), "recurrent_state": f32(s_r),
    }


def conv_norm(gen):
    """Short convolution (prefill + token-by-token decode) and both gated output norms."""
    r = torch.randn
    channels, kernel, prefill, decode = 6, 4, 9, 3
    w = r(channels, kernel, generator=gen) * 0.5
    x = r(1, channels, prefill + decode, generator=gen)
    y_pre = qwen.causal_conv1d_fn(x[:, :, :prefill], w, None, activation="silu")
    # transformers keeps the last `kernel` inputs as the conv state (only the last kernel − 1 are
    # read); a prefill pads it on the left with zeros.
    state = F.pad(x[:, :, :prefill], (kernel - prefill, 0)) if prefill < kernel else \
        x[:, :, prefill - kernel:prefill].clone()
    ys = []
    for t in range(prefill, prefill + decode):
        ys.append(qwen.causal_conv1d_update(x[:, :, t:t + 1], state, w, None, "silu"))
    y = torch.cat([y_pre] + ys, dim=-1)
    rows, width = 5, 8
    o = r(rows, width, generator=gen)
    z = r(rows, width, generator=gen)
    qn = qwen.Qwen3NextRMSNormGated(width, eps=1e-6)
    kn = kimi.KimiLinearRMSNormGated(width, eps=1e-5)
    with torch.no_grad():
        qn.weight.copy_(torch.rand(width, generator=gen) + 0.5)
        kn.weight.copy_(torch.rand(width, generator=gen) + 0.5)
        yq = qn(o, z)
        yk = kn(o, z)
    return {
        "conv": {
            "channels": channels, "kernel": kernel, "prefill": prefill, "decode": decode,
            # Token-major [seq, channels], as day0 lays activations out.
            "x": f32(x[0].t()), "weight": f32(w), "y": f32(y[0].t()),
            "final_state": f32(state[0, :, 1:].t()),
        },
        "norm": {
            "rows": rows, "width": width, "o": f32(o), "z": f32(z),
            "qwen3_next": {"eps": 1e-6, "weight": f32(qn.weight), "y": f32(yq)},
            "kimi_linear": {"eps": 1e-5, "weight": f32(kn.weight), "y": f32(yk)},
        },
    }


def main():
    os.makedirs(OUT, exist_ok=True)
    gen = torch.Generator().manual_seed(20250505)
    write("linear_attention_gdn.json", {
        "provenance": provenance(
            "transformers.models.qwen3_next.modeling_qwen3_next.torch_chunk_gated_delta_rule and "
            "torch_recurrent_gated_delta_rule, use_qk_l2norm_in_kernel=True, non-zero initial state; "
            "gates g = -exp(A_log)*softplus(a + dt_bias), beta = sigmoid(b) as in "
            "Qwen3NextGatedDeltaNet.forward"),
        "cases": [
            gdn_case(gen, "grouped_ragged", 37, 1, 2, 16, 16, 16),
            gdn_case(gen, "two_chunks_of_32", 40, 1, 1, 16, 16, 32),
            gdn_case(gen, "decode_one_token", 1, 1, 2, 16, 16, 64),
        ],
    })
    write("linear_attention_kda.json", {
        "provenance": provenance(
            "transformers.models.kimi_linear.modeling_kimi_linear.chunk_kimi_delta_attention and "
            "recurrent_kimi_delta_attention, use_qk_l2norm_in_kernel=True, non-zero initial state; "
            "g from KimiLinearForgetGate (f = f_b_proj(f_a_proj(x)) stored), beta = sigmoid"),
        "cases": [
            kda_case(gen, "ragged", 37, 1, 16, 16, 16),
            kda_case(gen, "decode_one_token", 1, 2, 16, 16, 64),
        ],
    })
    write("linear_attention_conv_norm.json", {
        "provenance": provenance(
            "qwen3_next causal_conv1d_fn (prefill) + causal_conv1d_update (decode), SiLU, no bias; "
            "Qwen3NextRMSNormGated (SiLU gate) and KimiLinearRMSNormGated (sigmoid gate)"),
        **conv_norm(gen),
    })


if __name__ == "__main__":
    sys.exit(main())
