// The fused Q/K/V projection family of the second-generation quantized projections
// (qdp4a.wgsl): one token's rows of the concatenated weight w[nq + 2 nkv, k], all
// dotting the one quantized (normed) input, optional bias, rows routed to q, k_out
// and v_out by qkv_store.wgsl exactly as qkv_proj_q_wg routes them
// (`shader!(head "qdp4a_head.wgsl"; "qdp4a_qkv.wgsl", MAIN, "qdp4a.wgsl",
// "qkv_store.wgsl", ..)`). SPLIT stays 1, no split-K: `main` already binds eight
// storage buffers (the quants, the scales, the bias, the quantized activation and
// its block scales, q, k_out, v_out), the most the WebGPU defaults allow a stage.
// Requires: qdp4a_head.wgsl, qdp4a.wgsl, qgeom.wgsl, qkv_store.wgsl.

override HAS_BIAS: bool = false;

// Accumulators per row of a row group (qdp4a.wgsl's dq_nacc).
const DQ_SETS: u32 = 1u;

@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;
@group(0) @binding(7) var<storage, read_write> q: array<f32>;
@group(0) @binding(8) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(9) var<storage, read_write> v_out: array<f32>;

fn dq_nrows() -> u32 {
    return row_count();
}

fn dq_row(row0: u32, r: u32) -> u32 {
    return min(row0 + r, row_count() - 1u);
}

fn dq_out(row0: u32, s: u32, r: u32) {
    let row = row0 + r;
    if (row < row_count()) {
        qkv_store(row, dq_total(r));
    }
}
