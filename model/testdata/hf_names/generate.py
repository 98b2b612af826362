"""Records the tensor names, dtypes and shapes transformers' `save_pretrained` writes, with the
config.json it writes beside them, for small random models of each architecture day0 names
(model/src/weights/names.rs). model/tests/weights.rs rebuilds a checkpoint from each listing and
checks `expected_tensors` / `verify` against it: no tensor missing, none extra.

Run with the formats venv (transformers 5.24, torch): python model/testdata/hf_names/generate.py
Covers what the golden checkpoints in ../tiny do not: q_lora_rank null with tied embeddings,
several shared experts, Qwen3-Next `mlp_only_layers`, Kimi Linear (KDA + MLA, block_sparse_moe).
"""
import json, os, sys, tempfile

import torch
import transformers
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM

OUT = os.path.dirname(os.path.abspath(__file__))
COMMON = dict(vocab_size=97, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
              max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
MLA = dict(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
MODELS = {
    "deepseek_v3_no_q_lora_tied": dict(
        model_type="deepseek_v3", num_hidden_layers=3, intermediate_size=96, moe_intermediate_size=32,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=2, n_group=2, topk_group=1,
        first_k_dense_replace=1, q_lora_rank=None, tie_word_embeddings=True, **MLA, **COMMON),
    "deepseek_v32": dict(
        model_type="deepseek_v32", num_hidden_layers=2, intermediate_size=96, moe_intermediate_size=32,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
        first_k_dense_replace=1, q_lora_rank=48, index_n_heads=2, index_head_dim=16, index_topk=4,
        **MLA, **COMMON),
    "qwen3_next_mlp_only": dict(
        model_type="qwen3_next", num_hidden_layers=4, intermediate_size=96, moe_intermediate_size=32,
        shared_expert_intermediate_size=40, num_experts=4, num_experts_per_tok=2, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=12, linear_conv_kernel_dim=4, full_attention_interval=2,
        mlp_only_layers=[2], **{**COMMON, "num_key_value_heads": 2}),
    "kimi_linear": dict(
        model_type="kimi_linear", num_hidden_layers=3, intermediate_size=96, moe_intermediate_size=32,
        num_local_experts=4, num_experts_per_tok=2, n_shared_experts=1, q_lora_rank=None,
        linear_attn_config={"full_attn_layers": [2], "kda_layers": [1, 3], "head_dim": 8,
                            "num_heads": 4, "short_conv_kernel_size": 4},
        first_k_dense_replace=1, **MLA, **COMMON),
}

for name, kw in MODELS.items():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**kw))
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        config = json.load(open(os.path.join(d, "config.json")))
        tensors = {}
        for f in sorted(os.listdir(d)):
            if f.endswith(".safetensors"):
                with safe_open(os.path.join(d, f), "pt") as s:
                    for k in s.keys():
                        t = s.get_slice(k)
                        tensors[k] = {"dtype": t.get_dtype(), "shape": t.get_shape()}
    out = {"generator": "model/testdata/hf_names/generate.py",
           "transformers": transformers.__version__,
           "config": config,
           "tensors": dict(sorted(tensors.items()))}
    with open(os.path.join(OUT, f"{name}.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(name, len(tensors), "tensors", file=sys.stderr)
