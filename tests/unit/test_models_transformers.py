"""Released config.json files of 22+ model types through the model resolver (transformers as the model source).

Fixtures: tests/golden/hf_configs/released/*.json, copied byte for byte from public GitHub repositories;
SOURCES.tsv gives, per file, the source repository, path and commit, the class built, the pinned exact
total/active counts, and the published figures of the model card where there is one.

- test_released_counts_pinned: the resolver (analytic reader or transformers meta-device build) gives the
  pinned counts exactly; the file's own `path` column says which route (a type with a hand-written reader
  must stay analytic).
- test_against_transformers_reference (slow): an independent count straight from transformers' module
  tree (sum of `parameters()`, routed experts scaled by top-k/E), total and active within 0.01%.
- test_published_figures: totals and active counts agree with the model cards under the convention each
  vendor uses (with or without the embedding / LM head), to the precision they publish.
- refusals: types transformers cannot build are refused with the reason; where `architectures` names a
  class transformers has, that class is offered and building with it works.
"""
import csv
import json
import math
import pathlib

import pytest

from dstoolkit.models import FAMILIES, HFConfigError, count_params, load_hf_config, load_model, shape_from_hf_dict

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

HF = pathlib.Path(__file__).resolve().parents[1] / "golden" / "hf_configs"
REL = HF / "released"
ROWS = list(csv.DictReader((REL / "SOURCES.tsv").open(encoding="utf-8"), delimiter="\t"))
BUILT = [r for r in ROWS if r["path"] != "refused"]
REFUSED = [r for r in ROWS if r["path"] == "refused"]
TOL = 1e-4  # 0.01%
QUICK = {"openai--gpt-oss-20b.json", "google--gemma-4-26B-A4B.json", "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json",
         "Qwen--Qwen3.5-35B-A3B.json", "meta-llama--Llama-4-Maverick-17B-128E-Instruct.json",
         "moonshotai--Kimi-K2-Instruct.json", "Qwen--Qwen3-Next-80B-A3B-Thinking.json",
         "meta-llama--Meta-Llama-3.1-8B.json", "deepseek-ai--DeepSeek-R1.json", "MiniMaxAI--MiniMax-M3.json"}
"""Fixtures the unit tier runs (MoE, multimodal, hybrid, model_class, analytic, refused); the rest run as slow."""


def _tiered(rows):
    """One param per row, marked slow unless the row is in QUICK (a transformers build takes ~1 s of CPU)."""
    return [pytest.param(r, id=r["file"][:-5], marks=() if r["file"] in QUICK else pytest.mark.slow) for r in rows]


def _load(row):
    return load_hf_config(REL / row["file"], model_class=row["model_class"] or None)


def test_fixture_set_is_large_and_sourced():
    types = {r["model_type"] for r in BUILT}
    assert len(BUILT) >= 32 and len(ROWS) >= 37, (len(BUILT), len(ROWS))
    assert len(types) >= 24, sorted(types)
    for r in ROWS:
        assert (REL / r["file"]).is_file(), r["file"]
        assert r["source_repo"] and r["source_path"] and len(r["source_commit"]) == 40, r
    assert {p.name for p in REL.glob("*.json")} == {r["file"] for r in ROWS}


@pytest.mark.parametrize("row", _tiered(BUILT))
def test_released_counts_pinned(row):
    shape = _load(row)
    c = count_params(shape)
    assert shape.source == row["path"]
    assert (shape.source == "analytic") == (row["model_type"] in FAMILIES and not row["model_class"])
    # the pinned total is the language model's; a multimodal model's towers are in c.total too (c.tower), not in
    # c.active
    assert (c.total - c.tower, c.active) == (int(row["total"]), int(row["active"]))
    if shape.source == "transformers":
        m = shape.measured
        assert shape.model_class == row["built_class"]
        assert m.vision_params == int(row["vision_params"]) == c.tower
        # Every parameter has exactly one role, and the roles add up.
        roles = c.embedding + c.lm_head + c.attention + c.dense_mlp + c.routed_experts + c.shared_experts
        assert roles + c.router + c.norms + c.other + c.tower == c.total
        assert c.other <= 1e-3 * c.total, c  # nearly everything gets a named role
        assert len(m.layers) == shape.num_hidden_layers
        if shape.is_moe:
            assert shape.num_experts_per_tok >= 1 and c.routed_experts > 0
            assert set(shape.mlp_only_layers) == {l.index for l in m.layers if not l.is_moe}


def _text_model_reference(row):
    """Parameters of the language model straight from transformers (independent of dstoolkit's walk)."""
    cfg_dict = {k: v for k, v in json.loads((REL / row["file"]).read_text()).items() if k != "quantization_config"}
    if row["model_class"]:
        cls = getattr(transformers, row["model_class"])
        cfg_dict.pop("model_type")
        cfg = cls.config_class(**cfg_dict)
    else:
        cfg = transformers.AutoConfig.for_model(**cfg_dict)
    text = cfg.get_text_config()
    with torch.device("meta"):
        try:
            model = transformers.AutoModelForCausalLM.from_config(text)
            params = list(model.named_parameters())
        except ValueError:  # a text config with no causal-LM class of its own: the composite model's LM part
            model = transformers.AutoModelForImageTextToText.from_config(cfg)
            lm = model.model.language_model
            params = [("model." + n, p) for n, p in lm.named_parameters()]
            ids = {id(p) for _, p in params}
            params += [("lm_head." + n, p) for n, p in model.lm_head.named_parameters() if id(p) not in ids]
    k = next(getattr(text, key) for key in ("num_experts_per_tok", "top_k_experts", "moe_topk")
             if getattr(text, key, None) is not None) if any(".experts." in n for n, _ in params) else 0
    total = sum(p.numel() for _, p in params)
    inactive = 0
    for n, p in params:
        if ".experts." in n and "shared" not in n:
            inactive += p.numel() * (1 - k / p.shape[0])  # fused experts: dim 0 is the expert index
    return total, total - inactive


@pytest.mark.slow
@pytest.mark.parametrize("row", [r for r in BUILT if r["path"] == "transformers" or r["model_type"] in FAMILIES],
                         ids=lambda r: r["file"][:-5])
def test_against_transformers_reference(row):
    total, active = _text_model_reference(row)
    c = count_params(_load(row))
    # the reference builds the language model alone: the towers of a multimodal model are c.tower
    assert c.total - c.tower == pytest.approx(total, rel=TOL), (c.total, c.tower, total)
    assert c.active == pytest.approx(active, rel=TOL), (c.active, active)


def _published_ok(ours: list[int], published: float) -> bool:
    # Published to a few significant figures ("37B", "1T"): within half a unit of the last figure, or 5%.
    digits = len(f"{published:.4g}".split("e")[0].replace(".", "").rstrip("0")) or 1
    unit = 10 ** (math.floor(math.log10(published)) - digits + 1)
    return any(abs(x - published) <= max(unit / 2, 0.05 * published) for x in ours)


@pytest.mark.parametrize("row", _tiered([r for r in BUILT if r["published_total"]]))
def test_published_figures(row):
    shape = _load(row)
    c = count_params(shape)
    assert _published_ok([c.total - c.tower, c.total], float(row["published_total"])), (c.total, row["published_total"])
    if row["published_active"]:
        # Vendors publish active counts with the embedding (Mixtral, Qwen), without it (DeepSeek, OpenAI), or
        # without embedding and LM head (Qwen "non-embedding", MiniMax).
        conventions = [c.active, c.active - c.embedding, c.active - c.embedding - c.lm_head]
        assert _published_ok(conventions, float(row["published_active"])), (conventions, row["published_active"])


@pytest.mark.parametrize("row", _tiered(REFUSED))
def test_refused_with_the_reason(row):
    with pytest.raises(HFConfigError, match=r"unsupported model_type .*transformers .* does not know") as info:
        _load(row)
    msg = str(info.value)
    assert "did you mean" not in msg  # never a spelling neighbour
    archs = json.loads((REL / row["file"]).read_text()).get("architectures") or []
    offered = [a for a in archs if getattr(transformers, a, None) is not None]
    if offered:
        assert f"--model-class {offered[0]}" in msg
    assert row["refusal"]  # the reason recorded when the fixture was pinned


def test_kimi_k2_is_offered_deepseek_v3_and_builds_with_it():
    path = REL / "moonshotai--Kimi-K2-Instruct.json"
    with pytest.raises(HFConfigError, match=r"architectures names 'DeepseekV3ForCausalLM'.*--model-class "
                                            r"DeepseekV3ForCausalLM"):
        load_hf_config(path)
    shape = load_model(path, model_class="DeepseekV3ForCausalLM")
    assert shape.model_type == "kimi_k2" and shape.model_class == "DeepseekV3ForCausalLM" and shape.is_mla
    c = count_params(shape)
    assert round(c.total / 1e12, 2) == 1.03 and round((c.active - c.embedding) / 1e9) == 32  # "1T / 32B active"
    # The inline spec form names the class as a field.
    inline = {**json.loads(path.read_text()), "model_class": "DeepseekV3ForCausalLM"}
    assert count_params(shape_from_hf_dict(inline)).total == c.total


def test_spelling_neighbours_are_never_suggested():
    # jamba is a spelling neighbour of llama but a different architecture (-23% if followed): no hint.
    cfg = {**json.loads((REL / "meta-llama--Meta-Llama-3.1-8B.json").read_text()), "model_type": "jambo"}
    cfg.pop("architectures")
    with pytest.raises(HFConfigError) as info:
        shape_from_hf_dict(cfg)
    assert "did you mean" not in str(info.value)


def test_multimodal_text_config_is_used_and_said():
    shape = load_hf_config(REL / "google--gemma-4-26B-A4B.json")
    assert shape.source == "transformers" and shape.model_type == "gemma4"
    assert any("text_config (gemma4_text)" in n for n in shape.notes)
    assert shape.measured.vision_params > 0 and count_params(shape).tower == shape.measured.vision_params
    assert shape.hidden_size == 2816 and shape.num_experts == 128 and shape.num_experts_per_tok == 8
    assert shape.tie_word_embeddings and count_params(shape).lm_head == 0


def test_quantization_config_is_named_as_ignored():
    bf16 = load_hf_config(REL / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json")
    assert not any("quantization_config" in n for n in bf16.notes)
    fp8 = load_hf_config(REL / "openai--gpt-oss-20b.json")
    assert any(n.startswith("quantization_config (mxfp4) ignored") for n in fp8.notes)


def test_hybrid_layers_are_told_apart():
    nemo = load_hf_config(REL / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json").measured
    mixers = [l.mixer for l in nemo.layers]
    assert {"mamba", "attention", "none"} == set(mixers)
    nxt = load_hf_config(REL / "Qwen--Qwen3-Next-80B-A3B-Thinking.json").measured
    assert {l.mixer for l in nxt.layers} == {"attention", "linear_attention"}
    # Llama 4 Maverick interleaves dense and MoE layers (interleave_moe_layer_step=2): half are MoE.
    mav = load_hf_config(REL / "meta-llama--Llama-4-Maverick-17B-128E-Instruct.json")
    assert mav.measured.num_moe_layers == 24 and len(mav.mlp_only_layers) == 24


@pytest.mark.parametrize("name", sorted(p.stem for p in HF.glob("*.json")))
def test_analytic_path_equals_transformers_path(name):
    # The hand-written readers stay (fast, no torch); per role they must equal the transformers build.
    # DeepSeek-V3's e_score_correction_bias is a buffer on both paths (ParamCount.buffers), not a parameter.
    a = count_params(load_hf_config(HF / f"{name}.json"))
    t_shape = load_hf_config(HF / f"{name}.json", source="transformers")
    t = count_params(t_shape)
    assert a.buffers == t.buffers == (58 * 256 if name == "deepseek-v3" else a.buffers)
    for field in ("embedding", "lm_head", "attention", "dense_mlp", "routed_experts", "shared_experts", "router",
                  "norms", "expert_params_each", "num_moe_layers"):
        assert getattr(a, field) == getattr(t, field), field
    assert (a.total, a.active) == (t.total, t.active)
    assert t.other == 0


@pytest.mark.parametrize("model_type", ["phi", "phi3", "phimoe", "gemma2", "gemma3_text", "gpt_neox", "gptj",
                                        "falcon", "stablelm", "opt", "gpt_bigcode", "jamba", "exaone4", "olmoe",
                                        "granitemoe", "mpt", "starcoder2", "bloom", "qwen3_next", "cohere"])
def test_types_named_in_the_issue_are_accepted(model_type):
    # transformers' own default config of each type (shrunk to 2 layers to keep it quick): no refusal, every
    # parameter assigned a role, and the count equals the module tree's.
    cfg = transformers.AutoConfig.for_model(model_type).to_dict()
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if key in cfg:
            cfg[key] = 2
    for key in ("layer_types", "attn_layer_indices", "expert_layer_indices"):
        cfg.pop(key, None)
    shape = shape_from_hf_dict(cfg, source="transformers")
    c = count_params(shape)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    assert c.total == sum(p.numel() for p in model.parameters())
    assert c.other <= 0.01 * c.total


def test_linear_layers_for_planners():
    from dstoolkit.models.from_transformers import linear_layers

    cfg = json.loads((REL / "Qwen--Qwen3.5-35B-A3B.json").read_text())
    groups = {g["pattern"]: g for g in linear_layers(cfg)}
    # 3 of 4 layers are linear attention (gated delta net), 1 of 4 full attention: the planner sees both.
    assert groups["model.layers.{i}.self_attn.q_proj"]["count"] == 10
    assert groups["model.layers.{i}.linear_attn.in_proj_qkv"]["count"] == 30
    experts = groups["model.layers.{i}.mlp.experts.gate_up_proj"]
    assert experts["fused_experts"] and experts["shape"][0] == 256 and experts["count"] == 40
    assert not any("visual" in p for p in groups)


def test_routed_experts_without_a_top_k_name_the_keys_and_the_fix():
    """A module with routed experts and no top-k anywhere (config or module) stops with the keys looked for and
    what to set (it raised a NameError: the message named a constant that no longer existed)."""
    import torch.nn as nn

    from dstoolkit.models.module_tree import MODEL_TOPK_KEYS, BuildError, classify

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = nn.Module()
            self.mlp.experts = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(8, 4)
            self.layers = nn.ModuleList([Block()])

    with pytest.raises(BuildError) as e:
        classify(Model(), 1, None, False)
    msg = str(e.value)
    assert msg.startswith("layer 0 has 4 routed experts but the config gives no top-k")
    assert all(k in msg for k in MODEL_TOPK_KEYS) and '"num_experts_per_tok": 2' in msg


def test_a_keyword_default_is_read_through_the_wrappers_transformers_puts_around_a_function():
    """transformers 5.25 with `kernels` wraps torch_chunk_gated_delta_rule in an nn.Module whose signature is
    (*args, **kwargs) and whose forward closes over the original: the chunk size must still come out (CI at
    188f80b refused Qwen3-Next and Qwen3.5 with KeyError 'chunk_size')."""
    import functools

    import torch

    from dstoolkit.models.module_tree import keyword_default

    def rule(q, k, chunk_size: int = 48, flag=False):
        return q

    @functools.wraps(rule)
    def wrapped(*args, **kwargs):
        return rule(*args, **kwargs)

    def module_around(func):
        class Func(torch.nn.Module):
            def forward(self, *args, **kwargs):
                return func(*args, **kwargs)
        return Func()

    assert keyword_default(rule, "chunk_size") == 48
    assert keyword_default(wrapped, "chunk_size") == 48
    assert keyword_default(module_around(rule), "chunk_size") == 48
    assert keyword_default(module_around(wrapped), "chunk_size") == 48
    assert keyword_default(module_around(lambda *a, **k: None), "chunk_size") is None
    assert keyword_default(rule, "q") is None
