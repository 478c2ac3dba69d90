// Head of the float fused Q/K/V projections (fused_qkv_proj_wg,
// fused_qkv_proj_subgroup), which differ in how a row's dot is reduced and in the
// width of their x and w words, each shader's own at bindings 0 and 1: the bias,
// always bound at 2 (without a bias the host binds a small placeholder there and
// HAS_BIAS is false), q, k_out and v_out at 3..5, the uniform block (qkv_store.wgsl's
// Dims) at 6.

override HAS_BIAS: bool = false;

@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> q: array<f32>;
@group(0) @binding(4) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(5) var<storage, read_write> v_out: array<f32>;
@group(0) @binding(6) var<uniform> dims: Dims;
