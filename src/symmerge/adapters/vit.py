"""ViT (`ViTForImageClassification`): patch projection, CLS token, learned positions, classifier.

Writers: the patch projection (a Conv2d whose output channels are the residual axis), its bias, the
CLS token, the position embeddings, attention and MLP outputs. The classifier has a bias, so the
final LayerNorm folds into it completely. LayerNorm model: writers mean-free, rotation fixes the
all-ones vector. Checkpoints saved by transformers 4 (`vit.encoder.layer.i.attention.attention.query`)
are renamed to the current layout on reading.
"""

from __future__ import annotations

import torch

from ..algebra.shape import ModelShape
from .base import (
    Adapter,
    HookPoints,
    any_attention_bias,
    final_norm_to_canonical,
    layernorm_block_from_canonical,
    layernorm_block_to_canonical,
    make_mean_free,
    require,
)

#: the attention's projections (q, k, v, o) under `vit.layers.{i}.attention`
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


class ViTAdapter(Adapter):
    name = "vit"
    hf_classes = ("ViTForImageClassification",)
    function_keys = ("image_size", "patch_size", "num_channels")
    renames = (
        (r"^vit\.encoder\.layer\.(\d+)\.attention\.attention\.query\.", r"vit.layers.\1.attention.q_proj."),
        (r"^vit\.encoder\.layer\.(\d+)\.attention\.attention\.key\.", r"vit.layers.\1.attention.k_proj."),
        (r"^vit\.encoder\.layer\.(\d+)\.attention\.attention\.value\.", r"vit.layers.\1.attention.v_proj."),
        (r"^vit\.encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"vit.layers.\1.attention.o_proj."),
        (r"^vit\.encoder\.layer\.(\d+)\.intermediate\.dense\.", r"vit.layers.\1.mlp.fc1."),
        (r"^vit\.encoder\.layer\.(\d+)\.output\.dense\.", r"vit.layers.\1.mlp.fc2."),
        (r"^vit\.encoder\.layer\.(\d+)\.", r"vit.layers.\1."),
    )
    hooks = HookPoints(norms=("vit.layers.{i}.layernorm_before", "vit.layers.{i}.layernorm_after"),
                       attn_norm="vit.layers.{i}.layernorm_before", final_norm="vit.layernorm",
                       ffn_hidden="vit.layers.{i}.mlp.fc2", block="vit.layers.{i}",
                       attention="vit.layers.{i}.attention")

    def shape(self, c) -> ModelShape:
        d, h = c.hidden_size, c.num_attention_heads
        require(d % h == 0, f"hidden_size={d} is not divisible by num_attention_heads={h}")
        n_patches = (c.image_size // c.patch_size) ** 2
        return ModelShape(
            arch=self.name, hf_class="ViTForImageClassification", d_model=d, n_layers=c.num_hidden_layers, n_heads=h,
            n_kv_heads=h, d_head=d // h, d_mlp=c.intermediate_size, vocab=c.num_labels, norm="layernorm",
            gated=False, parallel=False, rotary_dims=0, rotary_layout="none", tied=False, eps=float(c.layer_norm_eps),
            eps_in_config=True, activation=c.hidden_act, n_positions=n_patches + 1,
        )

    def embed_to_canonical(self, get, s):
        e = "vit.embeddings"
        return make_mean_free({
            "embed.W_patch": get(f"{e}.patch_embeddings.projection.weight"),  # (d, C, p, p)
            "embed.b_patch": get(f"{e}.patch_embeddings.projection.bias"),
            "embed.cls": get(f"{e}.cls_token").reshape(-1),  # (1, 1, d) -> (d,)
            "embed.W_pos": get(f"{e}.position_embeddings")[0],  # (1, N+1, d) -> (N+1, d)
        }, s)

    def block_to_canonical(self, get, s, i):
        hf = f"vit.layers.{i}"
        ln = lambda n: (get(f"{hf}.{n}.weight"), get(f"{hf}.{n}.bias"))  # noqa: E731
        return layernorm_block_to_canonical(get, s, i, f"{hf}.attention", PROJECTIONS,
                                            ln("layernorm_before"), ln("layernorm_after"), (f"{hf}.mlp.fc1", f"{hf}.mlp.fc2"))

    def final_to_canonical(self, get, s):
        return final_norm_to_canonical(get("classifier.weight"), get("classifier.bias"),
                                       get("vit.layernorm.weight"), get("vit.layernorm.bias"), s.eps)

    def ends_from_canonical(self, params, s):
        e = "vit.embeddings"
        return {
            f"{e}.patch_embeddings.projection.weight": params["embed.W_patch"],
            f"{e}.patch_embeddings.projection.bias": params["embed.b_patch"],
            f"{e}.cls_token": params["embed.cls"].reshape(1, 1, -1),
            f"{e}.position_embeddings": params["embed.W_pos"].unsqueeze(0),
            "vit.layernorm.weight": torch.ones(s.d_model, dtype=torch.float64),
            "vit.layernorm.bias": torch.zeros(s.d_model, dtype=torch.float64),
            "classifier.weight": params["head.W_U"], "classifier.bias": params["head.b_U"],
        }

    def block_from_canonical(self, params, s, i):
        hf = f"vit.layers.{i}"
        return layernorm_block_from_canonical(params, s, i, f"{hf}.attention", PROJECTIONS,
                                              (f"{hf}.layernorm_before", f"{hf}.layernorm_after"),
                                              (f"{hf}.mlp.fc1", f"{hf}.mlp.fc2"))

    def export_config(self, config, s, params):
        config = super().export_config(config, s, params)
        config.layer_norm_eps = float(params["norm.eps"])
        config.qkv_bias = bool(getattr(config, "qkv_bias", True)) or any_attention_bias(params, s)
        return config
