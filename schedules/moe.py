"""Mixture-of-experts layers: which layers route, their parameters, FLOPs, tokens and messages.

An MoE layer (Megatron-Core ``MoELayer``, Mixtral, DeepSeek, Qwen MoE) keeps the attention block
and replaces the MLP by a router (an h x E linear, softmax / sigmoid and top-k), E routed experts
(each an MLP of width ``moe_ffn_hidden_size``) of which every token visits k, and optionally shared
experts every token visits. Layers ``moe_first_dense_layers`` and on, every ``moe_layer_freq``-th,
route; the others are dense (Megatron's ``moe_layer_freq`` pattern ``i % freq == 0``).

Placement, as Megatron-Core forms its expert groups (``parallel_state.RankGenerator`` with order
``tp-ep-dp-pp`` for experts): within one pipeline stage the tp * cp * dp GPUs are re-split as
``etp x ep x edp``; the routed experts of a layer are split over the ep GPUs of an expert-parallel
group (E / ep each), each expert's matrices over etp, and the expert-data-parallel group (edp =
tp cp dp / (etp ep)) reduces the expert gradients. The attention, router and shared experts stay on
the dense layout (TP over tp, gradients over dp x cp).

Token flow per MoE layer and micro-batch with the ``alltoall`` dispatcher (``token_dispatcher.py``
``MoEAlltoAllTokenDispatcher``): each GPU routes its T_r tokens (b s / cp, and / tp under sequence
parallelism), permutes the k copies, all-to-alls them over ep (each GPU receives T_r k copies when
routing is balanced), all-gathers them over etp when etp > 1, runs its experts as grouped GEMMs,
reduce-scatters over etp, all-to-alls back and un-permutes; the backward mirrors all of it. The
``allgather`` dispatcher all-gathers the T_r tokens over the etp x ep group instead and
reduce-scatters the outputs. Routing is rarely balanced: ``moe_imbalance`` is the busiest expert's
tokens over the mean, capped by the capacity factor when tokens are dropped. Even a router that
balances the experts on average sends each GPU a chance-varying number of tokens per micro-batch,
and the busiest GPU of the expert-parallel group sets the pace (``chance_load``).

    count_moe_layers(plan.model, start=0, count=plan.model.num_layers)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable
from statistics import NormalDist

from schedules.plan import ModelConfig, ParallelConfig, Plan

ROUTER_PROBS_BYTES = 4
"""Bytes per router probability kept for the backward (fp32 softmax / sigmoid scores)."""


def is_moe(model: ModelConfig) -> bool:
    """Whether the model has routed experts."""
    return model.num_experts > 0


def is_moe_layer(model: ModelConfig, index: int) -> bool:
    """Whether layer ``index`` (0-based) is an MoE layer."""
    if not is_moe(model) or index < model.moe_first_dense_layers:
        return False
    return (index - model.moe_first_dense_layers) % model.moe_layer_freq == 0


def count_moe_layers(model: ModelConfig, *, start: int, count: int) -> int:
    """MoE layers among layers ``start .. start + count - 1``."""
    return sum(is_moe_layer(model, i) for i in range(start, start + count))


def expert_width(model: ModelConfig) -> int:
    """One routed expert's MLP width (``moe_ffn_hidden_size``, else ``ffn_hidden_size``)."""
    return model.moe_ffn_hidden_size or model.ffn_hidden_size


def mlp_params_of(model: ModelConfig, width: int) -> int:
    """An MLP of ``width`` on the model's h: 3hf gated or 2hf, plus biases when the model has
    them (2f + h gated, f + h not)."""
    if width == 0:
        return 0
    h = model.hidden_size
    num_in = 2 if model.gated_mlp else 1
    biases = num_in * width + h if model.linear_bias else 0
    return (num_in + 1) * h * width + biases


def router_params(model: ModelConfig) -> int:
    """The router's E x h weight (no bias, as Megatron's ``TopKRouter``)."""
    return model.num_experts * model.hidden_size


def expert_params(model: ModelConfig) -> int:
    """All routed experts of one MoE layer: E MLPs of the expert width."""
    return model.num_experts * mlp_params_of(model, expert_width(model))


def shared_expert_params(model: ModelConfig) -> int:
    """The shared experts of one MoE layer (one MLP of the total shared width)."""
    return mlp_params_of(model, model.moe_shared_expert_ffn_hidden_size)


def active_expert_params(model: ModelConfig) -> int:
    """Parameters one token goes through in an MoE layer's MLP part: the router, k routed
    experts and the shared experts."""
    routed = model.moe_top_k * mlp_params_of(model, expert_width(model))
    return router_params(model) + routed + shared_expert_params(model)


def expert_params_per_gpu(model: ModelConfig, parallel: ParallelConfig) -> float:
    """Routed-expert parameters of one MoE layer on one GPU: E / ep experts, split etp ways."""
    return expert_params(model) / (parallel.ep * parallel.expert_tp)


def moe_dense_params_per_gpu(model: ModelConfig, parallel: ParallelConfig) -> float:
    """An MoE layer's non-expert MLP parameters on one GPU: the router (replicated over TP) and
    the shared experts (split over TP like a dense MLP)."""
    return router_params(model) + shared_expert_params(model) / parallel.tp


def expert_data_parallel(parallel: ParallelConfig) -> int:
    """GPUs holding the same experts, edp = tp cp dp / (etp ep); needs a resolved dp."""
    return parallel.tp * parallel.cp * parallel.dp // (parallel.expert_tp * parallel.ep)


def routed_tokens(plan: Plan) -> float:
    """Tokens one GPU routes per micro-batch, T_r = b s / cp (/ tp under sequence parallelism)."""
    parallel = plan.parallel
    tokens = plan.training.micro_batch_size * plan.model.seq_len / parallel.cp
    return tokens / parallel.tp if parallel.sequence_parallel else tokens


@functools.cache
def expected_max_normal(count: int) -> float:
    """The expected largest of ``count`` independent standard normal draws (0 for one):
    the integral of x count phi(x) Phi(x)^(count - 1), by the midpoint rule over [-10, 10]
    (0.5642 for 2, 1.0294 for 4, 1.4236 for 8, 2.3437 for 64)."""
    if count <= 1:
        return 0.0
    normal, steps, low, high = NormalDist(), 8000, -10.0, 10.0
    width = (high - low) / steps
    total = 0.0
    for i in range(steps):
        x = low + (i + 0.5) * width
        total += x * count * normal.pdf(x) * normal.cdf(x) ** (count - 1)
    return total * width


def chance_load(plan: Plan) -> float:
    """Tokens of the busiest expert-parallel rank over the mean when routing is balanced on
    average (every token picks its k distinct experts at random, as Megatron-Core's forced
    balancing ``moe_router_force_load_balancing`` does): 1 + z(ep) sigma / mu.

    The n = T_r etp ep tokens routed in one expert-parallel group land on a rank holding m = E /
    ep of the E experts k m / E times each on average, with the hypergeometric variance
    k (m / E) (1 - m / E) (E - k) / (E - 1); per micro-batch and MoE layer the all-to-all and the
    grouped GEMMs wait for the busiest of the ep ranks, whose excess is the expected largest of ep
    normal draws (``expected_max_normal``, the ranks taken as independent). Mixtral 8x7B on EP 8
    with 4,096 tokens per GPU: 1.014; fewer tokens or experts per GPU make it larger."""
    model, parallel = plan.model, plan.parallel
    experts, k, ep = model.num_experts, model.moe_top_k, parallel.ep
    if ep <= 1 or experts <= 1:
        return 1.0
    share = 1.0 / ep  # m / E
    tokens = routed_tokens(plan) * parallel.expert_tp * ep
    mean = tokens * k * share
    variance = tokens * k * share * (1.0 - share) * (experts - k) / (experts - 1)
    return 1.0 + expected_max_normal(ep) * math.sqrt(variance) / mean


def load_factor(plan: Plan) -> float:
    """Tokens of the busiest expert-parallel rank over the mean.

    The busiest expert carries ``moe_imbalance`` times the mean (capped at the capacity factor
    when tokens are dropped); the other experts of its rank are taken at the mean, so a rank of
    n = E / ep experts carries (imbalance + n - 1) / n of the mean. A router balanced on average
    still leaves the busiest rank ``chance_load`` (capped likewise): the larger of the two is
    taken (an imbalance read off a run's per-batch token counts includes chance already).
    """
    model, parallel = plan.model, plan.parallel
    hottest, chance = model.moe_imbalance, chance_load(plan)
    if model.moe_capacity_factor is not None:
        hottest = min(hottest, model.moe_capacity_factor)
        chance = min(chance, model.moe_capacity_factor)
    local = model.num_experts / parallel.ep
    skewed = hottest if local <= 1 else (hottest + local - 1) / local
    return max(skewed, chance)


def expert_tokens(plan: Plan) -> float:
    """Token copies the busiest GPU's experts process per micro-batch:
    T_r k etp x load factor (T_r k arrive over ep, gathered from the etp peers)."""
    model, parallel = plan.model, plan.parallel
    balanced = routed_tokens(plan) * model.moe_top_k * parallel.expert_tp
    return balanced * load_factor(plan)


def dispatch_bytes(
    plan: Plan, *, element_bytes: float = 2.0, gpus_per_node: int | None = None
) -> float:
    """One dispatch (or combine) message per GPU of the plan's dispatcher, nccl-tests sizes.

    ``alltoall``: the busiest rank's T_r k copies of h (x load factor); ``allgather``: the output
    of gathering the T_r tokens of all etp x ep GPUs; ``flex`` (DeepEP's normal kernels, as
    Megatron-Core's flex dispatcher runs them): across servers each token goes once to each
    destination server, over RDMA, and is forwarded there over NVLink (DeepEP's README and
    ``internode.cu``), so the all-to-all that stands for it carries ``destination_nodes`` copies
    of each token where the alltoall dispatcher carries k: the same share of it crosses the
    network, so the bytes on the network are DeepEP's (its NVLink forwarding, k copies at
    NVLink's rate, is not the bound there); within one server once to each destination GPU
    (``layout.cu`` counts a token once per rank it reaches), the expected distinct ones of ep
    for k uniform picks.
    """
    model, parallel = plan.model, plan.parallel
    h = model.hidden_size
    if parallel.moe_token_dispatcher == "allgather":
        return routed_tokens(plan) * h * element_bytes * parallel.ep * parallel.expert_tp
    copies: float = model.moe_top_k
    if parallel.moe_token_dispatcher == "flex":
        if gpus_per_node is None:
            raise ValueError("the flex dispatcher's message depends on the GPUs per server")
        nodes = ep_nodes(parallel, gpus_per_node)
        # across servers one copy per destination server; within one, per destination GPU
        copies = destination_nodes(model, nodes) if nodes > 1 else _distinct(parallel.ep, copies)
    return routed_tokens(plan) * copies * h * element_bytes * load_factor(plan)


def ep_nodes(parallel: ParallelConfig, gpus_per_node: int) -> int:
    """Servers one expert-parallel group spans: its etp x ep consecutive ranks (Megatron-Core's
    expert rank order) over servers of ``gpus_per_node``."""
    return max(1, math.ceil(parallel.ep * parallel.expert_tp / gpus_per_node))


def destination_nodes(model: ModelConfig, nodes: int) -> float:
    """Expected servers a token's k experts sit on when its expert-parallel group spans
    ``nodes`` servers, each holding an equal block of the experts. Without group-limited
    routing the k experts are taken as independent uniform picks: N (1 - (1 - 1/N)^k). With
    it (``moe_router_num_groups`` G, ``moe_router_group_topk`` T; groups are blocks of
    consecutive experts): G = N, each group a server, the k experts in T groups reach min(T, k)
    servers (each chosen group holds at least one of them, as its score is its best experts');
    G a multiple of N, T of the G groups drawn without replacement cover
    N (1 - C(G - G/N, T) / C(G, T)) servers; N a multiple of G, each chosen group's k / T
    experts fall uniformly on its N / G servers."""
    k = model.moe_top_k
    groups, chosen = model.moe_router_num_groups, model.moe_router_group_topk
    if not groups or chosen >= groups:
        return _distinct(nodes, k)
    if groups == nodes:
        return float(min(chosen, k))
    if groups % nodes == 0:
        per_node = groups // nodes
        missed = math.comb(groups - per_node, chosen) / math.comb(groups, chosen)
        return min(float(k), nodes * (1.0 - missed))
    if nodes % groups == 0:  # k / T experts in each chosen group, over its N / G servers
        return chosen * _distinct(nodes // groups, k / chosen)
    return _distinct(nodes, k)


def _distinct(bins: float, picks: float) -> float:
    """Expected distinct bins ``picks`` uniform independent picks land in."""
    return bins * (1.0 - (1.0 - 1.0 / bins) ** picks)


def moe_mlp_forward_flops(model: ModelConfig, num_tokens: float) -> float:
    """Model FLOPs of an MoE layer's MLP part for T tokens with balanced routing: router 2ThE,
    k routed experts and the shared experts (2Thf per matrix)."""
    matrices = 3 if model.gated_mlp else 2
    h = model.hidden_size
    routed = model.moe_top_k * expert_width(model)
    width = routed + model.moe_shared_expert_ffn_hidden_size
    return 2.0 * num_tokens * h * model.num_experts + matrices * 2.0 * num_tokens * h * width


def moe_activation_bytes(plan: Plan, *, activation_bytes: float = 2.0) -> float:
    """What the MLP part of one MoE layer stores for the backward (recompute none or
    selective), one micro-batch on the busiest GPU.

    Router probabilities (fp32, T_r E), the permuted expert inputs (copies x h), the up
    projection outputs (2f_e / etp gated) and the activation outputs (f_e / etp) of the expert
    GEMMs, the expert outputs the combine weights (copies x h), and the shared experts' hidden
    (3f_s / tp gated, over the TP-gathered tokens); the dense MLP terms it replaces are not counted.
    """
    model, parallel = plan.model, plan.parallel
    copies, width = expert_tokens(plan), expert_width(model) / parallel.expert_tp
    hidden = (3 if model.gated_mlp else 2) * width
    experts = copies * (2 * model.hidden_size + hidden) * activation_bytes
    router = routed_tokens(plan) * model.num_experts * ROUTER_PROBS_BYTES
    shared_width = model.moe_shared_expert_ffn_hidden_size
    gathered = plan.training.micro_batch_size * model.seq_len / parallel.cp
    shared = gathered * (3 if model.gated_mlp else 2) * shared_width / parallel.tp
    return experts + router + shared * activation_bytes


def layer_hottest(plan: Plan) -> dict[int, float]:
    """Per MoE layer (0-based, model order): its busiest expert's tokens over the mean, capped at
    the capacity factor when tokens are dropped: the model's ``moe_imbalance``, or the what-if's
    per-layer figure (``WhatIf.moe_layer_imbalance``)."""
    model = plan.model
    cap = model.moe_capacity_factor if model.moe_capacity_factor is not None else math.inf
    given = dict(plan.whatif.moe_layer_imbalance)
    return {
        i: min(given.get(i, model.moe_imbalance), cap)
        for i in range(model.num_layers)
        if is_moe_layer(model, i)
    }


def mean_hottest(plan: Plan, layers: Iterable[int]) -> float | None:
    """The busiest expert's share that gives the MoE layers among ``layers`` their mean busiest
    GPU load (``load_factor`` of each ``layer_hottest``) when the what-if sets it for one of
    them, else None (each has the model's figure). The layers' expert time and dispatch grow
    linearly with that load, so pricing a run of layers at the mean load prices their sum (the
    share is found by inverting ``load_factor``'s skewed term; a mean at or below chance's keeps
    the lowest share)."""
    given = dict(plan.whatif.moe_layer_imbalance)
    layers = list(layers)
    if not any(i in given for i in layers):
        return None
    hottest = layer_hottest(plan)
    found = [hottest[i] for i in layers if i in hottest]
    if not found:
        return None
    loads = [load_factor(with_hottest(plan, share)) for share in found]
    mean = sum(loads) / len(loads)
    if mean <= load_factor(with_hottest(plan, min(found))):
        return min(found)
    local = plan.model.num_experts / plan.parallel.ep
    return mean if local <= 1 else mean * local - (local - 1)


def with_hottest(plan: Plan, hottest: float | None) -> Plan:
    """``plan`` with every MoE layer at ``hottest`` (``plan`` itself for None)."""
    if hottest is None or hottest == plan.model.moe_imbalance:
        return plan
    return dataclasses.replace(plan, model=dataclasses.replace(plan.model, moe_imbalance=hottest))
