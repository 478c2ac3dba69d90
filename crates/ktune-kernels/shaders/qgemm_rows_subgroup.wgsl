// Quantized GEMM of a few tokens, y[m,n] = x[m,k] · w[n,k]ᵀ (a decode batch of
// sequences, a short prompt), w in ggml blocks (QFMT: any ggml block format): each
// subgroup owns whole weight rows (row_sg.wgsl), its lanes stride over the row's
// block units, dequantize each unit once in registers (qblock.wgsl) and dot it
// with every token's activations, TOKENS accumulators a lane; one subgroupAdd a
// token finishes the row. The weights are read once for all the tokens (a GEMV's
// traffic for m of them), m in passes of TOKENS. Needs SUBGROUP and k a whole
// number of blocks (qbe()).
// Requires: qgemm.wgsl, qblock.wgsl, qgeom.wgsl, row_sg.wgsl, reduce_sg.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override QFMT: u32 = 0u;
const TOKENS: u32 = 8u;

fn row_count() -> u32 {
    return dims.n;
}

fn run_row(row: u32, lane: u32, stride: u32) {
    let qu = qunits();
    let wpr = dims.k / qbe() * qu;
    let kv = dims.k / 4u;
    for (var m0 = 0u; m0 < dims.m; m0 += TOKENS) {
        let mt = min(TOKENS, dims.m - m0);
        var acc: array<f32, TOKENS>;
        for (var wi = lane; wi < wpr; wi += stride) {
            let d = qdecode(row * wpr + wi);
            let p = qpos(wi % qu);
            let base = m0 * kv + (wi / qu) * (qbe() / 4u);
            for (var t = 0u; t < mt; t++) {
                let xb = base + t * kv;
                var s = dot(d.lo, x[xb + p.x / 4u]);
                if (QFMT != 0u) {
                    s += dot(d.hi, x[xb + p.y / 4u]);
                }
                acc[t] += s;
            }
        }
        for (var t = 0u; t < mt; t++) {
            let total = row_sum(acc[t], lane);
            if (lane == 0u) {
                y[(m0 + t) * dims.n + row] = total;
            }
        }
    }
}
