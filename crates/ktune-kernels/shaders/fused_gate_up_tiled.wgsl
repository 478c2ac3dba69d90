// Fused gate+up projection for prefill, GEMM style with register blocking:
// y[t, j] = act(x[t]·w[j]) * (x[t]·w[n + j]). A 16x16 workgroup owns a tile of
// 16·TM token rows by 16·TN features; per k-step of TK it stages the x tile and the
// matching gate and up weight tiles in workgroup memory (zero-padded at the edges),
// then every invocation accumulates TM x TN gate and up sums in registers (rows
// ly + 16i, features lx + 16j) from vec4 dot products and applies the activation
// product at the end. Any shape; weights as u32 words decoded by W_F16. Includes:
// act.wgsl, wload.wgsl.
//
// Tiles are vec4 rows of TK / 4 + 1 vec4: TK / 4 is 2, 4 or 8, so the row stride is
// odd in 16-byte units and the 8 invocations of a quarter wave that read 8 different
// weight rows (lx, one 128-bit load each) hit 8 different groups of 4 banks; the two
// x rows of a wave (ly, ly + 1) fall in different banks too.

override TM: u32 = 2;  // token rows per invocation (<= 4)
override TN: u32 = 2;  // features per invocation (<= 4)
override TK: u32 = 16; // k per stage (a multiple of 8)
override W_F16: bool = false;

override BM: u32 = 16u * TM;
override BN: u32 = 16u * TN;

struct Dims { rows: u32, n: u32, k: u32, act: u32 } // act: 0 silu, 1 gelu_tanh

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

// row r of a tile, vec4 c along k, at r * (TK / 4 + 1) + c
var<workgroup> xs: array<vec4<f32>, 16u * TM * (TK / 4u + 1u)>;
var<workgroup> gs: array<vec4<f32>, 16u * TN * (TK / 4u + 1u)>;
var<workgroup> us: array<vec4<f32>, 16u * TN * (TK / 4u + 1u)>;

fn wload(i: u32) -> f32 { return wpick(w[wword(i)], i); }

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let rows = dims.rows;
    let n = dims.n;
    let k = dims.k;
    let m0 = wid.y * BM;
    let n0 = wid.x * BN;
    var ag: array<f32, 16>; // TM * TN <= 16 (checked on the host)
    var au: array<f32, 16>;
    for (var i = 0u; i < TM * TN; i++) {
        ag[i] = 0.0;
        au[i] = 0.0;
    }
    let kv = TK / 4u;      // vec4 per tile row
    let ks = TK / 4u + 1u; // padded row stride, in vec4
    for (var k0 = 0u; k0 < k; k0 += TK) {
        // an invocation's share rounded up (constant trip counts, branch-free loads)
        for (var t = 0u; t < (BM * kv + 255u) / 256u; t++) {
            let e = tid + t * 256u;
            let r = e / kv;
            let c = e % kv;
            let gr = m0 + r;
            let row = min(gr, rows - 1u) * k;
            var v = vec4<f32>(0.0);
            for (var q = 0u; q < 4u; q++) {
                let gc = k0 + 4u * c + q;
                v[q] = select(0.0, x[row + min(gc, k - 1u)], gr < rows && gc < k);
            }
            if (e < BM * kv) {
                xs[r * ks + c] = v;
            }
        }
        for (var t = 0u; t < (BN * kv + 255u) / 256u; t++) {
            let e = tid + t * 256u;
            let r = e / kv;
            let c = e % kv;
            let j = n0 + r;
            let jj = min(j, n - 1u);
            var g = vec4<f32>(0.0);
            var u = vec4<f32>(0.0);
            for (var q = 0u; q < 4u; q++) {
                let gc = k0 + 4u * c + q;
                let ok = j < n && gc < k;
                let cc = min(gc, k - 1u);
                g[q] = select(0.0, wload(jj * k + cc), ok);
                u[q] = select(0.0, wload((n + jj) * k + cc), ok);
            }
            if (e < BN * kv) {
                gs[r * ks + c] = g;
                us[r * ks + c] = u;
            }
        }
        workgroupBarrier();
        for (var c = 0u; c < kv; c++) {
            var a: array<vec4<f32>, 4>;
            for (var i = 0u; i < TM; i++) { a[i] = xs[(lid.y + 16u * i) * ks + c]; }
            for (var j = 0u; j < TN; j++) {
                let bg = gs[(lid.x + 16u * j) * ks + c];
                let bu = us[(lid.x + 16u * j) * ks + c];
                for (var i = 0u; i < TM; i++) {
                    ag[i * TN + j] += dot(a[i], bg);
                    au[i * TN + j] += dot(a[i], bu);
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < TM; i++) {
        let r = m0 + lid.y + 16u * i;
        for (var j = 0u; j < TN; j++) {
            let f = n0 + lid.x + 16u * j;
            if (r < rows && f < n) {
                y[r * n + f] = act(ag[i * TN + j], dims.act == 1u) * au[i * TN + j];
            }
        }
    }
}
