// The weight staging of the matrix-tile GEMMs over ggml blocks (mma.wgsl): w bound
// as quants and scales (wq, ws; qblock.wgsl decodes), dequantized and rounded to f16
// into wt. k is a whole number of blocks (qbe()), so of 32-element chunks.

// 32-element chunks along k.
fn nchunks() -> u32 {
    return dims.k / 32u;
}

// Stages TILE_K of weight rows row0 + r (r < tile_n(); valid while col0 + r <
// dims.n, zeros otherwise and past the last chunk) from chunk c0 on into wt at
// element `base` (row r at base + r · xstride()).
fn stage_w(c0: u32, tid: u32, col0: u32, row0: u32, base: u32) {
    let xs_row = xstride();
    let bpr = dims.k / qbe();
    let cpb = qbe() / 32u;
    let nch = nchunks();
    for (var s = 0u; s < TILE_K / 32u; s++) {
        let b = c0 + s;
        if (b >= nch) {
            for (var i = tid; i < tile_n() * 32u; i += WGS) {
                wt[base + (i / 32u) * xs_row + s * 32u + i % 32u] = f16(0.0);
            }
            continue;
        }
        let blk = b / cpb;
        let ch = qchunk(b % cpb);
        for (var i = tid; i < tile_n() * ch.y; i += WGS) {
            let r = i / ch.y;
            let u = ch.x + i % ch.y;
            var d = QWord(vec4<f32>(0.0), vec4<f32>(0.0));
            if (col0 + r < dims.n) {
                d = qdecode(((row0 + r) * bpr + blk) * qunits() + u);
            }
            let p = qpos(u) % vec2<u32>(32u) + vec2<u32>(base + s * 32u) + vec2<u32>(r * xs_row);
            let lo = vec4<f16>(d.lo);
            let hi = vec4<f16>(d.hi);
            for (var e = 0u; e < 4u; e++) {
                if (ch.z != 1u) {
                    wt[p.x + e] = lo[e];
                }
                if (ch.z != 0u) {
                    wt[p.y + e] = hi[e];
                }
            }
        }
    }
}
