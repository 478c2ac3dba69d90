// The weight staging of the matrix-tile GEMMs over float weights (mma.wgsl): w bound
// as 16-byte words of 4 f32 or 8 packed f16 (W_F16, wload.wgsl), rounded (f32) or
// copied (f16) into wt. Needs k a multiple of 4 (f32) or 8 (f16): a word never
// straddles the end of a row; the last chunk is zero-filled past k.

// 32-element chunks along k (the last one partial).
fn nchunks() -> u32 {
    return (dims.k + 31u) / 32u;
}

// Stages TILE_K of weight rows row0 + r (r < tile_n(); valid while col0 + r <
// dims.n, zeros otherwise and past k) from chunk c0 on into wt at element `base`
// (row r at base + r · xstride()).
fn stage_w(c0: u32, tid: u32, col0: u32, row0: u32, base: u32) {
    let xs_row = xstride();
    let kvw = wwords16(TILE_K);
    let kw = wwords16(dims.k);
    let per = select(4u, 8u, W_F16); // elements per word
    for (var e = tid; e < tile_n() * kvw; e += WGS) {
        let r = e / kvw;
        let c = e % kvw;
        let gc = wwords16(c0 * 32u) + c;
        var q = vec4<u32>(0u);
        if (col0 + r < dims.n && gc < kw) {
            q = w[(row0 + r) * kw + gc];
        }
        let p = base + r * xs_row + c * per;
        let lo = vec4<f16>(wlo4(q));
        for (var i = 0u; i < 4u; i++) {
            wt[p + i] = lo[i];
        }
        if (W_F16) {
            let hi = vec4<f16>(whi4(q));
            for (var i = 0u; i < 4u; i++) {
                wt[p + 4u + i] = hi[i];
            }
        }
    }
}
