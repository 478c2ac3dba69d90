// Bidirectional attention (every query sees every key; the SigLIP encoder), flash
// style: a workgroup holds BQ consecutive queries of one head (one invocation per
// query row, its pre-scaled query and its output accumulators in registers) and
// walks the keys in tiles of BKV rows that the workgroup stages, K and V, in
// workgroup memory (each row read from memory once per workgroup, not once per
// query). Online softmax per tile: the tile maximum, exp(m_old - m_new) rescales the
// running sum and accumulators once, exp(s - m_new) per score. q, k, v and out are
// [tokens, heads, head_dim] f32 read as vec4; the host specialises HD4 = head_dim / 4
// (at most 32) and BKV (at most 64). Grid: (query blocks, heads). Bindings:
// attention_full.wgsl.
// Requires: attention_full.wgsl.

override BQ: u32 = 16;
override BKV: u32 = 32;
override HD4: u32 = 16;

var<workgroup> kt: array<vec4<f32>, BKV * HD4>;
var<workgroup> vt: array<vec4<f32>, BKV * HD4>;

@compute @workgroup_size(BQ)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let t = dims.tokens;
    let heads = dims.heads;
    let h = wid.y;
    let qi = wid.x * BQ + tid;
    // rows past the last query compute on the last one and store nothing; they
    // still stage tiles and meet every barrier
    let qr = min(qi, t - 1u);
    var qv: array<vec4<f32>, 32>;
    var acc: array<vec4<f32>, 32>;
    for (var d = 0u; d < HD4; d++) {
        qv[d] = q[(qr * heads + h) * HD4 + d] * dims.scale;
        acc[d] = vec4<f32>(0.0);
    }
    var m = -3.0e38;
    var l = 0.0;
    for (var t0 = 0u; t0 < t; t0 += BKV) {
        workgroupBarrier();
        for (var e = tid; e < BKV * HD4; e += BQ) {
            let j = t0 + e / HD4;
            var kw = vec4<f32>(0.0);
            var vw = vec4<f32>(0.0);
            if (j < t) {
                let gi = (j * heads + h) * HD4 + e % HD4;
                kw = k[gi];
                vw = v[gi];
            }
            kt[e] = kw;
            vt[e] = vw;
        }
        workgroupBarrier();
        let n = min(BKV, t - t0);
        var s: array<f32, 64>;
        var mt = -3.0e38;
        for (var c = 0u; c < n; c++) {
            var a = 0.0;
            for (var d = 0u; d < HD4; d++) {
                a += dot(qv[d], kt[c * HD4 + d]);
            }
            s[c] = a;
            mt = max(mt, a);
        }
        let mn = max(m, mt);
        let r = exp(m - mn);
        l *= r;
        for (var d = 0u; d < HD4; d++) {
            acc[d] *= r;
        }
        for (var c = 0u; c < n; c++) {
            let p = exp(s[c] - mn);
            l += p;
            for (var d = 0u; d < HD4; d++) {
                acc[d] += p * vt[c * HD4 + d];
            }
        }
        m = mn;
    }
    if (qi < t) {
        let inv = 1.0 / l;
        for (var d = 0u; d < HD4; d++) {
            out[(qi * heads + h) * HD4 + d] = acc[d] * inv;
        }
    }
}
