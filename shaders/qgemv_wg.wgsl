// Quantized GEMV y[n] = w[n,k] · x[k], w in ggml blocks (q8_0, q4_0, q4_1 by the
// QFMT override) read directly and dequantized in registers. Each workgroup owns
// ROWS consecutive rows; every invocation takes quant words (4 or 8 weights each)
// strided by WG, for all ROWS rows from the same x loads, then the workgroup
// reduces WG partials per row through workgroup memory. Needs k % 32 == 0.
// Includes: qgemv.wgsl (interface), qblock.wgsl (block decoding), reduce_wg.wgsl
// (the tree).

override WG: u32 = 128;
override ROWS: u32 = 2;
override QFMT: u32 = 0u;

var<workgroup> partial: array<f32, WG * ROWS>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    let wpr = dims.k / 32u * qwords();
    for (var r = 0u; r < ROWS; r++) {
        partial[r * WG + tid] = 0.0;
    }
    for (var wi = tid; wi < wpr; wi += WG) {
        for (var r = 0u; r < ROWS; r++) {
            let row = row0 + r;
            if (row < dims.n) {
                partial[r * WG + tid] += qdot(row * wpr, wi, 0u);
            }
        }
    }
    wg_sum_rows(tid, ROWS);
    if (tid < ROWS && row0 + tid < dims.n) {
        y[row0 + tid] = partial[tid * WG];
    }
}
