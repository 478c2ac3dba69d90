// What the matrix-tile GEMMs share (gemm / gate_up, float or block-format weights;
// on cooperative matrices, qgemm_coop8/16 and gemm_coop8/16 with the entry point
// mma_coop.wgsl, or with the same tiles in plain loops, qgemm_mma_emu and
// gemm_mma_emu with mma_emu.wgsl): the tile geometry, the staging of x into f16
// workgroup tiles, the matrix bases the loads and stores use, and the copy of the f32
// result matrices to y (with the gated activation of gate_up). The weight staging is
// the weight format's: mma_q.wgsl (ggml blocks, dequantized) or mma_f.wgsl (f32 or
// packed f16 words); each defines nchunks() and stage_w(). It reads the including
// shader's overrides SG_M, SG_N, MAT_M, MAT_N, TILE_K, WGS, W_MATS and its MAT (the
// matrix side, 8 or 16), its bindings (x, y, dims: m, n, k, act) and workgroup
// arrays xs, wt (f16) and cs (f32); act.wgsl's act().
//
// A workgroup owns a TILE_M x TILE_N tile of y, TILE_M = SG_M·MAT_M·MAT and
// TILE_N = SG_N·MAT_N·MAT: subgroup s (0 .. SG_M·SG_N) owns the MAT_M x MAT_N
// matrices of rows (s / SG_N)·MAT_M·MAT.. and columns (s % SG_N)·MAT_N·MAT.. of it.
// W_MATS weight matrices are multiplied with the same x tile: 1 for gemm (w rows
// n0..), 2 for gate_up (gate rows n0.., up rows dims.n + n0.., staged one after the
// other in wt, accumulated separately, y = act(gate) · up on the way out).
// Per step of TILE_K (whole 32-element chunks of k), x rows and w rows are staged
// row-major at a row stride of TILE_K + 8 halves (16 bytes of padding: the stride is
// not a multiple of 128 bytes, so the rows a matrix load reads start in different
// banks; every row and matrix base stays 16-byte aligned). A (rows of x) loads
// row-major from xs, B (k x n, i.e. rows of w) column-major from wt, both at that
// stride. Each subgroup stores one result matrix (per weight matrix) at a time
// row-major into its slot of cs (MAT·MAT f32; the up matrices' slots after all the
// gate ones), and the whole workgroup copies the slots to y with the edge checks.

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

// First element of B matrix nj of weight matrix g, subgroup column sn, at matrix
// step kk along k.
fn b_base(sn: u32, nj: u32, kk: u32, g: u32) -> u32 {
    return (g * tile_n() + (sn * MAT_N + nj) * MAT) * xstride() + kk * MAT;
}

// First element of subgroup s's result slot for weight matrix g in cs.
fn c_slot(s: u32, g: u32) -> u32 {
    return (g * SG_M * SG_N + s) * MAT * MAT;
}

// Stages TILE_K of x (rounded to f16) and of every weight matrix from 32-element
// chunk c0 on; zeros past the edges.
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
    for (var g = 0u; g < W_MATS; g++) {
        stage_w(c0, tid, n0, g * dims.n + n0, g * tile_n() * xs_row);
    }
}

// Copies result matrix (mi, nj) of every subgroup from its cs slots to y: the gemm
// result, or act(gate) · up.
fn write_out(mi: u32, nj: u32, tid: u32, m0: u32, n0: u32) {
    let mm = MAT * MAT;
    let slots = SG_M * SG_N * mm;
    for (var e = tid; e < slots; e += WGS) {
        let s = e / mm;
        let r = (e % mm) / MAT;
        let c = e % MAT;
        let row = m0 + ((s / SG_N) * MAT_M + mi) * MAT + r;
        let col = n0 + ((s % SG_N) * MAT_N + nj) * MAT + c;
        if (row < dims.m && col < dims.n) {
            var v = cs[e];
            if (W_MATS == 2u) {
                v = act(v, dims.act == 1u) * cs[slots + e];
            }
            y[row * dims.n + col] = v;
        }
    }
}
