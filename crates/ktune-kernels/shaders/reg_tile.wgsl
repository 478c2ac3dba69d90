// The register tile of the tiled GEMMs y[m,n] = x[m,k] · w[n,k]ᵀ, shared by
// gemm_tile.wgsl (float weights) and qgemm_tiled_body.wgsl (block-format weights):
// the x tile's staging, each invocation's REG_M x REG_N block of dot products over
// the staged tiles, and its stores. The including shader stages w its own way.
//
// Tiles are the including shader's workgroup arrays `xs` (x rows) and `wt` (w rows)
// of TileV (its head's alias: vec4 of f32 or f16, read back as vec4<f32>), one
// buffer or more of TILE_M (xs) or TILE_N (wt) rows each: row r, vec4 c along k, at
// r * (TILE_K / 4 + 1) + c (one vec4 of padding, so the invocations of a wave
// spread over the memory banks). Of the WGS = (TILE_M / REG_M) · (TILE_N / REG_N)
// invocations, tid holds rows ty + i·TILE_M/REG_M and columns tx + j·TILE_N/REG_N
// of the workgroup's tile (tx = tid % (TILE_N / REG_N), ty = tid / (TILE_N /
// REG_N)): neighbouring invocations read neighbouring tile rows and write
// neighbouring columns. The accumulators are the caller's `array<f32, 64>`
// (REG_M, REG_N <= 8).
//
// Uses the overrides TILE_M, TILE_N, TILE_K, REG_M, REG_N and WGS, the bindings
// `x: array<vec4<f32>>` and `dims` (m, n, k), and the shader's `fn gemm_store(row:
// u32, col: u32, value: f32)` (the epilogue).

// Stages rows m0 .. m0 + TILE_M of x, vec4 kv0 .. kv0 + TILE_K / 4 along k, into
// the x buffer whose first row is xb: zeros past the edges. The loop has a constant
// trip count (an invocation's share, rounded up) and its loads no branch (an
// element past the edges loads element 0 and drops it), so the compiler can unroll
// it and have all its loads in flight before the first store.
fn stage_x(xb: u32, m0: u32, kv0: u32, tid: u32) {
    let ks = TILE_K / 4u + 1u; // padded tile row stride, in vec4
    let kv = TILE_K / 4u;      // vec4 per tile row
    let kx = dims.k / 4u;
    for (var t = 0u; t < (TILE_M * kv + WGS - 1u) / WGS; t++) {
        let e = tid + t * WGS;
        let r = e / kv;
        let c = e % kv;
        let gc = kv0 + c;
        let ok = m0 + r < dims.m && gc < kx;
        let v = select(vec4<f32>(0.0), x[select(0u, (m0 + r) * kx + gc, ok)], ok);
        if (e < TILE_M * kv) {
            xs[(xb + r) * ks + c] = TileV(v);
        }
    }
}

// Adds to acc the invocation's products over one staged step: the x buffer whose
// first row is xb, the w buffer whose first row is wb.
fn reg_tile_step(acc: ptr<function, array<f32, 64>>, xb: u32, wb: u32, tid: u32) {
    let ks = TILE_K / 4u + 1u;
    let kv = TILE_K / 4u;
    let tnx = TILE_N / REG_N; // invocations along n
    let tmy = TILE_M / REG_M; // invocations along m
    let tx = tid % tnx;
    let ty = tid / tnx;
    var a: array<vec4<f32>, 8>;
    for (var c = 0u; c < kv; c++) {
        for (var i = 0u; i < REG_M; i++) {
            a[i] = vec4<f32>(xs[(xb + ty + i * tmy) * ks + c]);
        }
        for (var j = 0u; j < REG_N; j++) {
            let b = vec4<f32>(wt[(wb + tx + j * tnx) * ks + c]);
            for (var i = 0u; i < REG_M; i++) {
                (*acc)[i * REG_N + j] += dot(a[i], b);
            }
        }
    }
}

// Hands the invocation's outputs inside m x n of the tile at (m0, n0) to gemm_store.
fn reg_tile_store(acc: ptr<function, array<f32, 64>>, m0: u32, n0: u32, tid: u32) {
    let tnx = TILE_N / REG_N;
    let tmy = TILE_M / REG_M;
    let tx = tid % tnx;
    let ty = tid / tnx;
    for (var i = 0u; i < REG_M; i++) {
        let row = m0 + ty + i * tmy;
        for (var j = 0u; j < REG_N; j++) {
            let col = n0 + tx + j * tnx;
            if (row < dims.m && col < dims.n) {
                gemm_store(row, col, (*acc)[i * REG_N + j]);
            }
        }
    }
}
