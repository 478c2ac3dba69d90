// Quantized fused Q/K/V projection of one token: one matrix-vector product over
// the concatenated weight w[nq + 2 nkv, k] in ggml blocks (QFMT: q8_0, q4_0, q4_1,
// dequantized in registers), optional bias, rows routed to q, k_out and v_out.
// Each workgroup owns ROWS consecutive rows; invocations stride over quant words
// and the workgroup reduces through workgroup memory. Needs k % 32 == 0.
//
// Bindings: x, the weight buffer twice (quants at 1, scales region at 2), the bias
// at 3 (a placeholder when HAS_BIAS is false), q, k_out, v_out, the uniform.

override WG: u32 = 128;
override ROWS: u32 = 2;
override QFMT: u32 = 0u;
override HAS_BIAS: bool = false;

struct Dims { k: u32, nq: u32, nkv: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> ws: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> q: array<f32>;
@group(0) @binding(5) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> v_out: array<f32>;
@group(0) @binding(7) var<uniform> dims: Dims;

var<workgroup> partial: array<f32, WG * ROWS>;

// Includes: qblock.wgsl (block decoding: qwords, qscale, qdecode, qdot),
// qkv_store.wgsl (the routing), reduce_wg.wgsl (the tree).

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    let n = dims.nq + 2u * dims.nkv;
    let wpr = dims.k / 32u * qwords();
    for (var r = 0u; r < ROWS; r++) {
        partial[r * WG + tid] = 0.0;
    }
    for (var wi = tid; wi < wpr; wi += WG) {
        for (var r = 0u; r < ROWS; r++) {
            let row = row0 + r;
            if (row < n) {
                partial[r * WG + tid] += qdot(row * wpr, wi, 0u);
            }
        }
    }
    wg_sum_rows(tid, ROWS);
    if (tid < ROWS && row0 + tid < n) {
        qkv_store(row0 + tid, partial[tid * WG]);
    }
}
