// The tiled GEMM body y[m,n] = x[m,k] · w[n,k]ᵀ shared by gemm_tiled and the
// vision family's linear_tiled / patch_embed_im2col (`shader!(FILE, "gemm_tile.wgsl",
// "wload.wgsl", ..)`): `gemm_tile(wid, tid)` computes the workgroup's tile and hands
// each output to the including shader's `gemm_store(row, col, value)` (the epilogue:
// a plain store, or bias and activation).
//
// A workgroup owns a TILE_M x TILE_N block of y. For each step of TILE_K along k it
// stages the x tile [TILE_M, TILE_K] and the w tile [TILE_N, TILE_K] in workgroup
// memory with 16-byte loads (one vec4<f32> of x; one vec4<u32> of w = 4 f32 or 8
// packed f16 weights, widened to f32 here), zero-filled past the edges. Each of the
// WGS = (TILE_M / REG_M) · (TILE_N / REG_N) invocations then accumulates a REG_M x
// REG_N block of y from vec4 dot products; its rows and columns are strided by the
// thread grid, so neighbouring invocations write neighbouring columns. Tile rows are
// padded by one vec4 so the invocations of a wave spread over the memory banks.
//
// Needs k % 4 == 0 (f32 weights) or k % 8 == 0 (f16 weights), TILE_K % 8 == 0,
// REG_M, REG_N <= 8; any m and n. The head gemm_tiling.wgsl declares the overrides
// TILE_M, TILE_N, TILE_K, REG_M, REG_N, WGS, W_F16 and Dims (m, n, k); the shader
// the bindings `x: array<vec4<f32>>`, `w: array<vec4<u32>>` and `dims`, and
// `gemm_store`. Includes: wload.wgsl (W_F16, 16-byte words).
// Requires: gemm_tiling.wgsl, wload.wgsl.

// row r of a tile, vec4 c along k, at r * (TILE_K / 4 + 1) + c
var<workgroup> xs: array<vec4<f32>, TILE_M * (TILE_K / 4u + 1u)>;
var<workgroup> ws: array<vec4<f32>, TILE_N * (TILE_K / 4u + 1u)>;

fn gemm_tile(wid: vec3<u32>, tid: u32) {
    let ks = TILE_K / 4u + 1u; // padded tile row stride, in vec4
    let kv = TILE_K / 4u;      // vec4 per tile row
    let tnx = TILE_N / REG_N;  // invocations along n
    let tmy = TILE_M / REG_M;  // invocations along m
    let tx = tid % tnx;
    let ty = tid / tnx;
    let m0 = wid.y * TILE_M;
    let n0 = wid.x * TILE_N;
    let m = dims.m;
    let n = dims.n;
    let k = dims.k;
    let k4 = k / 4u;
    var acc: array<f32, 64>;
    for (var i = 0u; i < REG_M * REG_N; i++) {
        acc[i] = 0.0;
    }
    var a: array<vec4<f32>, 8>;
    for (var k0 = 0u; k0 < k; k0 += TILE_K) {
        // an invocation's share of each tile, rounded up: loops of constant trip
        // count whose loads have no branch (an element past the edges loads
        // element 0 and drops it), so they can be unrolled with every load in
        // flight before the first store
        for (var t = 0u; t < (TILE_M * kv + WGS - 1u) / WGS; t++) {
            let e = tid + t * WGS;
            let r = e / kv;
            let c = e % kv;
            let gc = k0 / 4u + c;
            let ok = m0 + r < m && gc < k4;
            let v = select(vec4<f32>(0.0), x[select(0u, (m0 + r) * k4 + gc, ok)], ok);
            if (e < TILE_M * kv) {
                xs[r * ks + c] = v;
            }
        }
        // w: words of 4 f32 or 8 f16, each widened to one or two vec4 of the tile row
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
                ws[ti.x] = wlo4(q);
                if (W_F16) {
                    ws[ti.y] = whi4(q);
                }
            }
        }
        workgroupBarrier();
        for (var c = 0u; c < kv; c++) {
            for (var i = 0u; i < REG_M; i++) {
                a[i] = xs[(ty + i * tmy) * ks + c];
            }
            for (var j = 0u; j < REG_N; j++) {
                let b = ws[(tx + j * tnx) * ks + c];
                for (var i = 0u; i < REG_M; i++) {
                    acc[i * REG_N + j] += dot(a[i], b);
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < REG_M; i++) {
        let row = m0 + ty + i * tmy;
        for (var j = 0u; j < REG_N; j++) {
            let col = n0 + tx + j * tnx;
            if (row < m && col < n) {
                gemm_store(row, col, acc[i * REG_N + j]);
            }
        }
    }
}
