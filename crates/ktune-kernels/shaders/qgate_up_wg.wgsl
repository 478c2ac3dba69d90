// Quantized fused gate+up: y[t, j] = act(x[t]·w[j]) * (x[t]·w[n + j]) with w[2n, k]
// in ggml blocks (QFMT: any ggml block format) dequantized in registers. Workgroup
// (wid.x, t) owns ROWS features of token t; each invocation strides over quant
// words for the gate and up rows of all of them into register accumulators
// (features past n recompute the last one, never stored), the workgroup reduces
// them through workgroup memory once and applies the activation in the epilogue. Needs k a whole number of blocks (qbe()).

override WG: u32 = 128;
override ROWS: u32 = 2;
override QFMT: u32 = 0u;

var<workgroup> partial: array<f32, 2 * WG * ROWS>;

// Includes: qgate_up.wgsl (interface: bindings, Dims), qblock.wgsl (block decoding: qunits, qpos, qdecode, qdot), act.wgsl,
// reduce_wg.wgsl (the tree).

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let j0 = wid.x * ROWS;
    let t = wid.y;
    let n = dims.n;
    let wpr = dims.k / qbe() * qunits();
    let xv = t * (dims.k / 4u);
    let last = n - 1u;
    var acc: array<f32, 16>;
    for (var wi = tid; wi < wpr; wi += WG) {
        for (var r = 0u; r < ROWS; r++) {
            let j = min(j0 + r, last);
            acc[r] += qdot(j * wpr, wi, xv);
            acc[ROWS + r] += qdot((n + j) * wpr, wi, xv);
        }
    }
    for (var r = 0u; r < 2u * ROWS; r++) {
        partial[r * WG + tid] = acc[r];
    }
    wg_sum_rows(tid, 2u * ROWS);
    if (tid < ROWS && j0 + tid < n && t < dims.rows) {
        y[t * n + j0 + tid] = act(partial[tid * WG], dims.act == 1u) * partial[(ROWS + tid) * WG];
    }
}
