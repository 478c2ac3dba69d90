// Quantized tiled GEMM y[m,n] = x[m,k] · w[n,k]ᵀ with w in ggml blocks (QFMT:
// q8_0, q4_0, q4_1). Each workgroup computes a TILE_M x TILE_N tile of y; per
// step it stages one block column (32 deep) of x and of w in workgroup memory,
// the weights dequantized on the way in (each invocation decodes whole quant
// words), and every invocation accumulates a 4x4 register block from it.
// Needs k a whole number of blocks (qbe()); any m and n.
//
// Bindings: x, the weight buffer twice (quants at 1, the scales region at 2), y,
// the uniform.

override TILE_M: u32 = 64;
override TILE_N: u32 = 64;
override QFMT: u32 = 0u;
// Invocations: (TILE_M / 4) * (TILE_N / 4).
override WGS: u32 = 256;

struct Dims { m: u32, n: u32, k: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> ws: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;

// x tile [TILE_M][32] and dequantized w tile [TILE_N][33] (padded against bank conflicts).
var<workgroup> xs: array<f32, TILE_M * 32>;
var<workgroup> wt: array<f32, TILE_N * 33>;

// Includes: qblock.wgsl (block decoding: qunits, qpos, qchunk, qdecode).

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let tx = tid % (TILE_N / 4u);
    let ty = tid / (TILE_N / 4u);
    let m0 = wid.y * TILE_M;
    let n0 = wid.x * TILE_N;
    // Blocks per row, and the 32-element chunks (one step each) per block.
    let bpr = dims.k / qbe();
    let cpb = qbe() / 32u;
    let kv = dims.k / 4u;
    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i++) {
        acc[i] = 0.0;
    }
    for (var b = 0u; b < dims.k / 32u; b++) {
        for (var i = tid; i < TILE_M * 8u; i += WGS) {
            let r = i / 8u;
            let c = i % 8u;
            var v = vec4<f32>(0.0);
            if (m0 + r < dims.m) {
                v = x[(m0 + r) * kv + b * 8u + c];
            }
            xs[r * 32u + c * 4u] = v.x;
            xs[r * 32u + c * 4u + 1u] = v.y;
            xs[r * 32u + c * 4u + 2u] = v.z;
            xs[r * 32u + c * 4u + 3u] = v.w;
        }
        let blk = b / cpb;
        let ch = qchunk(b % cpb);
        for (var i = tid; i < TILE_N * ch.y; i += WGS) {
            let r = i / ch.y;
            let u = ch.x + i % ch.y;
            var d = QWord(vec4<f32>(0.0), vec4<f32>(0.0));
            if (n0 + r < dims.n) {
                d = qdecode(((n0 + r) * bpr + blk) * qunits() + u);
            }
            let p = qpos(u) % vec2<u32>(32u);
            if (ch.z != 1u) {
                for (var e = 0u; e < 4u; e++) {
                    wt[r * 33u + p.x + e] = d.lo[e];
                }
            }
            if (ch.z != 0u) {
                for (var e = 0u; e < 4u; e++) {
                    wt[r * 33u + p.y + e] = d.hi[e];
                }
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 32u; kk++) {
            var a: vec4<f32>;
            var w: vec4<f32>;
            for (var i = 0u; i < 4u; i++) {
                a[i] = xs[(ty * 4u + i) * 32u + kk];
                w[i] = wt[(tx * 4u + i) * 33u + kk];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    acc[i * 4u + j] += a[i] * w[j];
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let r = m0 + ty * 4u + i;
        if (r >= dims.m) { break; }
        for (var j = 0u; j < 4u; j++) {
            let c = n0 + tx * 4u + j;
            if (c < dims.n) {
                y[r * dims.n + c] = acc[i * 4u + j];
            }
        }
    }
}
