#!/usr/bin/env python3
"""Tiny Hugging Face checkpoints with golden logits, for day0's model layer.

For each preset (or one `--arch`), builds a tiny random-weight model with transformers in float32,
`save_pretrained`s it, runs it, and writes `golden.safetensors` next to the checkpoint:

- `input_ids` (I64 [T]): the prompt (seeded);
- `logits` (F32 [T, vocab]): the prefill logits;
- `hidden_states.{i}` (F32 [T, hidden]): i = 0 the embedding output, i = l + 1 the output of
  decoder layer l (the last one BEFORE the final norm);
- `last_hidden_state` (F32 [T, hidden]): after the final norm (what HF's `output_hidden_states`
  puts last);
- `generated` (I64 [16]): greedy `generate(max_new_tokens=16, do_sample=False)` with the model's
  own cache, EOS stopping off;
- `decode_logits` (F32 [16, vocab]): the logits that chose each generated token (row 0 from the
  prefill, row j from the decode step fed `generated[j-1]`).

The safetensors metadata key `provenance` (JSON) records versions, seed, command line and the
checks below. The semantics are written out in MODELS.md. Checks (the script fails if one does
not hold): the generated tokens are not all the same; every decode step's logits match a
cache-free forward over the same tokens; HF's `output_hidden_states` equals the hooked layer
outputs; the DSA indexer's top-k and the MoE routers' top-k have a strict margin at the selection
boundary (so the selection does not depend on rounding), and for the indexer our own
transcription of the scoring selects the same keys as HF.

Deterministic: one CPU thread, fixed seeds, so the same command and library versions give
byte-identical files (see README.md). Needs torch and transformers.
"""

import argparse
import json
import math
import os
import platform
import shlex
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    GenerationConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds3
from transformers.models.deepseek_v32 import DeepseekV32Config, DeepseekV32ForCausalLM
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as ds32
from transformers.models.qwen3_next import modeling_qwen3_next as qn

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_OUT = os.path.join(REPO, "model", "testdata", "tiny")
PROMPT_LEN = 24
NEW_TOKENS = 16
# Smallest accepted gap between the last selected and the first rejected score of a top-k
# (indexer, routers): far above f32 rounding of these tiny dot products (~1e-6), so an independent
# implementation must make the same selection.
MIN_MARGIN = 1e-4

YARN = dict(
    rope_type="yarn",
    factor=4.0,
    original_max_position_embeddings=64,
    mscale=1.0,
    mscale_all_dim=1.0,
    beta_fast=32,
    beta_slow=1,
)

DEEPSEEK_TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    first_k_dense_replace=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=32,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=16,
    v_head_dim=16,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
    moe_intermediate_size=32,
    n_shared_experts=1,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    rope_parameters=YARN,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)

# name -> (model class, config class, seed, config kwargs, save_pretrained kwargs); what each one
# exercises is in model/testdata/tiny/README.md.
PRESETS = {
    "deepseek_v3": (
        DeepseekV3ForCausalLM,
        DeepseekV3Config,
        1,
        dict(DEEPSEEK_TINY, rope_interleave=True),
        {},
    ),
    "deepseek_v32": (
        DeepseekV32ForCausalLM,
        DeepseekV32Config,
        2,
        dict(DEEPSEEK_TINY, index_n_heads=16, index_head_dim=32, index_topk=8),
        # Sharded on purpose: the loader must follow model.safetensors.index.json.
        dict(max_shard_size="300KB"),
    ),
    "qwen3_next": (
        Qwen3NextForCausalLM,
        Qwen3NextConfig,
        7,
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=4,
            full_attention_interval=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            partial_rotary_factor=0.25,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            max_position_embeddings=256,
            rms_norm_eps=1e-6,
        ),
        {},
    ),
    "deepseek_v3_unseen": (
        DeepseekV3ForCausalLM,
        DeepseekV3Config,
        4,
        dict(
            vocab_size=200,
            hidden_size=96,
            intermediate_size=160,
            num_hidden_layers=2,
            first_k_dense_replace=1,
            num_attention_heads=3,
            num_key_value_heads=3,
            q_lora_rank=None,
            kv_lora_rank=64,
            qk_nope_head_dim=32,
            qk_rope_head_dim=32,
            v_head_dim=32,
            n_routed_experts=8,
            num_experts_per_tok=3,
            n_group=2,
            topk_group=1,
            moe_intermediate_size=48,
            n_shared_experts=2,
            routed_scaling_factor=1.5,
            norm_topk_prob=False,
            rope_interleave=False,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
            max_position_embeddings=128,
            rms_norm_eps=1e-5,
        ),
        {},
    ),
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=DEFAULT_OUT, help="parent directory; each model goes to OUT/NAME")
    p.add_argument("--arch", choices=sorted(PRESETS) + ["all"], default="all", help="preset to build")
    p.add_argument("--seed", type=int, help="override the preset's seed (weights and prompt)")
    p.add_argument("--name", help="output directory name (default: the preset name); only with one --arch")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="override a config field, e.g. --set hidden_size=128 --set q_lora_rank=null (repeatable)",
    )
    args = p.parse_args(argv)
    if args.name and args.arch == "all":
        p.error("--name needs a single --arch")
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--set {item!r}: expected KEY=JSON, e.g. hidden_size=128")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError as e:
            p.error(f"--set {item!r}: the value is not JSON ({e}); quote strings: hidden_act='\"silu\"'")
    args.overrides = overrides
    return args


# ---------------------------------------------------------------------------------------------
# Weights


def init_weights(model, gen):
    """Overwrites every parameter and persistent buffer with seeded random values.

    Linear/expert weights are N(0, 1/fan_in) so every projection roughly keeps the scale of its
    input and the logits are O(1) (greedy decoding is not degenerate); norm weights are random
    around 1 (for Qwen3Next's `1 + w` norms, w around 0), and the router bias, gates and decay
    parameters are non-zero so that each of them changes the result.
    """
    done = set()

    def put(module_name, pname, value):
        full = f"{module_name}.{pname}" if module_name else pname
        t = getattr(model.get_submodule(module_name), pname)
        assert t.shape == value.shape, (full, t.shape, value.shape)
        with torch.no_grad():
            t.copy_(value)
        done.add(full)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    def near_one(n):
        return 1.0 + 0.1 * randn(n)

    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Embedding):
            put(name, "weight", randn(*m.weight.shape))
        elif isinstance(m, torch.nn.Linear):
            put(name, "weight", randn(*m.weight.shape) / math.sqrt(m.in_features))
            assert m.bias is None, f"{name}: unexpected bias"
        elif isinstance(m, torch.nn.Conv1d):
            k = m.weight.shape[-1]
            put(name, "weight", randn(*m.weight.shape) / math.sqrt(k))
        elif isinstance(m, qn.Qwen3NextRMSNorm):
            # y = norm(x) * (1 + w): w around 0.
            put(name, "weight", 0.1 * randn(*m.weight.shape))
        elif isinstance(m, (ds3.DeepseekV3RMSNorm, ds32.DeepseekV32RMSNorm, qn.Qwen3NextRMSNormGated)):
            put(name, "weight", near_one(m.weight.shape[0]))
        elif isinstance(m, torch.nn.LayerNorm):
            put(name, "weight", near_one(m.weight.shape[0]))
            put(name, "bias", 0.1 * randn(*m.bias.shape))
        elif isinstance(m, (ds3.DeepseekV3TopkRouter, ds32.DeepseekV32TopkRouter)):
            put(name, "weight", randn(*m.weight.shape) / math.sqrt(m.weight.shape[1]))
            # Comparable to the spread of the sigmoid scores, so it changes some selections.
            put(name, "e_score_correction_bias", 0.1 * randn(*m.e_score_correction_bias.shape))
        elif isinstance(m, qn.Qwen3NextTopKRouter):
            put(name, "weight", randn(*m.weight.shape) / math.sqrt(m.weight.shape[1]))
        elif isinstance(m, (ds3.DeepseekV3Experts, ds32.DeepseekV32Experts, qn.Qwen3NextExperts)):
            e, two_i, hidden = m.gate_up_proj.shape
            put(name, "gate_up_proj", randn(e, two_i, hidden) / math.sqrt(hidden))
            put(name, "down_proj", randn(*m.down_proj.shape) / math.sqrt(two_i // 2))
        if isinstance(m, qn.Qwen3NextGatedDeltaNet):
            n = m.num_v_heads
            put(name, "dt_bias", 0.5 * randn(n))
            # A in [0.5, 4): decays exp(g) well inside (0, 1) for these inputs.
            put(name, "A_log", (0.5 + 3.5 * torch.rand(n, generator=gen)).log())

    saved = set(model.state_dict().keys())
    missing = sorted(saved - done)
    assert not missing, f"not initialised: {missing}"


# ---------------------------------------------------------------------------------------------
# Checks of the selections (indexer, routers)


def rope_half(x, cos, sin):
    """Half-split RoPE of the last dim of x [.., T, (H,) d] with cos/sin [T, d]."""
    d = x.shape[-1]
    rot = torch.cat((-x[..., d // 2 :], x[..., : d // 2]), dim=-1)
    return x * cos + rot * sin


def boundary_margin(scores, k, valid=None):
    """Smallest gap between the k-th and (k+1)-th largest valid score over the rows of `scores`."""
    best = math.inf
    for r in range(scores.shape[0]):
        row = scores[r] if valid is None else scores[r][valid[r]]
        if row.numel() <= k:
            continue
        top = torch.sort(row.double(), descending=True).values
        best = min(best, float(top[k - 1] - top[k]))
    return best


class SelectionChecks:
    """Forward hooks that re-derive each top-k selection and record its margin."""

    def __init__(self, model):
        self.margins = {}
        self.mismatches = []
        self.handles = []
        for name, m in model.named_modules():
            if isinstance(m, ds32.DeepseekV32Indexer):
                self.handles.append(m.register_forward_hook(self._indexer(name), with_kwargs=True))
            elif isinstance(m, (ds3.DeepseekV3TopkRouter, ds32.DeepseekV32TopkRouter)):
                self.handles.append(m.register_forward_hook(self._deepseek_router(name)))
            elif isinstance(m, qn.Qwen3NextTopKRouter):
                self.handles.append(m.register_forward_hook(self._qwen_router(name)))

    def _record(self, key, margin):
        self.margins[key] = min(self.margins.get(key, math.inf), margin)

    def _indexer(self, name):
        def hook(m, args, kwargs, output):
            # Our transcription of DeepseekV32Indexer.forward (MODELS.md 5.1), then the same top-k.
            hidden, q_resid, (cos, sin) = args[0][0], args[1][0], args[2]
            cos, sin = cos[0], sin[0]
            dr, hd, nh = m.qk_rope_head_dim, m.head_dim, m.n_heads
            t = hidden.shape[0]
            q = (q_resid @ m.wq_b.weight.T).view(t, nh, hd)
            q = torch.cat((rope_half(q[..., :dr], cos[:, None, :], sin[:, None, :]), q[..., dr:]), -1)
            cache = kwargs.get("cache")
            if cache is not None:
                keys = cache.layers[m.layer_idx].indexer_keys[0]
            else:
                k = F.layer_norm(hidden @ m.wk.weight.T, (hd,), m.k_norm.weight, m.k_norm.bias, 1e-6)
                keys = torch.cat((rope_half(k[..., :dr], cos, sin), k[..., dr:]), -1)
            s = keys.shape[0]
            per_head = F.relu(torch.einsum("thd,sd->ths", q, keys) * hd**-0.5)
            w = (hidden @ m.weights_proj.weight.T) * nh**-0.5
            scores = torch.einsum("th,ths->ts", w, per_head)
            valid = torch.arange(s)[None, :] <= (s - t + torch.arange(t))[:, None]
            k_sel = min(m.index_topk, s)
            self._record(f"{name} (index_topk {m.index_topk})", boundary_margin(scores, k_sel, valid))
            hf = output[0].long()
            for r in range(t):
                row = scores[r].masked_fill(~valid[r], -math.inf)
                ours = set(torch.topk(row, k_sel).indices.tolist())
                theirs = set(hf[r].tolist())
                vr = set(torch.nonzero(valid[r]).flatten().tolist())
                if ours & vr != theirs & vr:
                    self.mismatches.append(f"{name} row {r}: ours {sorted(ours & vr)}, HF {sorted(theirs & vr)}")

        return hook

    def _deepseek_router(self, name):
        def hook(m, args, output):
            x = args[0].reshape(-1, m.hidden_dim).float()
            sc = torch.sigmoid(x @ m.weight.float().T) + m.e_score_correction_bias
            g, per = m.num_group, m.num_experts // m.num_group
            group = sc.view(-1, g, per).topk(2, dim=-1).values.sum(-1)
            if m.topk_group < g:
                self._record(f"{name} groups", boundary_margin(group, m.topk_group))
            keep = torch.zeros_like(group).scatter_(1, group.topk(m.topk_group, dim=-1).indices, 1)
            allowed = keep.bool().repeat_interleave(per, dim=1)
            self._record(f"{name} experts", boundary_margin(sc, m.top_k, allowed))

        return hook

    def _qwen_router(self, name):
        def hook(m, args, output):
            probs = torch.softmax(args[0].reshape(-1, m.hidden_dim) @ m.weight.T, dim=-1)
            self._record(f"{name} experts", boundary_margin(probs, m.top_k))

        return hook

    def close(self):
        for h in self.handles:
            h.remove()


# ---------------------------------------------------------------------------------------------
# One model


def build(name, args):
    model_cls, config_cls, seed, cfg, save_kw = PRESETS[name]
    seed = args.seed if args.seed is not None else seed
    cfg = dict(cfg, **args.overrides)
    cfg.setdefault("tie_word_embeddings", False)  # explicit in config.json: lm_head is its own tensor
    torch.manual_seed(seed)  # HF's own init draws from the global RNG before ours overwrites it
    config = config_cls(**cfg)
    model = model_cls(config).eval()
    model.set_attn_implementation("eager")
    init_weights(model, torch.Generator().manual_seed(seed))
    prompt_gen = torch.Generator().manual_seed(seed + 1000)
    prompt = torch.randint(0, config.vocab_size, (PROMPT_LEN,), generator=prompt_gen)
    return model, config, seed, save_kw, prompt


def run(model, prompt):
    """Prefill (with hidden-state hooks), greedy generation, and the consistency checks."""
    layers = model.model.layers
    captured = {}

    def keep(i):
        def hook(module, args, output):
            captured[i] = (output[0] if isinstance(output, tuple) else output)[0].clone()

        return hook

    hooks = [model.model.embed_tokens.register_forward_hook(keep(0))]
    hooks += [layer.register_forward_hook(keep(i + 1)) for i, layer in enumerate(layers)]
    checks = SelectionChecks(model)
    with torch.no_grad():
        out = model(prompt[None], use_cache=False, output_hidden_states=True)
    for h in hooks:
        h.remove()
    logits = out.logits[0]
    hidden = [captured[i] for i in range(len(layers) + 1)]
    for i, h in enumerate(out.hidden_states[:-1]):
        assert torch.equal(h[0], hidden[i]), f"output_hidden_states[{i}] differs from the hooked value"
    last_normed = out.hidden_states[-1][0]
    assert torch.equal(last_normed, model.model.norm(hidden[-1][None])[0]), "HF's last hidden state != norm(last)"

    # The model's own generation config, replaced so that an EOS id from the model config (DeepSeek
    # has eos_token_id 1) cannot stop greedy decoding early: exactly NEW_TOKENS come out. It is what
    # save_pretrained writes as generation_config.json.
    model.generation_config = GenerationConfig(
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        pad_token_id=0,
        use_cache=True,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        g = model.generate(prompt[None], attention_mask=torch.ones(1, PROMPT_LEN, dtype=torch.long))
    generated = g.sequences[0, PROMPT_LEN:]
    decode_logits = torch.stack([step[0] for step in g.logits])
    assert generated.shape == (NEW_TOKENS,), generated.shape
    assert torch.equal(decode_logits.argmax(-1), generated), "greedy tokens != argmax of the step logits"
    assert len(set(generated.tolist())) > 1, f"degenerate generation: {generated.tolist()}"

    # The cached decode path against one cache-free forward over the same tokens.
    full = torch.cat((prompt, generated[:-1]))
    with torch.no_grad():
        ref = model(full[None], use_cache=False).logits[0, PROMPT_LEN - 1 :]
    decode_vs_full = float((ref - decode_logits).abs().max() / ref.abs().max())
    assert decode_vs_full < 1e-4, f"decode logits differ from a cache-free forward by {decode_vs_full:.3g} (rel)"
    prefill_vs_step0 = float((logits[-1] - decode_logits[0]).abs().max())
    checks.close()
    assert not checks.mismatches, "indexer transcription disagrees with HF:\n" + "\n".join(checks.mismatches)
    low = {k: v for k, v in checks.margins.items() if v < MIN_MARGIN}
    assert not low, f"top-k selections too close to a tie (margin < {MIN_MARGIN}): {low}; try another --seed"
    return dict(
        logits=logits,
        hidden=hidden,
        last_normed=last_normed,
        generated=generated,
        decode_logits=decode_logits,
        decode_vs_full=decode_vs_full,
        prefill_vs_step0=prefill_vs_step0,
        margins=checks.margins,
    )


def write_model(name, args):
    model, config, seed, save_kw, prompt = build(name, args)
    res = run(model, prompt)
    out_dir = os.path.join(args.out, args.name or name)
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):  # a stale shard from a different layout must not survive
        if f.endswith(".safetensors") or f.endswith(".json"):
            os.remove(os.path.join(out_dir, f))
    model.save_pretrained(out_dir, **save_kw)

    tensors = {
        "input_ids": prompt.to(torch.int64).contiguous(),
        "logits": res["logits"].contiguous(),
        "last_hidden_state": res["last_normed"].contiguous(),
        "generated": res["generated"].to(torch.int64).contiguous(),
        "decode_logits": res["decode_logits"].contiguous(),
    }
    for i, h in enumerate(res["hidden"]):
        tensors[f"hidden_states.{i}"] = h.contiguous()
    # The arguments that determine the content (not --out), so the bytes do not depend on where
    # the files were written: regenerating one model is `python <command> --out DIR`.
    cmd = ["tests/reference/gen_models.py", "--arch", name]
    if args.seed is not None:
        cmd += ["--seed", str(args.seed)]
    for key, value in sorted(args.overrides.items()):
        cmd += ["--set", f"{key}={json.dumps(value)}"]
    if args.name:
        cmd += ["--name", args.name]
    metadata = {
        "generator": "tests/reference/gen_models.py",
        "command": shlex.join(cmd),
        "preset": name,
        "model_type": config.model_type,
        "seed": seed,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": "cpu",
        "dtype": "float32",
        "attn_implementation": "eager",
        "prompt_len": PROMPT_LEN,
        "new_tokens": NEW_TOKENS,
        "hidden_states": "0 = embedding output, l+1 = output of decoder layer l (last: before the final norm)",
        "decode_logits": "row 0 = prefill logits of the last prompt token, row j = decode step fed generated[j-1]",
        "check_decode_vs_cache_free_forward_rel": float(f"{res['decode_vs_full']:.3g}"),
        "check_prefill_vs_decode_row0_abs": float(f"{res['prefill_vs_step0']:.3g}"),
        "check_topk_margins": {k: float(f"{v:.4g}") for k, v in res["margins"].items()},
    }
    # One metadata key holding sorted JSON: safetensors writes a multi-key metadata map in hash
    # order, which would make the bytes differ from run to run.
    save_file(
        tensors,
        os.path.join(out_dir, "golden.safetensors"),
        metadata={"provenance": json.dumps(metadata, sort_keys=True)},
    )
    total = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    print(f"{name}: wrote {out_dir} ({total} bytes); generated {res['generated'].tolist()}")
    print(f"  decode vs cache-free forward (rel) {res['decode_vs_full']:.3g}; min top-k margin "
          f"{min(res['margins'].values(), default=math.inf):.3g}")
    assert total < 2 * 1024 * 1024, f"{out_dir} is {total} bytes, over the 2 MB budget"


def main(argv):
    args = parse_args(argv)
    torch.set_num_threads(1)  # the reduction order, hence the bits, must not depend on the machine's cores
    torch.use_deterministic_algorithms(True)
    names = sorted(PRESETS) if args.arch == "all" else [args.arch]
    for name in names:
        write_model(name, args)


if __name__ == "__main__":
    main(sys.argv[1:])
