"""Config key names that several readers of a Hugging Face config share (the measured-model reader, the shrink
of real runs, the tracer): one list each, read in this order, the first present wins."""
from __future__ import annotations

EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
"""Routed experts per MoE layer."""
TOPK_KEYS = ("num_experts_per_tok", "num_experts_per_token", "experts_per_token", "top_k_experts", "moe_topk",
             "moe_k")
"""Experts each token is routed to."""
