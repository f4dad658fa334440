"""Kernel and operator names of real profiles land in the right work class."""

from __future__ import annotations

import pytest

from vocab.kernel_classes import busy_time_s, classify, kernel_gap_s


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1", "gemm"),
        ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn", "gemm"),
        ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNT", "gemm"),
        ("aten::mm", "gemm"),
        ("aten::addmm", "gemm"),
        ("flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "attention"),
        ("pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "attention"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
        ("multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor>", "optimizer"),
        ("aten::_fused_adamw_", "optimizer"),
        ("aten::_foreach_mul_", "optimizer"),
        ("aten::nll_loss_forward", "loss"),
        ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>", "other"),
        ("aten::_log_softmax", "loss"),
        ("vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>", "elementwise"),
        ("void at::native::vectorized_layer_norm_kernel<float>", "elementwise"),
        ("aten::rms_norm", "elementwise"),
        ("aten::silu", "elementwise"),
        ("aten::add", "elementwise"),
        ("aten::embedding_dense_backward", "elementwise"),
        ("void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>", "copy"),
        ("aten::copy_", "copy"),
        ("Memcpy DtoD (Device -> Device)", "copy"),
        ("aten::view", "other"),
    ],
)  # fmt: skip
def test_names_from_real_profiles(name: str, kind: str) -> None:
    assert classify(name) == kind


def test_busy_time_is_the_union_of_intervals() -> None:
    assert busy_time_s([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.5, 5.8)]) == 4.0
    assert busy_time_s([]) == 0.0


def test_the_kernel_gap_is_the_median_of_the_short_gaps_between_kernels() -> None:
    us = 1e-6
    # gaps of 1, 1 and 4 us count (median 1, mean 2); 50 us is the host behind; the kernel
    # starting inside the one before it (another stream) is skipped
    intervals = [(0.0, 10 * us), (11 * us, 20 * us), (21 * us, 30 * us), (34 * us, 40 * us),
                 (90 * us, 95 * us), (92 * us, 99 * us)]  # fmt: skip
    assert kernel_gap_s(intervals) == pytest.approx(1 * us)
    assert kernel_gap_s(list(reversed(intervals))) == pytest.approx(1 * us)  # any order
    assert kernel_gap_s([(0.0, 1.0)]) == 0.0
    assert kernel_gap_s([]) == 0.0
