#!/usr/bin/env python3
"""An independent float64 numpy forward pass written from MODELS.md, checked against the golden files.

Reads only what the Rust side reads: each model's `config.json` and its safetensors (following
`model.safetensors.index.json` when sharded). Imports neither torch nor transformers. For every
model in `model/testdata/tiny/` it compares, against `golden.safetensors`:

- the hidden states after every layer and the prefill logits;
- the decode logits, from one cache-free forward over the prompt and the generated tokens (the
  golden run checked that the cached decode equals this);
- the greedy tokens (argmax of those logits).

A pass means MODELS.md describes the HF computation completely enough to reproduce it. Needs
numpy and safetensors only: `python tests/reference/check_models.py [DIR ...]`.
"""

import json
import math
import os
import sys

import numpy as np
from safetensors.numpy import load_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "model", "testdata", "tiny")
TOLERANCE = 1e-4  # max |ours - golden| / max |golden|: f64 against HF's f32


def load_weights(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    w = {}
    for s in shards:
        w.update({k: v.astype(np.float64) for k, v in load_file(os.path.join(d, s)).items()})
    return w


# ---- building blocks (MODELS.md sections 2, 3) ----


def rms(x, weight, eps):
    return weight * (x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps))


def rms_1p(x, weight, eps):
    return (x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)) * (1.0 + weight)


def layer_norm(x, weight, bias, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * weight + bias


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.log1p(np.exp(x))


def get_mscale(s, m=1.0):
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


def rope_tables(rp, dim, positions):
    """inv_freq (default or YaRN) and the cos/sin angle tables [T, dim/2], with attention_factor."""
    base = rp["rope_theta"]
    pos_freqs = base ** (np.arange(0, dim, 2) / dim)
    inv = 1.0 / pos_freqs
    factor = 1.0
    if rp.get("rope_type", "default") == "yarn":
        factor = rp["factor"]
        omax = rp["original_max_position_embeddings"]
        ms, msa = rp.get("mscale"), rp.get("mscale_all_dim")
        factor_att = rp.get("attention_factor")
        if factor_att is None:
            factor_att = get_mscale(factor, ms) / get_mscale(factor, msa) if ms and msa else get_mscale(factor)
        bf, bs = rp.get("beta_fast") or 32, rp.get("beta_slow") or 1

        def corr(r):
            return dim * math.log(omax / (r * 2 * math.pi)) / (2 * math.log(base))

        low, high = corr(bf), corr(bs)
        if rp.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
        extrap = 1 - ramp
        inv = (1.0 / (factor * pos_freqs)) * (1 - extrap) + (1.0 / pos_freqs) * extrap
    else:
        factor_att = 1.0
    ang = positions[:, None] * inv[None, :]
    return np.cos(ang) * factor_att, np.sin(ang) * factor_att


def rope_half(x, cos, sin):
    """x [..., T, (H,) d]; cos/sin [T, d/2] broadcast over the head axis by the caller."""
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def rope_interleaved(x, cos, sin):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def causal_softmax_attend(q, k, v, scale, extra_mask=None):
    """q [H, T, d], k [H, T, d], v [H, T, dv]; returns [T, H*dv]."""
    t = q.shape[1]
    s = q @ k.transpose(0, 2, 1) * scale
    allowed = np.tril(np.ones((t, t), bool))
    if extra_mask is not None:
        allowed = allowed & extra_mask
    s = np.where(allowed[None], s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(1, 0, 2).reshape(t, -1)


def mlp(x, w, pre):
    return (silu(x @ w[pre + "gate_proj.weight"].T) * (x @ w[pre + "up_proj.weight"].T)) @ w[pre + "down_proj.weight"].T


def experts(x, w, pre, idx, weights):
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e, g in zip(idx[t], weights[t]):
            out[t] += g * mlp(x[t : t + 1], w, f"{pre}experts.{e}.")[0]
    return out


# ---- DeepSeek V3 / V3.2 (MODELS.md sections 4, 5) ----


def deepseek_moe(x, w, pre, c):
    e = c["n_routed_experts"]
    s = sigmoid(x @ w[pre + "gate.weight"].T)
    sc = s + w[pre + "gate.e_score_correction_bias"]
    g = c["n_group"]
    group = np.sort(sc.reshape(-1, g, e // g), -1)[..., -2:].sum(-1)
    idx, weights = [], []
    for t in range(x.shape[0]):
        keep = np.argsort(-group[t])[: c["topk_group"]]
        allowed = np.repeat(np.isin(np.arange(g), keep), e // g)
        choice = np.where(allowed, sc[t], -np.inf)
        sel = np.argsort(-choice)[: c["num_experts_per_tok"]]
        wt = s[t, sel]
        if c["norm_topk_prob"]:
            wt = wt / (wt.sum() + 1e-20)
        idx.append(sel)
        weights.append(wt * c["routed_scaling_factor"])
    return experts(x, w, pre, idx, weights) + mlp(x, w, pre + "shared_experts.")


def indexer_mask(x, q_resid, w, pre, c, cos, sin):
    """Boolean [T, T]: the keys the DSA indexer selects for each query (MODELS.md 5.1)."""
    t = x.shape[0]
    hi, di, dr = c["index_n_heads"], c["index_head_dim"], c["qk_rope_head_dim"]
    q = (q_resid @ w[pre + "wq_b.weight"].T).reshape(t, hi, di)
    q = np.concatenate([rope_half(q[..., :dr], cos[:, None], sin[:, None]), q[..., dr:]], -1)
    k = layer_norm(x @ w[pre + "wk.weight"].T, w[pre + "k_norm.weight"], w[pre + "k_norm.bias"], 1e-6)
    k = np.concatenate([rope_half(k[..., :dr], cos, sin), k[..., dr:]], -1)
    s = np.maximum(np.einsum("thd,sd->ths", q, k) * di**-0.5, 0)
    wt = (x @ w[pre + "weights_proj.weight"].T) * hi**-0.5
    score = np.einsum("th,ths->ts", wt, s)
    score = np.where(np.tril(np.ones((t, t), bool)), score, -np.inf)
    mask = np.zeros((t, t), bool)
    for r in range(t):
        mask[r, np.argsort(-score[r], kind="stable")[: min(c["index_topk"], t)]] = True
    return mask


def mla(x, w, pre, c, cos, sin, scale):
    t = x.shape[0]
    h, dn, dr, dv, r = (
        c["num_attention_heads"],
        c["qk_nope_head_dim"],
        c["qk_rope_head_dim"],
        c["v_head_dim"],
        c["kv_lora_rank"],
    )
    q_resid = None
    if c.get("q_lora_rank") is None:
        q = x @ w[pre + "q_proj.weight"].T
    else:
        q_resid = rms(x @ w[pre + "q_a_proj.weight"].T, w[pre + "q_a_layernorm.weight"], 1e-6)
        q = q_resid @ w[pre + "q_b_proj.weight"].T
    q = q.reshape(t, h, dn + dr).transpose(1, 0, 2)
    ckv = x @ w[pre + "kv_a_proj_with_mqa.weight"].T
    lat = rms(ckv[:, :r], w[pre + "kv_a_layernorm.weight"], 1e-6)
    k_rot = ckv[:, r:]
    rope = rope_interleaved if c.get("rope_interleave", True) else rope_half
    q_rot = rope(q[..., dn:], cos[None], sin[None])
    k_rot = rope(k_rot, cos, sin)
    kv = (lat @ w[pre + "kv_b_proj.weight"].T).reshape(t, h, dn + dv).transpose(1, 0, 2)
    k = np.concatenate([kv[..., :dn], np.broadcast_to(k_rot[None], (h, t, dr))], -1)
    qf = np.concatenate([q[..., :dn], q_rot], -1)
    sel = None
    if c["model_type"] == "deepseek_v32":
        sel = indexer_mask(x, q_resid, w, pre + "indexer.", c, cos, sin)
    o = causal_softmax_attend(qf, k, kv[..., dn:], scale, sel)
    return o @ w[pre + "o_proj.weight"].T


def deepseek_forward(ids, w, c):
    t = len(ids)
    rp = c["rope_parameters"]
    cos, sin = rope_tables(rp, c["qk_rope_head_dim"], np.arange(t, dtype=np.float64))
    scale = (c["qk_nope_head_dim"] + c["qk_rope_head_dim"]) ** -0.5
    if rp.get("rope_type", "default") != "default" and rp.get("mscale_all_dim", 0):
        m = get_mscale(rp["factor"], rp["mscale_all_dim"])
        scale *= m * m
    eps = c["rms_norm_eps"]
    h = w["model.embed_tokens.weight"][ids]
    hidden = [h]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = h + mla(rms(h, w[p + "input_layernorm.weight"], eps), w, p + "self_attn.", c, cos, sin, scale)
        x = rms(h, w[p + "post_attention_layernorm.weight"], eps)
        sparse = c["mlp_layer_types"][l] == "sparse"
        h = h + (deepseek_moe(x, w, p + "mlp.", c) if sparse else mlp(x, w, p + "mlp."))
        hidden.append(h)
    return hidden, rms(h, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


# ---- Qwen3-Next (MODELS.md section 6) ----


def qwen_full_attention(x, w, pre, c, cos, sin):
    t = x.shape[0]
    hq, hkv, d, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
    qg = (x @ w[pre + "q_proj.weight"].T).reshape(t, hq, 2 * d)
    q, gate = qg[..., :d], qg[..., d:].reshape(t, hq * d)
    q = rms_1p(q, w[pre + "q_norm.weight"], eps)
    k = rms_1p((x @ w[pre + "k_proj.weight"].T).reshape(t, hkv, d), w[pre + "k_norm.weight"], eps)
    v = (x @ w[pre + "v_proj.weight"].T).reshape(t, hkv, d)
    rd = 2 * cos.shape[-1]
    q = np.concatenate([rope_half(q[..., :rd], cos[:, None], sin[:, None]), q[..., rd:]], -1)
    k = np.concatenate([rope_half(k[..., :rd], cos[:, None], sin[:, None]), k[..., rd:]], -1)
    grp = hq // hkv
    kk = np.repeat(k.transpose(1, 0, 2), grp, 0)
    vv = np.repeat(v.transpose(1, 0, 2), grp, 0)
    o = causal_softmax_attend(q.transpose(1, 0, 2), kk, vv, d**-0.5)
    return (o * sigmoid(gate)) @ w[pre + "o_proj.weight"].T


def qwen_gated_deltanet(x, w, pre, c):
    t = x.shape[0]
    nk, nv, dk, dv = (
        c["linear_num_key_heads"],
        c["linear_num_value_heads"],
        c["linear_key_head_dim"],
        c["linear_value_head_dim"],
    )
    r = nv // nk
    p = (x @ w[pre + "in_proj_qkvz.weight"].T).reshape(t, nk, 2 * dk + 2 * r * dv)
    q, k = p[..., :dk], p[..., dk : 2 * dk]
    v = p[..., 2 * dk : 2 * dk + r * dv].reshape(t, nv, dv)
    z = p[..., 2 * dk + r * dv :].reshape(t, nv, dv)
    ba = (x @ w[pre + "in_proj_ba.weight"].T).reshape(t, nk, 2 * r)
    b, a = ba[..., :r].reshape(t, nv), ba[..., r:].reshape(t, nv)
    mixed = np.concatenate([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], -1)
    cw = w[pre + "conv1d.weight"][:, 0, :]
    kern = cw.shape[1]
    padded = np.concatenate([np.zeros((kern - 1, mixed.shape[1])), mixed], 0)
    conv = np.stack([(padded[i : i + kern] * cw.T).sum(0) for i in range(t)])
    mixed = silu(conv)
    q = mixed[:, : nk * dk].reshape(t, nk, dk)
    k = mixed[:, nk * dk : 2 * nk * dk].reshape(t, nk, dk)
    v = mixed[:, 2 * nk * dk :].reshape(t, nv, dv)
    beta = sigmoid(b)
    g = -np.exp(w[pre + "A_log"]) * softplus(a + w[pre + "dt_bias"])
    q = np.repeat(q, r, 1)
    k = np.repeat(k, r, 1)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) * dk**-0.5
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    state = np.zeros((nv, dk, dv))
    out = np.zeros((t, nv, dv))
    for i in range(t):
        state = state * np.exp(g[i])[:, None, None]
        mem = np.einsum("hkv,hk->hv", state, k[i])
        delta = (v[i] - mem) * beta[i][:, None]
        state = state + np.einsum("hk,hv->hkv", k[i], delta)
        out[i] = np.einsum("hkv,hk->hv", state, q[i])
    o = rms(out, w[pre + "norm.weight"], c["rms_norm_eps"]) * silu(z)
    return o.reshape(t, nv * dv) @ w[pre + "out_proj.weight"].T


def qwen_moe(x, w, pre, c):
    logits = x @ w[pre + "gate.weight"].T
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    idx = np.argsort(-p, -1)[:, : c["num_experts_per_tok"]]
    wt = np.take_along_axis(p, idx, -1)
    if c["norm_topk_prob"]:
        wt = wt / wt.sum(-1, keepdims=True)
    shared = sigmoid(x @ w[pre + "shared_expert_gate.weight"].T) * mlp(x, w, pre + "shared_expert.")
    return experts(x, w, pre, idx, wt) + shared


def qwen_forward(ids, w, c):
    t = len(ids)
    rp = c["rope_parameters"]
    rot = int(c["head_dim"] * rp.get("partial_rotary_factor", 1.0))
    cos, sin = rope_tables(rp, rot, np.arange(t, dtype=np.float64))
    eps = c["rms_norm_eps"]
    h = w["model.embed_tokens.weight"][ids]
    hidden = [h]
    for l, kind in enumerate(c["layer_types"]):
        p = f"model.layers.{l}."
        x = rms_1p(h, w[p + "input_layernorm.weight"], eps)
        if kind == "linear_attention":
            h = h + qwen_gated_deltanet(x, w, p + "linear_attn.", c)
        else:
            h = h + qwen_full_attention(x, w, p + "self_attn.", c, cos, sin)
        x = rms_1p(h, w[p + "post_attention_layernorm.weight"], eps)
        moe = l not in c["mlp_only_layers"] and c["num_experts"] > 0 and (l + 1) % c["decoder_sparse_step"] == 0
        h = h + (qwen_moe(x, w, p + "mlp.", c) if moe else mlp(x, w, p + "mlp."))
        hidden.append(h)
    return hidden, rms_1p(h, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


# ---- comparison ----


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def with_defaults(c):
    """config.json as transformers 5.24's config classes read it: the defaults of the fields a file
    may leave out, legacy `rope_scaling` + top-level `rope_theta`, a top-level
    `partial_rotary_factor`, `layer_types` from `full_attention_interval`, Kimi-K2's `kimi_k2`
    model type (the DeepSeek-V3 architecture)."""
    c = dict(c)
    if c["model_type"] == "kimi_k2":
        c["model_type"] = "deepseek_v3"
    rp = c.get("rope_scaling") or c.get("rope_parameters") or {}
    rp = dict(rp)
    if "type" in rp:
        rp.setdefault("rope_type", rp.pop("type"))
    rp.setdefault("rope_type", "default")
    rp.setdefault("rope_theta", c.get("rope_theta", 10000.0))
    if c["model_type"] == "qwen3_next":
        rp.setdefault("partial_rotary_factor", c.get("partial_rotary_factor", 0.25))
    c["rope_parameters"] = rp
    c.setdefault("rms_norm_eps", 1e-6)
    if c["model_type"] == "qwen3_next":
        c.setdefault("norm_topk_prob", True)
        c.setdefault("decoder_sparse_step", 1)
        c.setdefault("linear_conv_kernel_dim", 4)
        c["mlp_only_layers"] = c.get("mlp_only_layers") or []
        if c.get("layer_types") is None:
            n = c.get("full_attention_interval", 4)
            c["layer_types"] = [
                "full_attention" if (i + 1) % n == 0 else "linear_attention" for i in range(c["num_hidden_layers"])
            ]
    else:
        for k, v in dict(n_shared_experts=1, n_group=8, topk_group=4, norm_topk_prob=True,
                         routed_scaling_factor=2.5, rope_interleave=True, first_k_dense_replace=3).items():
            c.setdefault(k, v)
        if c.get("mlp_layer_types") is None:
            n = min(c["first_k_dense_replace"], c["num_hidden_layers"])
            c["mlp_layer_types"] = ["dense"] * n + ["sparse"] * (c["num_hidden_layers"] - n)
    return c


def check(d):
    with open(os.path.join(d, "config.json")) as f:
        c = with_defaults(json.load(f))
    w = load_weights(d)
    g = load_file(os.path.join(d, "golden.safetensors"))
    forward = qwen_forward if c["model_type"] == "qwen3_next" else deepseek_forward
    ids = g["input_ids"]
    hidden, logits = forward(ids, w, c)
    errs = {f"hidden_states.{i}": rel(h, g[f"hidden_states.{i}"]) for i, h in enumerate(hidden)}
    errs["logits"] = rel(logits, g["logits"])
    full = np.concatenate([ids, g["generated"][:-1]])
    _, all_logits = forward(full, w, c)
    decode = all_logits[len(ids) - 1 :]
    errs["decode_logits"] = rel(decode, g["decode_logits"])
    same_tokens = bool((decode.argmax(-1) == g["generated"]).all())
    worst = max(errs, key=errs.get)
    ok = errs[worst] <= TOLERANCE and same_tokens
    print(f"{os.path.basename(d)}: {'ok' if ok else 'FAIL'}; worst {worst} rel {errs[worst]:.2e}; "
          f"logits {errs['logits']:.2e}, decode_logits {errs['decode_logits']:.2e}, tokens equal: {same_tokens}")
    return ok


def main(dirs):
    dirs = dirs or [os.path.join(TINY, n) for n in sorted(os.listdir(TINY)) if os.path.isdir(os.path.join(TINY, n))]
    results = [check(d) for d in dirs]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main(sys.argv[1:])
