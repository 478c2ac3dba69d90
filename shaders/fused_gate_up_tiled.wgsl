// Fused gate+up projection for prefill, GEMM style with register blocking:
// y[t, j] = act(x[t]·w[j]) * (x[t]·w[n + j]). A 16x16 workgroup owns a tile of
// 16·TM token rows by 16·TN features; per k-step of TK it stages the x tile and the
// matching gate and up weight tiles in workgroup memory (zero-padded at the edges),
// then every invocation accumulates TM x TN gate and up sums in registers (rows
// ly + 16i, features lx + 16j) and applies the activation product at the end.
// Any shape; weights as u32 words decoded by W_F16. Includes: act.wgsl, wload.wgsl.

override TM: u32 = 2;  // token rows per invocation (<= 4)
override TN: u32 = 2;  // features per invocation (<= 4)
override TK: u32 = 16; // k per stage
override W_F16: bool = false;

override BM: u32 = 16u * TM;
override BN: u32 = 16u * TN;

struct Dims { rows: u32, n: u32, k: u32, act: u32 } // act: 0 silu, 1 gelu_tanh

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

var<workgroup> xs: array<f32, 16u * TM * TK>;
var<workgroup> gs: array<f32, 16u * TN * TK>;
var<workgroup> us: array<f32, 16u * TN * TK>;

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
    for (var k0 = 0u; k0 < k; k0 += TK) {
        for (var e = tid; e < BM * TK; e += 256u) {
            let r = e / TK;
            let c = e % TK;
            let gr = m0 + r;
            let gc = k0 + c;
            xs[e] = select(0.0, x[min(gr, rows - 1u) * k + min(gc, k - 1u)], gr < rows && gc < k);
        }
        for (var e = tid; e < BN * TK; e += 256u) {
            let r = e / TK;
            let c = e % TK;
            let j = n0 + r;
            let gc = k0 + c;
            let ok = j < n && gc < k;
            let jj = min(j, n - 1u);
            let cc = min(gc, k - 1u);
            gs[e] = select(0.0, wload(jj * k + cc), ok);
            us[e] = select(0.0, wload((n + jj) * k + cc), ok);
        }
        workgroupBarrier();
        for (var c = 0u; c < TK; c++) {
            var a: array<f32, 4>;
            var bg: array<f32, 4>;
            var bu: array<f32, 4>;
            for (var i = 0u; i < TM; i++) { a[i] = xs[(lid.y + 16u * i) * TK + c]; }
            for (var j = 0u; j < TN; j++) {
                bg[j] = gs[(lid.x + 16u * j) * TK + c];
                bu[j] = us[(lid.x + 16u * j) * TK + c];
            }
            for (var i = 0u; i < TM; i++) {
                for (var j = 0u; j < TN; j++) {
                    ag[i * TN + j] += a[i] * bg[j];
                    au[i * TN + j] += a[i] * bu[j];
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
