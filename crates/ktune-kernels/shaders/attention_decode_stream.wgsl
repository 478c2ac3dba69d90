// Decode attention, one workgroup per query head streaming its KV head's cache.
// One query at position kv_len - 1 sees keys [lo, kv_len) (lo > 0 with a sliding
// window); cache rows at or past kv_len are never read.
// The cache is walked in tiles of WG * KPT keys: every invocation scores KPT keys
// (a whole K row each, 16-byte loads, q pre-scaled in workgroup memory), the
// workgroup reduces the tile maximum and rescales its running softmax state, then
// accumulates P·V with V rows read coalesced: VL invocations per row, one 16-byte
// load each, NS = WG / VL rows in flight. The NS row slices are summed at the end.
// K/V are u32 words decoded by W_F16: one vec4<u32> holds 4 f32 or 8 packed f16,
// so head_dim % 4 == 0 (f32) or % 8 == 0 (f16), checked on the host. HD is the
// head dimension, specialised by the host; WG must be a power of two.
// Heads: attention_decode_head.wgsl (WG, HD), attention_dims.wgsl (W_F16, Dims).
// Includes: attention.wgsl, reduce_wg.wgsl (the trees), wload.wgsl (W_F16, 16-byte
// words).
// Requires: attention_decode_head.wgsl, attention_dims.wgsl, attention.wgsl, position.wgsl, reduce_wg.wgsl.

override KPT: u32 = 2;

@group(0) @binding(3) var<storage, read_write> out: array<f32>;

var<workgroup> qs: array<vec4<f32>, HD / 4u>;
var<workgroup> sc: array<f32, WG * KPT>;
var<workgroup> partial: array<f32, WG>;
var<workgroup> comb: array<vec4<f32>, WG * 2u>;

// Scaled q · K[row].
fn score(row: u32) -> f32 {
    let n = wwords16(HD);
    let base = row * n;
    var s = vec4<f32>(0.0);
    for (var c = 0u; c < n; c++) {
        let qi = wx16(c);
        s += wmul16(kc[base + c], qs[qi.x], qs[qi.y]);
    }
    return s.x + s.y + s.z + s.w;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let h = wid.x + wid.y * nwg.x;
    if (h >= dims.heads) {
        return;
    }
    let kh = kv_head(h, dims.heads, dims.kv_heads);
    let hi = position.kv_len;
    let lo = first_key(hi - 1u, dims.window);
    for (var i = tid; i < HD / 4u; i += WG) {
        qs[i] = q[h * (HD / 4u) + i] * dims.scale;
    }
    workgroupBarrier();

    let rs = row_split(tid);
    let base = kh * dims.kv_cap;
    var m = NEG;
    var l = 0.0;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    for (var t0 = lo; t0 < hi; t0 += WG * KPT) {
        // scores of this tile and the tile maximum
        var tmax = NEG;
        for (var r = 0u; r < KPT; r++) {
            let c = r * WG + tid;
            var s = NEG;
            if (t0 + c < hi) {
                s = score(base + t0 + c);
            }
            sc[c] = s;
            tmax = max(tmax, s);
        }
        let tile_max = row_max(tmax, tid);
        // online softmax: rescale the running state, scores become probabilities
        let m_new = max(m, tile_max);
        let alpha = exp(m - m_new);
        l *= alpha;
        for (var r = 0u; r < KPT; r++) {
            let c = r * WG + tid;
            let p = select(0.0, exp(sc[c] - m_new), t0 + c < hi);
            sc[c] = p;
            l += p;
        }
        workgroupBarrier();
        acc0 *= alpha;
        acc1 *= alpha;
        let n = min(WG * KPT, hi - t0);
        if (rs.slice < rs.ns) {
            for (var c = rs.slice; c < n; c += rs.ns) {
                let p = sc[c];
                let w = vc[(base + t0 + c) * rs.vl + rs.lane];
                acc0 += p * wlo4(w);
                if (W_F16) {
                    acc1 += p * whi4(w);
                }
            }
        }
        m = m_new;
        workgroupBarrier();
    }

    // softmax denominator: sum of the per-invocation partials
    let inv = 1.0 / row_sum(l, tid);
    // sum the NS row slices
    if (rs.slice < rs.ns) {
        comb[2u * tid] = acc0;
        comb[2u * tid + 1u] = acc1;
    }
    workgroupBarrier();
    if (tid < rs.vl) {
        var a0 = vec4<f32>(0.0);
        var a1 = vec4<f32>(0.0);
        for (var s = 0u; s < rs.ns; s++) {
            a0 += comb[2u * (s * rs.vl + tid)];
            a1 += comb[2u * (s * rs.vl + tid) + 1u];
        }
        let o = h * HD + tid * word_elems();
        for (var e = 0u; e < word_elems(); e++) {
            out[o + e] = word_elem(a0, a1, e) * inv;
        }
    }
}
