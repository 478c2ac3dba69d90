// One query row streaming its keys through a workgroup, shared by the kernels that
// give a query row a workgroup (attention_decode_stream: a decode query head over
// the head-major cache; attention_paged_stream: a query row of a paged batch over
// its sequence's blocks). The including shader defines `cache_row(kh, j)` (the
// cache row of key j of KV head kh: K and V rows of HD elements, wload.wgsl's
// 16-byte words), `out` and the override KPT; every invocation of the workgroup
// calls `stream_row` (it holds barriers).
// The keys are walked in tiles of WG * KPT: every invocation scores KPT keys (a
// whole K row each, 16-byte loads, q pre-scaled in workgroup memory), the workgroup
// reduces the tile maximum and rescales its running softmax state, then
// accumulates P·V with V rows read coalesced: VL invocations per row, one 16-byte
// load each, NS = WG / VL rows in flight. The NS row slices are summed at the end.
// Requires: attention_decode_head.wgsl, attention.wgsl, reduce_wg.wgsl, wload.wgsl.

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
        s += kv_mul16(k_word(base + c), qs[qi.x], qs[qi.y]);
    }
    return s.x + s.y + s.z + s.w;
}

// Query row `qr` of q (HD / 4 vec4 words a row) against keys [lo, hi) of KV head
// kh, its output into row `qr` of out.
fn stream_row(qr: u32, kh: u32, lo: u32, hi: u32, tid: u32) {
    for (var i = tid; i < HD / 4u; i += WG) {
        qs[i] = q[qr * (HD / 4u) + i] * dims.scale;
    }
    workgroupBarrier();

    let rs = row_split(tid);
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
                s = score(cache_row(kh, t0 + c));
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
                let w = v_word(cache_row(kh, t0 + c) * rs.vl + rs.lane);
                acc0 += p * w.lo;
                if (W_F16) {
                    acc1 += p * w.hi;
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
        let o = qr * HD + tid * word_elems();
        for (var e = 0u; e < word_elems(); e++) {
            out[o + e] = word_elem(a0, a1, e) * inv;
        }
    }
}
