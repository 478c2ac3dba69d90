// Fused RMSNorm prologue + quantized GEMV (decode): y[n] = w[n,k] · (x * inv_rms * g'),
// w in ggml blocks (any ggml block format by the QFMT override) read directly and
// dequantized in registers, g' = g or 1 + g (unit_offset, Gemma), inv_rms =
// 1 / sqrt(mean(x²) + eps). Since y_r = inv_rms · Σ_c w[r,c]·x[c]·g'[c], w is read
// once and the normalized vector never stored: each workgroup owns ROWS consecutive
// rows; every invocation takes quant words (4 or 8 weights each) strided by WG, for
// all ROWS rows from the same x·g' values, and sums x² of those activations
// alongside (every activation belongs to exactly one word index); one workgroup
// reduction of the ROWS + 1 partials, then the row sums are scaled by inv_rms.
// Needs k a whole number of blocks (qbe()).
// Includes: norm_gemv_q.wgsl (interface), qblock.wgsl (block decoding),
// norm_block_wg.wgsl (partials and store), block_wg.wgsl (entry point),
// reduce_wg.wgsl (the tree).
// Requires: norm_block_wg.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 2;
override QFMT: u32 = 0u;

// Rows 0..ROWS: the partial dot products; row ROWS: the partial sums of squares.
var<workgroup> partial: array<f32, WG * (ROWS + 1u)>;

fn block_partials(row0: u32, tid: u32) -> u32 {
    let qu = qunits();
    let wpr = dims.k / qbe() * qu;
    let off = vec4<f32>(select(0.0, 1.0, dims.unit_offset != 0u));
    var acc: array<f32, 8>; // ROWS <= 8 (the parameter's values)
    for (var r = 0u; r < ROWS; r++) {
        acc[r] = 0.0;
    }
    var ss = 0.0;
    for (var wi = tid; wi < wpr; wi += WG) {
        // Unit j of block bi covers x at qpos(j) within the block (two halves but for q8_0).
        let base = (wi / qu) * (qbe() / 4u);
        let p = qpos(wi % qu);
        let i0 = base + p.x / 4u;
        let i1 = base + p.y / 4u;
        let x0 = x[i0];
        let a0 = x0 * (g[i0] + off);
        ss += dot(x0, x0);
        if (QFMT == 0u) {
            for (var r = 0u; r < ROWS; r++) {
                let row = row0 + r;
                if (row < dims.n) {
                    acc[r] += dot(qdecode(row * wpr + wi).lo, a0);
                }
            }
        } else {
            let x1 = x[i1];
            let a1 = x1 * (g[i1] + off);
            ss += dot(x1, x1);
            for (var r = 0u; r < ROWS; r++) {
                let row = row0 + r;
                if (row < dims.n) {
                    let d = qdecode(row * wpr + wi);
                    acc[r] += dot(d.lo, a0) + dot(d.hi, a1);
                }
            }
        }
    }
    return norm_partials(acc, ss, tid);
}
