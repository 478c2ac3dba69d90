// GEMM y[m,n] = x[m,k] · w[n,k]ᵀ, tiled in workgroup memory with register blocking.
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
// REG_M, REG_N <= 8; any m and n. Includes: wload.wgsl (W_F16, 16-byte words).

override TILE_M: u32 = 64;
override TILE_N: u32 = 64;
override TILE_K: u32 = 16;
override REG_M: u32 = 4;
override REG_N: u32 = 4;
override WGS: u32 = 256; // (TILE_M / REG_M) * (TILE_N / REG_N), set by the host
override W_F16: bool = false;

struct Dims { m: u32, n: u32, k: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

// row r of a tile, vec4 c along k, at r * (TILE_K / 4 + 1) + c
var<workgroup> xs: array<vec4<f32>, TILE_M * (TILE_K / 4u + 1u)>;
var<workgroup> ws: array<vec4<f32>, TILE_N * (TILE_K / 4u + 1u)>;

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
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
        for (var e = tid; e < TILE_M * kv; e += WGS) {
            let r = e / kv;
            let c = e % kv;
            let gc = k0 / 4u + c;
            var v = vec4<f32>(0.0);
            if (m0 + r < m && gc < k4) {
                v = x[(m0 + r) * k4 + gc];
            }
            xs[r * ks + c] = v;
        }
        // w: words of 4 f32 or 8 f16, each widened to one or two vec4 of the tile row
        let kvw = wwords16(TILE_K);
        let kw = wwords16(k);
        for (var e = tid; e < TILE_N * kvw; e += WGS) {
            let r = e / kvw;
            let c = e % kvw;
            let gc = wwords16(k0) + c;
            var q = vec4<u32>(0u);
            if (n0 + r < n && gc < kw) {
                q = w[(n0 + r) * kw + gc];
            }
            let ti = r * ks + wx16(c);
            ws[ti.x] = wlo4(q);
            if (W_F16) {
                ws[ti.y] = whi4(q);
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
                y[row * n + col] = acc[i * REG_N + j];
            }
        }
    }
}
