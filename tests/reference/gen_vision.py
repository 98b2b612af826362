#!/usr/bin/env python3
"""A tiny Qwen3-VL-MoE vision encoder with golden outputs, for day0's vision path (issue #17).

Builds transformers' `Qwen3VLMoeVisionModel` from a tiny `vision_config` in float32 with random
weights (every parameter drawn, LayerNorm scales around 1, so biases and affine norms are all
exercised), runs it on random pixel rows of two images of different patch grids, and writes
`model/testdata/vision/qwen3_vl_moe_tiny/`:

- `config.json`: `{"model_type": "qwen3_vl_moe", "vision_config": {...}}` as transformers writes
  the vision config;
- `preprocessor_config.json`, `image_a.png` (56×40, already at a size the processor keeps) and
  `image_b.png` (50×30, resized to 48×32), and `processor.safetensors`: transformers'
  `Qwen2VLImageProcessorFast` output for each, `pixel_values.{a,b}` and `grid_thw.{a,b}`;
- `golden.safetensors`: the encoder's weights under `model.visual.` (the released checkpoints'
  names), `pixel_values` (F32 [N, C*T*P*P], the processor's patch rows), `grid_thw` (I64
  [images, 3]), `tokens` (F32 [N/4, out_hidden_size], the merger output), `deepstack.{j}` (the
  DeepStack mergers' outputs), and metadata `provenance` (versions, seed, command).

Deterministic: one CPU thread, fixed seed. Needs torch and transformers (>= 4.57: Qwen3-VL).
"""

import json
import math
import os
import platform
import shlex
import sys

import torch
import transformers
from safetensors.torch import save_file

SEED = 17
OUT = os.path.join(os.path.dirname(__file__), "..", "..", "model", "testdata", "vision", "qwen3_vl_moe_tiny")

VISION = dict(
    depth=3,
    hidden_size=32,
    hidden_act="gelu_pytorch_tanh",
    intermediate_size=48,
    num_heads=2,
    in_channels=3,
    patch_size=4,
    spatial_merge_size=2,
    temporal_patch_size=2,
    out_hidden_size=24,
    num_position_embeddings=36,
    deepstack_visual_indexes=[0, 2],
)

# Two images of different sizes (patch grids, multiples of the 2x2 merge), one of them taller
# than the 6x6 position table is wide (the interpolation stretches it).
GRIDS = [[1, 4, 6], [1, 8, 2]]


PROCESSOR = {
    "patch_size": 4,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "size": {"shortest_edge": 256, "longest_edge": 65536},
    # CLIP's per-channel statistics (not Qwen3-VL's 0.5): each channel normalised differently.
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "rescale_factor": 1 / 255,
    "resample": 3,
    "image_processor_type": "Qwen2VLImageProcessorFast",
}

# (name, width, height): a keeps its size (multiples of 8, inside the pixel limits); b is resized.
IMAGES = [("a", 56, 40), ("b", 50, 30)]


def write_images_and_processor_golden(gen):
    """Deterministic test images (gradients plus noise: every channel and pixel different), and
    what transformers' processor makes of them."""
    import numpy as np
    from PIL import Image
    from transformers import Qwen2VLImageProcessorFast

    with open(os.path.join(OUT, "preprocessor_config.json"), "w") as f:
        json.dump(PROCESSOR, f, indent=2, sort_keys=True)
        f.write("\n")
    proc = Qwen2VLImageProcessorFast.from_pretrained(OUT)
    golden = {}
    for name, w, h in IMAGES:
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 255 / w, y * 255 / h, (x + y) * 255 / (w + h)], axis=-1)
        noise = torch.randint(-40, 41, (h, w, 3), generator=gen).numpy()
        arr = np.clip(base + noise, 0, 255).astype(np.uint8)
        path = os.path.join(OUT, f"image_{name}.png")
        Image.fromarray(arr, "RGB").save(path)
        out = proc(images=Image.open(path), return_tensors="pt")
        golden[f"pixel_values.{name}"] = out["pixel_values"].to(torch.float32).contiguous()
        golden[f"grid_thw.{name}"] = out["image_grid_thw"].to(torch.long).contiguous()
    return golden


def main():
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    from transformers.models.qwen3_vl_moe import configuration_qwen3_vl_moe as conf
    from transformers.models.qwen3_vl_moe import modeling_qwen3_vl_moe as modeling

    vcfg = conf.Qwen3VLMoeVisionConfig(**VISION)
    model = modeling.Qwen3VLMoeVisionModel._from_config(vcfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    grid = torch.tensor(GRIDS, dtype=torch.long)
    n = int(grid.prod(-1).sum())
    c = VISION["in_channels"] * VISION["temporal_patch_size"] * VISION["patch_size"] ** 2
    pixels = torch.randn(n, c, dtype=torch.float32)
    with torch.no_grad():
        out = model(pixels, grid_thw=grid)
    if isinstance(out, tuple):
        tokens, deepstack = out[0], out[1]
    else:
        tokens, deepstack = out.pooler_output, out.deepstack_features
    tensors = {f"model.visual.{k}": v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    tensors["pixel_values"] = pixels
    tensors["grid_thw"] = grid
    tensors["tokens"] = tokens.contiguous()
    for j, d in enumerate(deepstack):
        tensors[f"deepstack.{j}"] = d.contiguous()
    provenance = {
        "script": "tests/reference/gen_vision.py",
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "seed": SEED,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "grids": GRIDS,
    }
    os.makedirs(OUT, exist_ok=True)
    gen = torch.Generator().manual_seed(SEED + 1)
    processed = write_images_and_processor_golden(gen)
    import torchvision

    provenance["torchvision"] = torchvision.__version__
    save_file(processed, os.path.join(OUT, "processor.safetensors"), metadata={"provenance": json.dumps(provenance)})
    save_file(tensors, os.path.join(OUT, "golden.safetensors"), metadata={"provenance": json.dumps(provenance)})
    d = vcfg.to_dict()
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump({"model_type": "qwen3_vl_moe", "vision_config": d}, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"wrote {OUT}: {n} patches -> tokens {tuple(tokens.shape)}, {len(deepstack)} deepstack features")




# ---------------------------------------------------------------------------------------------
# The language model of a tiny Qwen3-VL-MoE checkpoint, text-only prompt (issue #17 item 3's first
# half): a whole `save_pretrained` checkpoint under model/testdata/tiny/qwen3_vl_moe with the
# golden format of gen_models.py (input_ids, logits, hidden_states.{i}, last_hidden_state,
# generated, decode_logits), so model/tests/forward_golden.rs checks it like the others.

TEXT = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    moe_intermediate_size=32,
    num_experts=8,
    num_experts_per_tok=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    # 8 frequencies per head: T H W T H W T T (interleaved, sections 4 / 2 / 2).
    rope_scaling={"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True},
)
TEXT_SEED = 23
PROMPT_LEN = 24
NEW_TOKENS = 16
MIN_MARGIN = 1e-4
TEXT_OUT = os.path.join(os.path.dirname(__file__), "..", "..", "model", "testdata", "tiny", "qwen3_vl_moe")


def write_text_model():
    from transformers import GenerationConfig
    from transformers.models.qwen3_vl_moe import configuration_qwen3_vl_moe as conf
    from transformers.models.qwen3_vl_moe import modeling_qwen3_vl_moe as modeling

    torch.manual_seed(TEXT_SEED)
    config = conf.Qwen3VLMoeConfig(text_config=TEXT, vision_config=VISION, tie_word_embeddings=False)
    model = modeling.Qwen3VLMoeForConditionalGeneration(config).eval()
    model.set_attn_implementation("eager")
    gen = torch.Generator().manual_seed(TEXT_SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * r)
            elif name.endswith("bias"):
                p.copy_(0.1 * r)
            elif "embed_tokens" in name:
                p.copy_(r)
            else:
                # [out, in] linears and the fused experts [E, 2I, H] / [E, H, I]: 1/sqrt(fan_in).
                p.copy_(r / math.sqrt(p.shape[-1]))
    lm = model.model.language_model
    prompt = torch.randint(0, TEXT["vocab_size"], (PROMPT_LEN,), generator=torch.Generator().manual_seed(TEXT_SEED + 1000))

    captured, margins = {}, []

    def keep(i):
        def hook(module, args, output):
            captured[i] = (output[0] if isinstance(output, tuple) else output)[0].clone()

        return hook

    def router_margin(module, args):
        x = args[0].reshape(-1, args[0].shape[-1])
        probs = torch.softmax((x @ module.weight.T).double(), dim=-1)
        top = torch.sort(probs, dim=-1, descending=True).values
        k = TEXT["num_experts_per_tok"]
        margins.append(float((top[:, k - 1] - top[:, k]).min()))

    hooks = [lm.embed_tokens.register_forward_hook(keep(0))]
    hooks += [layer.register_forward_hook(keep(i + 1)) for i, layer in enumerate(lm.layers)]
    hooks += [layer.mlp.gate.register_forward_pre_hook(router_margin) for layer in lm.layers]
    with torch.no_grad():
        out = model(input_ids=prompt[None], use_cache=False, output_hidden_states=True)
    for h in hooks:
        h.remove()
    layers = len(lm.layers)
    hidden = [captured[i] for i in range(layers + 1)]
    last_normed = lm.norm(hidden[-1][None])[0]
    model.generation_config = GenerationConfig(
        max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, use_cache=True,
        output_logits=True, return_dict_in_generate=True,
    )
    with torch.no_grad():
        g = model.generate(input_ids=prompt[None], attention_mask=torch.ones(1, PROMPT_LEN, dtype=torch.long))
    generated = g.sequences[0, PROMPT_LEN:]
    decode_logits = torch.stack([step[0] for step in g.logits])
    assert torch.equal(decode_logits.argmax(-1), generated)
    assert len(set(generated.tolist())) > 1, f"degenerate generation {generated.tolist()}"
    full = torch.cat((prompt, generated[:-1]))
    with torch.no_grad():
        ref = model(input_ids=full[None], use_cache=False).logits[0, PROMPT_LEN - 1 :]
    rel = float((ref - decode_logits).abs().max() / ref.abs().max())
    assert rel < 1e-4, f"decode logits differ from a cache-free forward by {rel}"
    assert min(margins) > MIN_MARGIN, f"router top-k margin {min(margins)} too close to a tie"

    os.makedirs(TEXT_OUT, exist_ok=True)
    model.save_pretrained(TEXT_OUT)
    tensors = {
        "input_ids": prompt.to(torch.int64).contiguous(),
        "logits": out.logits[0].contiguous(),
        "last_hidden_state": last_normed.contiguous(),
        "generated": generated.to(torch.int64).contiguous(),
        "decode_logits": decode_logits.contiguous(),
    }
    for i, h in enumerate(hidden):
        tensors[f"hidden_states.{i}"] = h.contiguous()
    provenance = {
        "script": "tests/reference/gen_vision.py",
        "seed": TEXT_SEED,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "router_margin": min(margins),
        "decode_vs_full": rel,
    }
    save_file(tensors, os.path.join(TEXT_OUT, "golden.safetensors"), metadata={"provenance": json.dumps(provenance)})
    print(f"wrote {TEXT_OUT}: prompt {PROMPT_LEN}, generated {generated.tolist()}, router margin {min(margins):.3g}")


if __name__ == "__main__":
    main()
    write_text_model()
