// The tiled GEMM body y[m,n] = x[m,k] · w[n,k]ᵀ shared by gemm_tiled and the
// vision family's linear_tiled / patch_embed_im2col (`shader!(FILE, "gemm_tile.wgsl",
// "reg_tile.wgsl", "wload.wgsl", ..)`): `gemm_tile(wid, tid)` computes the
// workgroup's tile and hands each output to the including shader's
// `gemm_store(row, col, value)` (the epilogue: a plain store, or bias and
// activation).
//
// A workgroup owns a TILE_M x TILE_N block of y. For each step of TILE_K along k it
// stages the x tile [TILE_M, TILE_K] and the w tile [TILE_N, TILE_K] in workgroup
// memory with 16-byte loads (one vec4<f32> of x; one vec4<u32> of w = 4 f32 or 8
// packed f16 weights, widened to f32 here), zero-filled past the edges; each
// invocation then accumulates its register block (reg_tile.wgsl: the x staging, the
// REG_M x REG_N block of vec4 dot products, the stores).
//
// Needs k % 4 == 0 (f32 weights) or k % 8 == 0 (f16 weights), TILE_K % 8 == 0,
// REG_M, REG_N <= 8; any m and n. The head gemm_tiling.wgsl declares the overrides
// TILE_M, TILE_N, TILE_K, REG_M, REG_N, WGS, W_F16, TileV and Dims (m, n, k); the
// shader the bindings `x: array<vec4<f32>>`, `w: array<vec4<u32>>` and `dims`, and
// `gemm_store`. Includes: reg_tile.wgsl, wload.wgsl (W_F16, 16-byte words).
// Requires: gemm_tiling.wgsl, reg_tile.wgsl, wload.wgsl.

// row r of a tile, vec4 c along k, at r * (TILE_K / 4 + 1) + c
var<workgroup> xs: array<TileV, TILE_M * (TILE_K / 4u + 1u)>;
var<workgroup> wt: array<TileV, TILE_N * (TILE_K / 4u + 1u)>;

fn gemm_tile(wid: vec3<u32>, tid: u32) {
    let ks = TILE_K / 4u + 1u; // padded tile row stride, in vec4
    let m0 = wid.y * TILE_M;
    let n0 = wid.x * TILE_N;
    let n = dims.n;
    let k = dims.k;
    var acc: array<f32, 64>;
    for (var i = 0u; i < REG_M * REG_N; i++) {
        acc[i] = 0.0;
    }
    for (var k0 = 0u; k0 < k; k0 += TILE_K) {
        stage_x(0u, m0, k0 / 4u, tid);
        // w: words of 4 f32 or 8 f16, each widened to one or two vec4 of the tile
        // row; an invocation's share rounded up, as stage_x's
        let kvw = wwords16(TILE_K);
        let kw = wwords16(k);
        for (var t = 0u; t < (TILE_N * kvw + WGS - 1u) / WGS; t++) {
            let e = tid + t * WGS;
            let r = e / kvw;
            let c = e % kvw;
            let gc = wwords16(k0) + c;
            let ok = n0 + r < n && gc < kw;
            let q = select(vec4<u32>(0u), w[select(0u, (n0 + r) * kw + gc, ok)], ok);
            if (e < TILE_N * kvw) {
                let ti = r * ks + wx16(c);
                wt[ti.x] = wlo4(q);
                if (W_F16) {
                    wt[ti.y] = whi4(q);
                }
            }
        }
        workgroupBarrier();
        reg_tile_step(&acc, 0u, 0u, tid);
        workgroupBarrier();
    }
    reg_tile_store(&acc, m0, n0, tid);
}
