"""Multi-token prediction (``model.mtp_num_layers``) as Megatron-Core builds and runs it.

DeepSeek-V3 trains one extra prediction depth (Liu et al. 2024, arXiv:2412.19437, Sec. 2.2);
Megatron-Core's ``MultiTokenPredictionLayer`` (``megatron/core/transformer/
multi_token_prediction.py``) builds each depth k as:

- the input tokens rolled one further (``roll_tensor``) and embedded again with the model's word
  embedding (``GPTModel.embedding`` exists on the last stage when it holds the depths, and its
  gradient is all-reduced with the first stage's copy, as for tied embeddings:
  ``finalize_model_grads._allreduce_word_embedding_grads``);
- two norms, ``enorm`` on that embedding and ``hnorm`` on the previous depth's hidden state,
  concatenated to 2h and projected to h by ``eh_proj``, a column-parallel linear without bias
  (``gather_output=False``) whose output is gathered over tensor parallelism and, under sequence
  parallelism, scattered again;
- one transformer layer built from the decoder's last layer spec (an MoE layer for DeepSeek-V3),
  its own final norm, then the shared output layer and a cross-entropy of its own
  (``process_mtp_loss``);
- with no custom pipeline layout, every depth on the last pipeline stage (``mtp_on_this_rank``),
  after the decoder's layers; full recompute with ``recompute_method uniform`` checkpoints a
  depth whole, ``block`` leaves it alone (it warns and skips).

Megatron-LM's FLOPs count (``num_floating_point_operations``) adds each depth as a layer of the
last layer's kind, its 2h x h projection and one more logit GEMM; ``schedules.flops`` does the
same.

    mtp_layer_is_moe(plan.model)
"""

from __future__ import annotations

from schedules.moe import count_moe_layers
from schedules.plan import ModelConfig

MTP_NORMS = 3
"""Norms of one depth: ``enorm``, ``hnorm`` and its final norm."""
MTP_SAVED_WIDTHS = 4
"""Hidden widths per token one depth keeps for its backward beyond its transformer layer: the
embedding and the hidden state before their norms (h each) and the 2h concatenation
``eh_proj``'s weight gradient reads."""


def mtp_depths(model: ModelConfig) -> int:
    """Prediction depths beyond the next token (``model.mtp_num_layers``)."""
    return model.mtp_num_layers


def mtp_layer_is_moe(model: ModelConfig) -> bool:
    """Whether each depth's transformer layer is an MoE layer: Megatron builds it from the
    decoder's last layer spec."""
    if not model.num_experts:
        return False
    return count_moe_layers(model, start=model.num_layers - 1, count=1) == 1


def mtp_projection_params(model: ModelConfig) -> int:
    """``eh_proj`` of one depth: 2h x h, no bias."""
    return 2 * model.hidden_size * model.hidden_size
