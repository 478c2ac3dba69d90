// The weight staging of the matrix-tile GEMMs over float weights (mma.wgsl): w bound
// as 16-byte words of 4 f32 or 8 packed f16 (W_F16, wload.wgsl), rounded (f32) or
// copied (f16) into wt. Needs k a multiple of 4 (f32) or 8 (f16): a word never
// straddles the end of a row; the last chunk is zero-filled past k.
// Requires: mma.wgsl, wload.wgsl.
//
// A slot is one 16-byte word: slot f of a step is matrix g = f / w_per(), word
// tid + (f % w_per())·WGS of the tile_n() x wwords16(TILE_K) words of its tile.

// 32-element chunks along k (the last one partial).
fn nchunks() -> u32 {
    return (dims.k + 31u) / 32u;
}

// Slots per invocation for one matrix, and in all.
fn w_per() -> u32 {
    return (tile_n() * wwords16(TILE_K) + WGS - 1u) / WGS;
}

fn w_slots() -> u32 {
    return W_MATS * w_per();
}

// Slot f of the step from chunk c0 (zeros past the edges and past k).
fn fetch_w(c0: u32, tid: u32, n0: u32, f: u32) -> vec4<u32> {
    let kvw = wwords16(TILE_K);
    let kw = wwords16(dims.k);
    let g = f / w_per();
    let e = tid + (f % w_per()) * WGS;
    let r = e / kvw;
    let gc = wwords16(c0 * 32u) + e % kvw;
    // no branch (see fetch_x): a slot past the edges loads word 0 and drops it
    let ok = e < tile_n() * kvw && n0 + r < dims.n && gc < kw;
    return select(vec4<u32>(0u), w[select(0u, (g * dims.n + n0 + r) * kw + gc, ok)], ok);
}

// Stores slot f into tile buffer buf, as f16.
fn store_w(c0: u32, buf: u32, tid: u32, f: u32, q: vec4<u32>) {
    let kvw = wwords16(TILE_K);
    let g = f / w_per();
    let e = tid + (f % w_per()) * WGS;
    if (e < tile_n() * kvw) {
        let p = buf * wbuf() + (g * tile_n() + e / kvw) * xstride() + (e % kvw) * select(4u, 8u, W_F16);
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
