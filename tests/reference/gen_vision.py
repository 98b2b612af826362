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
  DeepStack mergers' outputs), and metadata `provenance` (versions, seed, command);
- `image_c.jpg` and `jpeg.safetensors` (`gen_vision.py jpeg`): a JPEG, what PIL decodes and what
  the processor makes of it.

`gen_vision.py text` writes the tiny checkpoint `model/testdata/tiny/qwen3_vl_moe` with its text
and image-prompt goldens (see `write_text_model` and `write_image_golden`).

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




def write_jpeg_golden():
    """A JPEG test image (`image_c.jpg`, 64x48, quality 95, no chroma subsampling, so decoders
    differ only by their IDCT rounding) with what PIL decodes (`rgb.c`, U8 [h, w, 3]) and what
    transformers' processor makes of it (`pixel_values.c`, `grid_thw.c`): `jpeg.safetensors`."""
    import numpy as np
    from PIL import Image
    from transformers import Qwen2VLImageProcessorFast

    gen = torch.Generator().manual_seed(SEED + 3)
    w, h = 64, 48
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([255 - x * 255 / w, (x + y) * 255 / (w + h), y * 255 / h], axis=-1)
    noise = torch.randint(-30, 31, (h, w, 3), generator=gen).numpy()
    arr = np.clip(base + noise, 0, 255).astype(np.uint8)
    path = os.path.join(OUT, "image_c.jpg")
    Image.fromarray(arr, "RGB").save(path, quality=95, subsampling=0)
    proc = Qwen2VLImageProcessorFast.from_pretrained(OUT)
    img = Image.open(path)
    out = proc(images=img, return_tensors="pt")
    golden = {
        "rgb.c": torch.from_numpy(np.asarray(img.convert("RGB")).copy()),
        "pixel_values.c": out["pixel_values"].to(torch.float32).contiguous(),
        "grid_thw.c": out["image_grid_thw"].to(torch.long).contiguous(),
    }
    import PIL
    import torchvision

    provenance = {"script": "tests/reference/gen_vision.py jpeg", "seed": SEED + 3, "pillow": PIL.__version__,
                  "torch": torch.__version__, "torchvision": torchvision.__version__,
                  "transformers": transformers.__version__}
    save_file(golden, os.path.join(OUT, "jpeg.safetensors"), metadata={"provenance": json.dumps(provenance)})
    print(f"wrote {path} and jpeg.safetensors: grid {out['image_grid_thw'].tolist()}")


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
TEXT_SEED = 27  # 23..26 put a router top-k within 1e-4 of a tie on one of the prompts
PROMPT_LEN = 24
NEW_TOKENS = 16
MIN_MARGIN = 1e-4
TEXT_OUT = os.path.join(os.path.dirname(__file__), "..", "..", "model", "testdata", "tiny", "qwen3_vl_moe")


# The tiny checkpoint's encoder: VISION with merged tokens as wide as the language model's hidden
# states (the checkpoint runs images end to end).
VISION_LM = dict(VISION, out_hidden_size=TEXT["hidden_size"])
# Special tokens inside the tiny vocabulary (the released ids, ~151k, are not).
SPECIAL = dict(image_token_id=251, video_token_id=253, vision_start_token_id=250, vision_end_token_id=252)


def lm_golden(out, last_normed, generated, decode_logits, hidden):
    """The language model's part of a golden file (gen_models.py's format): logits, the final
    norm's output, the greedy tokens and their logits, and `hidden_states.{i}`."""
    tensors = {
        "logits": out.logits[0].contiguous(),
        "last_hidden_state": last_normed.contiguous(),
        "generated": generated.to(torch.int64).contiguous(),
        "decode_logits": decode_logits.contiguous(),
    }
    for i, h in enumerate(hidden):
        tensors[f"hidden_states.{i}"] = h.contiguous()
    return tensors


def greedy_checked(model, ids, mm=None, **kw):
    """NEW_TOKENS greedy tokens after `ids` (image token types `mm`, images in `kw`) with each
    step's logits, checked: the tokens are the logits' argmax, not all one token, and the cached
    decode's logits match a cache-free forward over the whole sequence (1e-4)."""
    n = ids.shape[0]
    types = {} if mm is None else {"mm_token_type_ids": mm[None]}
    with torch.no_grad():
        g = model.generate(input_ids=ids[None], attention_mask=torch.ones(1, n, dtype=torch.long), **types, **kw)
    generated = g.sequences[0, n:]
    decode_logits = torch.stack([step[0] for step in g.logits])
    assert torch.equal(decode_logits.argmax(-1), generated)
    assert len(set(generated.tolist())) > 1, f"degenerate generation {generated.tolist()}"
    full = torch.cat((ids, generated[:-1]))
    if mm is not None:
        types = {"mm_token_type_ids": torch.cat((mm, torch.zeros(NEW_TOKENS - 1, dtype=torch.int32)))[None]}
    with torch.no_grad():
        ref = model(input_ids=full[None], use_cache=False, **types, **kw).logits[0, n - 1 :]
    rel = float((ref - decode_logits).abs().max() / ref.abs().max())
    assert rel < 1e-4, f"decode logits differ from a cache-free forward by {rel}"
    return generated, decode_logits, rel


def write_text_model():
    from transformers import GenerationConfig
    from transformers.models.qwen3_vl_moe import configuration_qwen3_vl_moe as conf
    from transformers.models.qwen3_vl_moe import modeling_qwen3_vl_moe as modeling

    torch.manual_seed(TEXT_SEED)
    config = conf.Qwen3VLMoeConfig(text_config=TEXT, vision_config=VISION_LM, tie_word_embeddings=False, **SPECIAL)
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
    generated, decode_logits, rel = greedy_checked(model, prompt)
    assert min(margins) > MIN_MARGIN, f"router top-k margin {min(margins)} too close to a tie"

    os.makedirs(TEXT_OUT, exist_ok=True)
    model.save_pretrained(TEXT_OUT)
    tensors = {"input_ids": prompt.to(torch.int64).contiguous()}
    tensors.update(lm_golden(out, last_normed, generated, decode_logits, hidden))
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
    write_image_golden(model, keep, router_margin, captured, margins)


# Text around the two images: text, <vision_start> image a <vision_end>, text, <vision_start>
# image b <vision_end>, text (a chat template's layout).
IMAGE_PROMPT_TEXT = [5, 3, 4]


def write_image_golden(model, keep, router_margin, captured, margins):
    """The same checkpoint on a prompt with the two committed test images (processed as the
    processor config in the checkpoint says): `golden_image.safetensors` next to `golden.safetensors`
    with `prompt_tokens` (one image placeholder per image, what `day0 forward --image` takes),
    `input_ids` (placeholders widened), `pixel_values` and `image_grid_thw`, `position_ids`
    (I64 [3, T], get_rope_index) and `rope_delta`, `vision.hidden_states.{i}` (each encoder
    block's output), `vision.tokens` and `vision.deepstack.{j}` (the encoder's output),
    `hidden_states.{i}` (decoder layer outputs, before DeepStack adds to them, as transformers
    records them), `logits`, `last_hidden_state`, `generated` (16 greedy
    tokens) and `decode_logits`."""
    from PIL import Image
    from transformers import Qwen2VLImageProcessorFast

    with open(os.path.join(TEXT_OUT, "preprocessor_config.json"), "w") as f:
        json.dump(PROCESSOR, f, indent=2, sort_keys=True)
        f.write("\n")
    proc = Qwen2VLImageProcessorFast.from_pretrained(TEXT_OUT)
    pixels, grids = [], []
    for name, _, _ in IMAGES:
        out = proc(images=Image.open(os.path.join(OUT, f"image_{name}.png")), return_tensors="pt")
        pixels.append(out["pixel_values"].to(torch.float32))
        grids.append(out["image_grid_thw"].to(torch.long))
    pixels, grid = torch.cat(pixels), torch.cat(grids)
    merge = VISION_LM["spatial_merge_size"]
    counts = [int(g.prod()) // merge**2 for g in grid]
    gen = torch.Generator().manual_seed(TEXT_SEED + 2000)
    text = lambda n: torch.randint(0, 240, (n,), generator=gen).tolist()
    start, image, end = SPECIAL["vision_start_token_id"], SPECIAL["image_token_id"], SPECIAL["vision_end_token_id"]
    t0, t1, t2 = IMAGE_PROMPT_TEXT
    short = text(t0) + [start, image, end] + text(t1) + [start, image, end] + text(t2)
    ids = []
    for tok in short:
        ids += [image] * counts[len([t for t in ids if t == start]) - 1] if tok == image else [tok]
    ids = torch.tensor(ids, dtype=torch.long)
    prompt_short = torch.tensor(short, dtype=torch.long)
    mm = (ids == image).to(torch.int32)
    n = ids.shape[0]
    lm = model.model.language_model
    visual = model.model.visual
    blocks = {}

    def keep_block(i):
        def hook(module, args, output):
            blocks[i] = (output[0] if isinstance(output, tuple) else output).clone()

        return hook

    block_hooks = [b.register_forward_hook(keep_block(i)) for i, b in enumerate(visual.blocks)]
    with torch.no_grad():
        vout = visual(pixels, grid_thw=grid)
    for h in block_hooks:
        h.remove()
    vtokens, vdeep = (vout[0], vout[1]) if isinstance(vout, tuple) else (vout.pooler_output, vout.deepstack_features)
    position_ids, delta = model.model.get_rope_index(ids[None], mm[None], image_grid_thw=grid)
    captured.clear()
    margins.clear()
    hooks = [lm.embed_tokens.register_forward_hook(keep(0))]
    hooks += [layer.register_forward_hook(keep(i + 1)) for i, layer in enumerate(lm.layers)]
    hooks += [layer.mlp.gate.register_forward_pre_hook(router_margin) for layer in lm.layers]
    kw = dict(pixel_values=pixels, image_grid_thw=grid)
    with torch.no_grad():
        out = model(input_ids=ids[None], mm_token_type_ids=mm[None], use_cache=False, output_hidden_states=True, **kw)
    for h in hooks:
        h.remove()
    layers = len(lm.layers)
    hidden = [captured[i] for i in range(layers + 1)]
    for i, h in enumerate(out.hidden_states[1:-1]):
        assert torch.equal(h[0], hidden[i + 1]), f"output_hidden_states[{i + 1}] differs from the hooked layer output"
    # The embedding hook sees the text embeddings; transformers' hidden_states[0] has the image
    # tokens scattered in (what day0 reports as the embedding output).
    hidden[0] = out.hidden_states[0][0].clone()
    last_normed = out.hidden_states[-1][0]
    generated, decode_logits, rel = greedy_checked(model, ids, mm, **kw)
    assert min(margins) > MIN_MARGIN, f"router top-k margin {min(margins)} too close to a tie"
    tensors = {
        "prompt_tokens": prompt_short.contiguous(),
        "input_ids": ids.contiguous(),
        "pixel_values": pixels.contiguous(),
        "image_grid_thw": grid.contiguous(),
        "position_ids": position_ids[:, 0].to(torch.int64).contiguous(),
        "rope_delta": delta.reshape(1).to(torch.int64).contiguous(),
        "vision.tokens": vtokens.contiguous(),
    }
    for j, d in enumerate(vdeep):
        tensors[f"vision.deepstack.{j}"] = d.contiguous()
    for i in range(len(visual.blocks)):
        tensors[f"vision.hidden_states.{i}"] = blocks[i].contiguous()
    tensors.update(lm_golden(out, last_normed, generated, decode_logits, hidden))
    provenance = {
        "script": "tests/reference/gen_vision.py",
        "seed": TEXT_SEED,
        "images": [f"model/testdata/vision/qwen3_vl_moe_tiny/image_{name}.png" for name, _, _ in IMAGES],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "router_margin": min(margins),
        "decode_vs_full": rel,
    }
    save_file(tensors, os.path.join(TEXT_OUT, "golden_image.safetensors"), metadata={"provenance": json.dumps(provenance)})
    print(f"wrote {TEXT_OUT}/golden_image.safetensors: {n} tokens ({sum(counts)} image), grids {grid.tolist()}, "
          f"rope_delta {int(delta)}, generated {generated.tolist()}, router margin {min(margins):.3g}")


if __name__ == "__main__":
    # `text`: only the tiny checkpoint and its goldens; `jpeg`: only the JPEG test image (the
    # rest stays as it is).
    if sys.argv[1:] == ["jpeg"]:
        write_jpeg_golden()
    else:
        if sys.argv[1:] != ["text"]:
            main()
        write_text_model()
