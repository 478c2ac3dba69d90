// Quantized fused Q/K/V projection of one token: one matrix-vector product over
// the concatenated weight w[nq + 2 nkv, k] in ggml blocks (QFMT: q8_0, q4_0, q4_1,
// dequantized in registers), optional bias, rows routed to q, k_out and v_out.
// Each workgroup owns ROWS consecutive rows; invocations stride over quant words
// into register accumulators (rows past the end recompute the last row, never
// stored) and the workgroup reduces them through workgroup memory once. Needs k a whole number of blocks (qbe()).
//
// Bindings: x, the weight buffer twice (quants at 1, scales region at 2), the bias
// at 3 (a placeholder when HAS_BIAS is false), q, k_out, v_out, the uniform.

override WG: u32 = 128;
override ROWS: u32 = 2;
override QFMT: u32 = 0u;
override HAS_BIAS: bool = false;

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> ws: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> q: array<f32>;
@group(0) @binding(5) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> v_out: array<f32>;
@group(0) @binding(7) var<uniform> dims: Dims;

var<workgroup> partial: array<f32, WG * ROWS>;

// Includes: qblock.wgsl (block decoding: qunits, qpos, qdecode, qdot),
// qrows_wg.wgsl (the partials), block_wg.wgsl (entry point), reduce_wg.wgsl (the
// tree), qkv_store.wgsl (the routing).

fn block_store(row: u32, r: u32) {
    qkv_store(row, partial[r * WG]);
}
