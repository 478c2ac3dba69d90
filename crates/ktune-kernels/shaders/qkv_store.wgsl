// Routing of the fused Q/K/V projection's output rows, shared by fused_qkv_proj_*
// and qqkv_proj_wg (`shader!(FILE, .., "qkv_store.wgsl")`), and their uniform block.
// It uses the including shader's `override HAS_BIAS: bool`, its `bias`, `q`,
// `k_out`, `v_out` bindings (array<f32>) and `dims` (a Dims): rows 0..nq go to q,
// the next nkv to k_out, the last nkv to v_out. row_count is for the shader's entry
// point (row_sg.wgsl, block_wg.wgsl).

// k: the input's length; nq, nkv: the q and the k (or v) rows.
struct Dims { k: u32, nq: u32, nkv: u32 }

// Rows of the concatenated projection: q, k, v.
fn row_count() -> u32 {
    return dims.nq + 2u * dims.nkv;
}

// Row `row` of the concatenated projection, plus its bias, to its output.
fn qkv_store(row: u32, v: f32) {
    var o = v;
    if (HAS_BIAS) { o += bias[row]; }
    if (row < dims.nq) {
        q[row] = o;
    } else if (row < dims.nq + dims.nkv) {
        k_out[row - dims.nq] = o;
    } else {
        v_out[row - dims.nq - dims.nkv] = o;
    }
}
