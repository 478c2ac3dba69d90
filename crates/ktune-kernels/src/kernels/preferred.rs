//! The kernels the runtime prefers per op and backend when a profile chooses none,
//! best first: the order measured by `bench-kernels` and the tunes of the built-in
//! models, on the CPU, lavapipe and a hardware GPU. The plan's selection
//! (`plan::select` in the `ktune` crate) walks these lists; the parity suite checks
//! that each names a kernel that exists and computes its op.

use crate::device::Backend;
use crate::device::DeviceCaps;
use crate::kernels::problem::{Op, Problem};

/// Kernels the runtime prefers per op and backend when nothing is chosen, best first;
/// any other valid kernel of the op follows in registry order.
pub fn preferred(problem: &Problem, backend: Backend) -> &'static [&'static str] {
    match (problem.op(), backend) {
        // Float kernels accept only f32/f16 weights and the `_q` ones only the block
        // formats, so each list serves both: the first valid entry wins.
        (Op::Gemv, Backend::Cpu) => &["gemv_dot4_cpu", "gemv_q_cpu"],
        (Op::Gemv, Backend::Wgsl) => &["gemv_subgroup", "gemv_vec", "gemv_wg", "gemv_q_subgroup", "gemv_q_wg"],
        (Op::Gemm, Backend::Cpu) => &["gemm_blocked_cpu", "gemm_crate_cpu", "gemm_q_i8_cpu", "gemm_q_panel_cpu", "gemm_q_rows_cpu"],
        // A few tokens (a decode batch, a short prompt) read the blocks once.
        (Op::Gemm, Backend::Wgsl) => &["gemm_tiled", "gemm_simple", "gemm_q_rows_subgroup", "gemm_q_tiled"],
        // The vision tower's ops on a GPU: the tiled forms first (the simple ones
        // take any shape).
        (Op::PatchEmbed, Backend::Wgsl) => &["patch_embed_im2col", "patch_embed_direct"],
        (Op::Linear, Backend::Wgsl) => &["linear_tiled", "linear_simple"],
        (Op::AttentionFull, Backend::Wgsl) => &["attention_full_flash", "attention_full_rows"],
        (Op::AvgPool, Backend::Wgsl) => &["avg_pool_window", "avg_pool_separable"],
        // On the CPU (the tower's runtime): the packed-GEMM forms first; the
        // attention on the GEMM microkernel (flash) before the per-query ones.
        (Op::PatchEmbed, Backend::Cpu) => &["patch_embed_im2col_cpu", "patch_embed_direct_cpu"],
        (Op::Linear, Backend::Cpu) => &["linear_blocked_cpu", "linear_dot_cpu"],
        (Op::AttentionFull, Backend::Cpu) => &["attention_full_flash_cpu", "attention_full_tiled_cpu", "attention_full_rows_cpu"],
        (Op::AvgPool, Backend::Cpu) => &["avg_pool_window_cpu", "avg_pool_separable_cpu"],
        // From tunes of the built-in models on the 2-core CPU and on lavapipe: the
        // dot4 orchestrations win decode by 4-5x over the blocked ones.
        (Op::GateUp, Backend::Cpu) if matches!(problem, Problem::GateUp { rows: 1, .. }) => &["gate_up_dot4_cpu", "gate_up_q_cpu"],
        (Op::GateUp, Backend::Cpu) => &["gate_up_blocked_cpu", "gate_up_q_i8_cpu", "gate_up_q_panel_cpu", "gate_up_q_cpu"],
        (Op::QkvProj, Backend::Cpu) => &["qkv_proj_dot4_cpu", "qkv_proj_q_cpu"],
        (Op::AttentionDecode, Backend::Cpu) => &["attention_decode_heads_cpu"],
        (Op::AttentionPrefill, Backend::Cpu) => &["attention_prefill_tiled_cpu"],
        (Op::AttentionPaged, Backend::Cpu) => &["attention_paged_cpu"],
        (Op::AttentionPaged, Backend::Wgsl) => &["attention_paged_stream", "attention_paged_rows"],
        // `bench-kernels --quick` on lavapipe, Llama 3.2 1B shapes: the subgroup
        // variants won both races at their default parameters; without subgroups the
        // plain flash2 / split-KV ones follow. (Hardware GPUs: `preferred_on`.)
        (Op::AttentionPrefill, Backend::Wgsl) => &["attention_prefill_flash2_sg", "attention_prefill_flash2", "attention_prefill_flash"],
        (Op::AttentionDecode, Backend::Wgsl) => &["attention_decode_splitkv_sg", "attention_decode_splitkv"],
        (Op::GateUp, Backend::Wgsl) => &["gate_up_subgroup", "gate_up_q_subgroup", "gate_up_q_wg"],
        (Op::QkvProj, Backend::Wgsl) => &["qkv_proj_subgroup", "qkv_proj_q_wg"],
        (Op::NormGemv, Backend::Cpu) => &["norm_gemv_cpu", "norm_gemv_q_cpu"],
        // A mixture of experts: the router's passes (no index array), the
        // experts gathered in decode, grouped by expert in prefill (int8 tiles
        // first: `cargo bench -p ktune-bench --bench moe`, Qwen3-30B-A3B's shapes,
        // 128 tokens, Q4_K, 2-core EPYC: gate/up 41 ms grouped int8, 52 gathered,
        // 93 grouped f32; down 20.5, 38.5, 58).
        (Op::MoeRoute, Backend::Cpu) => &["moe_route_passes_cpu", "moe_route_cpu"],
        (Op::MoeGateUp, Backend::Cpu) if matches!(problem, Problem::MoeGateUp { rows: 1, .. }) => &["moe_gate_up_cpu"],
        (Op::MoeGateUp, Backend::Cpu) => &["moe_gate_up_grouped_i8_cpu", "moe_gate_up_grouped_cpu"],
        (Op::MoeDown, Backend::Cpu) if matches!(problem, Problem::MoeDown { rows: 1, .. }) => &["moe_down_cpu"],
        (Op::MoeDown, Backend::Cpu) => &["moe_down_grouped_i8_cpu", "moe_down_grouped_cpu"],
        // WGSL: gathered in decode; grouped by expert in prefill (each unit of an
        // expert's rows decoded once for 4 of its tokens): on lavapipe, 64 tokens
        // over 32 experts (4 a token), Q4_K, gate/up 0.99 s against 1.25 gathered,
        // down 0.97 against 1.19 (`moe_prefill_timing`, src/tuner/measure.rs).
        (Op::MoeGateUp, Backend::Wgsl) if matches!(problem, Problem::MoeGateUp { rows: 1, .. }) => &["moe_gate_up_q_wg", "moe_gate_up_wg"],
        (Op::MoeGateUp, Backend::Wgsl) => &["moe_gate_up_grouped_q_wg", "moe_gate_up_grouped_wg"],
        (Op::MoeDown, Backend::Wgsl) if matches!(problem, Problem::MoeDown { rows: 1, .. }) => &["moe_down_q_wg", "moe_down_wg"],
        (Op::MoeDown, Backend::Wgsl) => &["moe_down_grouped_q_wg", "moe_down_grouped_wg"],
        (Op::NormGemv, Backend::Wgsl) => &["norm_gemv_subgroup", "norm_gemv_wg", "norm_gemv_q_subgroup", "norm_gemv_q_wg"],
        _ => &[],
    }
}

/// [`preferred`] for the device at hand: on a hardware GPU the attention order
/// measured on one (`bench-kernels` on an NVIDIA H200, Vulkan, 2026-11-26, each
/// row's variants raced interleaved): decode at 1024 keys, `stream` 6.8 µs against
/// `splitkv` 84 and `splitkv_sg` 442 (Llama 3.2 1B; Gemma 3 1B 26 / 134 / 276),
/// and the tune's decode slot at 193 keys `splitkv` 3.3x faster than `splitkv_sg`;
/// prefill over 128 tokens, `flash2` 64-71 µs against `flash2_sg` 70-90. The
/// software order (lavapipe's, above) stays for software adapters.
pub fn preferred_on(problem: &Problem, device: &DeviceCaps) -> &'static [&'static str] {
    let hardware_gpu = matches!(device, DeviceCaps::Gpu(c) if !c.software);
    match (problem.op(), device.backend()) {
        (Op::AttentionDecode, Backend::Wgsl) if hardware_gpu => {
            &["attention_decode_stream", "attention_decode_splitkv", "attention_decode_splitkv_sg"]
        }
        (Op::AttentionPrefill, Backend::Wgsl) if hardware_gpu => {
            &["attention_prefill_flash2", "attention_prefill_flash2_sg", "attention_prefill_flash"]
        }
        (_, backend) => preferred(problem, backend),
    }
}
