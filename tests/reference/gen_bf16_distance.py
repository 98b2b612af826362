"""How far transformers in bf16 is from transformers in f32, per tiny checkpoint.

Issue #13 item 1 bounds day0's native-precision forward by this distance: on every tiny checkpoint,
day0's native logits and per-layer hidden states may be no further from the f32 golden than twice
the distance of transformers in bf16 from it. This script loads each checkpoint under
`model/testdata/tiny/` in bf16 (`torch_dtype=torch.bfloat16`, the dtype users run), runs the
golden's prompt cache-free with hidden-state hooks exactly as `gen_models.py` does, and writes
`model/testdata/tiny/bf16_distance.json`: per checkpoint and per tensor (`hidden_states.{i}`,
`logits`), the relative L2 distance ||bf16 - f32|| / ||f32|| over all positions, plus the versions
used; a checkpoint with a `golden_image.safetensors` (prompt with images) also gets an
`image_prompts` entry (`vision.tokens`, `hidden_states.{i >= 1}`, `logits`). The Rust test (`model/tests/native_precision.rs`) reads only the JSON: no Python at test time.

Run: /path/to/venv/bin/python tests/reference/gen_bf16_distance.py [NAME ...]
(the venv needs torch and transformers; the committed file was made with the versions it records).
With names, only those checkpoints are (re)measured and merged into the existing file, their
versions recorded under `provenance.by_checkpoint` (`qwen3_vl_moe` was added that way, with
transformers 5.25.0, without re-measuring the others).
"""

import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, DeepseekV3ForCausalLM

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "model", "testdata", "tiny")


def hidden_and_logits(model, prompt):
    # A multimodal model's language model sits one level down (Qwen3-VL-MoE).
    lm = getattr(model.model, "language_model", model.model)
    layers = lm.layers
    captured = {}

    def keep(i):
        def hook(module, args, output):
            captured[i] = (output[0] if isinstance(output, tuple) else output)[0].float().clone()

        return hook

    hooks = [lm.embed_tokens.register_forward_hook(keep(0))]
    hooks += [layer.register_forward_hook(keep(i + 1)) for i, layer in enumerate(layers)]
    with torch.no_grad():
        out = model(prompt[None], use_cache=False)
    for h in hooks:
        h.remove()
    tensors = {f"hidden_states.{i}": captured[i] for i in range(len(layers) + 1)}
    tensors["logits"] = out.logits[0].float()
    return tensors


def image_prompt_distance(model, d):
    """The bf16 distance on a checkpoint's prompt with images (`golden_image.safetensors`, from
    gen_vision.py): the encoder's tokens, every decoder layer's output and the logits (the
    embedding row is left out: its hook sees the text embeddings before the image tokens go in)."""
    ref = load_file(os.path.join(d, "golden_image.safetensors"))
    ids = ref["input_ids"].to(torch.long)
    image_token = model.config.image_token_id
    kw = dict(
        pixel_values=ref["pixel_values"].to(torch.bfloat16),
        image_grid_thw=ref["image_grid_thw"].to(torch.long),
        mm_token_type_ids=(ids == image_token).to(torch.int32)[None],
    )
    lm = model.model.language_model
    captured = {}

    def keep(i):
        def hook(module, args, output):
            captured[i] = (output[0] if isinstance(output, tuple) else output)[0].float().clone()

        return hook

    hooks = [layer.register_forward_hook(keep(i + 1)) for i, layer in enumerate(lm.layers)]
    with torch.no_grad():
        vout = model.model.visual(kw["pixel_values"], grid_thw=kw["image_grid_thw"])
        out = model(ids[None], use_cache=False, **kw)
    for h in hooks:
        h.remove()
    tokens = vout[0] if isinstance(vout, tuple) else vout.pooler_output
    got = {f"hidden_states.{i}": captured[i] for i in range(1, len(lm.layers) + 1)}
    got["logits"] = out.logits[0].float()
    got["vision.tokens"] = tokens.float()
    dist = {}
    for k, v in got.items():
        r = ref[k].float()
        dist[k] = float((v - r).norm() / r.norm().clamp_min(1e-30))
    return dist


def main():
    result = {
        "provenance": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": sys.version.split()[0],
            "metric": "relative L2 distance ||bf16 - f32|| / ||f32|| over all positions",
        },
        "checkpoints": {},
    }
    only = sys.argv[1:]
    out = os.path.join(ROOT, "bf16_distance.json")
    if only:
        with open(out) as f:
            result = json.load(f)
        by = result["provenance"].setdefault("by_checkpoint", {})
        for name in only:
            by[name] = {"torch": torch.__version__, "transformers": transformers.__version__}
    for name in sorted(os.listdir(ROOT)):
        if only and name not in only:
            continue
        d = os.path.join(ROOT, name)
        golden = os.path.join(d, "golden.safetensors")
        if not os.path.exists(golden):
            continue
        ref = load_file(golden)
        prompt = ref["input_ids"].to(torch.long)
        # Eager attention and experts, as the f32 goldens were made (gen_models.py).
        kw = dict(torch_dtype=torch.bfloat16, attn_implementation="eager", experts_implementation="eager")
        try:
            with open(os.path.join(d, "config.json")) as f:
                model_type = json.load(f)["model_type"]
            if model_type == "qwen3_vl_moe":
                from transformers import Qwen3VLMoeForConditionalGeneration

                model = Qwen3VLMoeForConditionalGeneration.from_pretrained(d, **kw)
            else:
                model = AutoModelForCausalLM.from_pretrained(d, **kw)
        except ValueError:
            # Kimi-K2 (`kimi_k2`) is DeepSeek-V3's architecture; gen_models.py builds it that way.
            model = DeepseekV3ForCausalLM.from_pretrained(d, **kw)
        model.eval()
        got = hidden_and_logits(model, prompt)
        dist = {}
        for k, v in got.items():
            r = ref[k].float()
            dist[k] = float((v - r).norm() / r.norm().clamp_min(1e-30))
        result["checkpoints"][name] = dist
        print(name, f"logits {dist['logits']:.3e}", file=sys.stderr)
        if os.path.exists(os.path.join(d, "golden_image.safetensors")):
            img = image_prompt_distance(model, d)
            result.setdefault("image_prompts", {})[name] = img
            print(name, f"image prompt logits {img['logits']:.3e}", file=sys.stderr)
    with open(out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
