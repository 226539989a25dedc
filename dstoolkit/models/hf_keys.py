"""The strict check of an inline spec's Hugging Face keys (split from models.hf_families): a key that no
hand-written reader reads and that is not known to leave the parameter count alone is refused, with a did-you-mean.
A real config.json is read leniently (it carries many keys the readers need not read)."""
from __future__ import annotations

import difflib

from dstoolkit.models.hf_families import FAMILIES, Family, HFConfigError

# Keys found in real config.json files that do not change the parameter count (accepted everywhere, so that
# a strict inline spec can still say e.g. `rope_theta:`; typos of the fields we read are still reported).
IGNORED_KEYS = frozenset({
    "_name_or_path", "architectures", "auto_map", "torch_dtype", "transformers_version", "bos_token_id",
    "eos_token_id", "pad_token_id", "initializer_range", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon",
    "rope_theta", "rope_scaling", "rope_parameters", "rope_type", "use_cache", "attention_dropout", "hidden_dropout",
    "sliding_window", "use_sliding_window", "max_window_layers", "pretraining_tp", "output_router_logits",
    "router_aux_loss_coef", "router_jitter_noise", "aux_loss_alpha", "seq_aux", "norm_topk_prob",
    "routed_scaling_factor", "scoring_func", "n_group", "topk_group", "ep_size", "quantization_config",
    "resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_type", "summary_use_proj", "summary_activation",
    "summary_proj_to_labels", "summary_first_dropout", "scale_attn_weights", "reorder_and_upcast_attn",
    "scale_attn_by_inverse_layer_idx", "n_ctx", "task_specific_params", "use_mla", "name", "dtype",
    "max_position_embeddings", "hidden_act", "activation_function", "qkv_bias", "moe_layer_freq",
    "num_nextn_predict_layers", "topk_method", "model_type", "tie_word_embeddings", "head_dim",
    "attention_bias", "mlp_bias", "decoder_sparse_step", "mlp_only_layers", "first_k_dense_replace",
    "num_key_value_heads", "qk_head_dim", "rope_interleave",
})


def _known_keys(fam: Family) -> set[str]:
    return set(fam.required) | set(fam.optional) | set(IGNORED_KEYS) | {other for _, other in fam.aliases}


def check_unknown_keys(d: dict, fam: Family) -> None:
    """Refuse a key `fam` neither reads nor knows to be irrelevant, with a did-you-mean. Only for strict (inline
    spec) use: a real config.json carries many keys we need not read."""
    known = _known_keys(fam)
    all_fields = set().union(*(set(f.required) | set(f.optional) for f in FAMILIES.values()))
    for key in d:
        if key in known:
            continue
        guess = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
        if guess:
            raise HFConfigError(key, "unknown field", f"did you mean {guess[0]!r}?")
        if key in all_fields:
            raise HFConfigError(key, f"not a field of model_type {d.get('model_type')!r}",
                                "remove it, or pick the model_type that has it")
        raise HFConfigError(key, "unknown field", f"remove it (fields read for {d.get('model_type')!r}: "
                            f"{', '.join(list(fam.required) + list(fam.optional))})")
