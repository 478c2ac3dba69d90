// What the matrix-tile GEMMs over block-quantized weights share (qgemm_coop8,
// qgemm_coop16 on cooperative matrices, qgemm_mma_emu with the same tiles in plain
// loops): the tile geometry, the staging of x and the dequantized w into f16
// workgroup tiles, the matrix bases the loads and stores use, and the copy of the
// f32 result matrices to y. It reads the including shader's overrides SG_M, SG_N,
// MAT_M, MAT_N, TILE_K, WGS, QFMT and its MAT (the matrix side, 8 or 16), its
// bindings (x, wq, ws, y, dims) and workgroup arrays xs, wt (f16) and cs (f32).
//
// A workgroup owns a TILE_M x TILE_N tile of y, TILE_M = SG_M·MAT_M·MAT and
// TILE_N = SG_N·MAT_N·MAT: subgroup s (0 .. SG_M·SG_N) owns the MAT_M x MAT_N
// matrices of rows (s / SG_N)·MAT_M·MAT.. and columns (s % SG_N)·MAT_N·MAT.. of it.
// Per step of TILE_K (whole 32-element chunks of the blocks), x rows and w rows are
// staged row-major at a row stride of TILE_K + 8 halves (16 bytes of padding: the
// stride is not a multiple of 128 bytes, so the rows a matrix load reads start in
// different banks; every row and matrix base stays 16-byte aligned). A (rows of x)
// loads row-major from xs, B (k x n, i.e. rows of w) column-major from wt, both at
// that stride. Each subgroup stores one result matrix at a time row-major into its
// slot of cs (MAT·MAT f32), and the whole workgroup copies the slots to y with the
// edge checks.

fn tile_m() -> u32 {
    return SG_M * MAT_M * MAT;
}

fn tile_n() -> u32 {
    return SG_N * MAT_N * MAT;
}

// Row stride of xs and wt, in halves.
fn xstride() -> u32 {
    return TILE_K + 8u;
}

// First element of A matrix mi of subgroup row sm at matrix step kk along k.
fn a_base(sm: u32, mi: u32, kk: u32) -> u32 {
    return (sm * MAT_M + mi) * MAT * xstride() + kk * MAT;
}

// First element of B matrix nj of subgroup column sn at matrix step kk along k.
fn b_base(sn: u32, nj: u32, kk: u32) -> u32 {
    return (sn * MAT_N + nj) * MAT * xstride() + kk * MAT;
}

// First element of subgroup s's result slot in cs.
fn c_slot(s: u32) -> u32 {
    return s * MAT * MAT;
}

// Stages TILE_K of x (rounded to f16) and of w (dequantized, rounded to f16) from
// 32-element chunk c0 on; zeros past the edges and past the last chunk.
fn stage(c0: u32, tid: u32, m0: u32, n0: u32) {
    let xs_row = xstride();
    let kv = TILE_K / 4u;
    let kx = dims.k / 4u;
    for (var e = tid; e < tile_m() * kv; e += WGS) {
        let r = e / kv;
        let c = e % kv;
        let gc = c0 * 8u + c;
        var v = vec4<f32>(0.0);
        if (m0 + r < dims.m && gc < kx) {
            v = x[(m0 + r) * kx + gc];
        }
        let h = vec4<f16>(v);
        for (var q = 0u; q < 4u; q++) {
            xs[r * xs_row + 4u * c + q] = h[q];
        }
    }
    let bpr = dims.k / qbe();
    let cpb = qbe() / 32u;
    let nch = dims.k / 32u;
    for (var s = 0u; s < TILE_K / 32u; s++) {
        let b = c0 + s;
        if (b >= nch) {
            for (var i = tid; i < tile_n() * 32u; i += WGS) {
                wt[(i / 32u) * xs_row + s * 32u + i % 32u] = f16(0.0);
            }
            continue;
        }
        let blk = b / cpb;
        let ch = qchunk(b % cpb);
        for (var i = tid; i < tile_n() * ch.y; i += WGS) {
            let r = i / ch.y;
            let u = ch.x + i % ch.y;
            var d = QWord(vec4<f32>(0.0), vec4<f32>(0.0));
            if (n0 + r < dims.n) {
                d = qdecode(((n0 + r) * bpr + blk) * qunits() + u);
            }
            let p = qpos(u) % vec2<u32>(32u) + vec2<u32>(s * 32u) + vec2<u32>(r * xs_row);
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

// Copies result matrix (mi, nj) of every subgroup from its cs slot to y.
fn write_out(mi: u32, nj: u32, tid: u32, m0: u32, n0: u32) {
    let mm = MAT * MAT;
    for (var e = tid; e < SG_M * SG_N * mm; e += WGS) {
        let s = e / mm;
        let r = (e % mm) / MAT;
        let c = e % MAT;
        let row = m0 + ((s / SG_N) * MAT_M + mi) * MAT + r;
        let col = n0 + ((s % SG_N) * MAT_N + nj) * MAT + c;
        if (row < dims.m && col < dims.n) {
            y[row * dims.n + col] = cs[e];
        }
    }
}
