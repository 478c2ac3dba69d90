// Second-generation quantized fused Q/K/V projection (decode), finished by one
// workgroup tree reduction (qkv_proj_q_dp4a_wg). SPLIT stays 1 (qdp4a_qkv.wgsl
// says why). Includes: qdp4a_qkv.wgsl (the family: bias and routing),
// qdp4a_main_wg.wgsl (the entry point), qdp4a.wgsl (the activation step and the
// weight dots), qkv_store.wgsl, reduce_wg.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override QFMT: u32 = 0u;
override VW: u32 = 4u;
override ACT: u32 = 8u;
override SPLIT: u32 = 1u;
override HAS_BIAS: bool = false;

var<workgroup> partial: array<f32, WG * ROWS>;
