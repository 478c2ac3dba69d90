// Decode attention, flash decoding: the visible key range [lo, kv_len) is cut into
// CHUNK-key splits, processed in parallel, then merged.
//
// `split` (workgroup (kv head, head subgroup) x split): the GH query heads of one
// GQA group that this workgroup owns read the KV head once. Every K row is loaded
// once (16-byte loads) and scored against all GH queries (pre-scaled in workgroup
// memory); the workgroup reduces the tile maxima of all heads at once (two vec4 of
// maxima per invocation), rescales each head's running state, then accumulates P·V
// for all GH heads from each V row (VL invocations per row, NS rows in flight).
// It writes each head's unnormalised partial output and its (max, sum) to `part`.
// `reduce` (one invocation per output element): merges the splits of its head,
// weighting split s by exp(m_s - max m).
//
// Bindings are unique across the module; each entry binds its subset:
//   split:  q@0 k_cache@1 v_cache@2 dims@4 part@5
//   reduce: out@3 dims@4 part@5
// `part` holds nsplit * heads * HD partial outputs, then at ml_off nsplit * heads
// (max, sum) pairs. K/V are u32 words decoded by W_F16 (vec4<u32> = 4 f32 or 8 f16).
// HD and GH (<= 8) are specialised by the host; WG must be a power of two.
// Heads: attention_decode_head.wgsl (WG, HD), attention_dims.wgsl (W_F16, Dims). Includes: attention.wgsl,
// wload.wgsl (W_F16, 16-byte words).
// Requires: attention_decode_head.wgsl, attention_dims.wgsl, attention.wgsl, position.wgsl.

override GH: u32 = 4;
override CHUNK: u32 = 256;

@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> part: array<f32>;

var<workgroup> qs: array<vec4<f32>, GH * HD / 4u>;
var<workgroup> sc: array<f32, GH * WG>;
var<workgroup> red: array<vec4<f32>, 2u * WG>;

// First key of the query (at position kv_len - 1).
fn first_key_decode() -> u32 {
    return first_key(position.kv_len - 1u, dims.window);
}

fn pick(a: vec4<f32>, b: vec4<f32>, g: u32) -> f32 {
    if (g < 4u) {
        return a[g];
    }
    return b[g - 4u];
}

@compute @workgroup_size(WG)
fn split(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let hb = head_block(wid.x, nsub(), GH, dims.heads, dims.kv_heads);
    let kh = hb.x;
    let h0 = hb.y;
    let ng = hb.z;
    let hd4 = HD / 4u;
    let s0 = first_key_decode() + wid.y * CHUNK;
    // The grid covers the cache's capacity: splits past the visible keys have nothing to do.
    if (s0 >= position.kv_len) {
        return;
    }
    let s1 = min(s0 + CHUNK, position.kv_len);

    for (var i = tid; i < GH * hd4; i += WG) {
        let g = i / hd4;
        var v = vec4<f32>(0.0);
        if (g < ng) {
            v = q[(h0 + g) * hd4 + i % hd4] * dims.scale;
        }
        qs[i] = v;
    }
    workgroupBarrier();

    let rs = row_split(tid);
    let base = kh * dims.kv_cap;
    var m: array<f32, 8>;
    var l: array<f32, 8>;
    var acc: array<vec4<f32>, 16>;
    for (var g = 0u; g < 8u; g++) {
        m[g] = NEG;
        l[g] = 0.0;
        acc[2u * g] = vec4<f32>(0.0);
        acc[2u * g + 1u] = vec4<f32>(0.0);
    }

    for (var t0 = s0; t0 < s1; t0 += WG) {
        // one key per invocation, scored against every query head of the group
        let j = t0 + tid;
        var s: array<f32, 8>;
        for (var g = 0u; g < 8u; g++) {
            s[g] = NEG;
        }
        if (j < s1) {
            var sv: array<vec4<f32>, 8>;
            for (var g = 0u; g < GH; g++) {
                sv[g] = vec4<f32>(0.0);
            }
            let rb = (base + j) * rs.vl;
            for (var c = 0u; c < rs.vl; c++) {
                let w = kc[rb + c];
                for (var g = 0u; g < GH; g++) {
                    let qi = g * hd4 + wx16(c);
                    sv[g] += wmul16(w, qs[qi.x], qs[qi.y]);
                }
            }
            for (var g = 0u; g < GH; g++) {
                s[g] = sv[g].x + sv[g].y + sv[g].z + sv[g].w;
            }
        }
        red[2u * tid] = vec4<f32>(s[0], s[1], s[2], s[3]);
        red[2u * tid + 1u] = vec4<f32>(s[4], s[5], s[6], s[7]);
        workgroupBarrier();
        for (var st = WG / 2u; st > 0u; st >>= 1u) {
            if (tid < st) {
                red[2u * tid] = max(red[2u * tid], red[2u * (tid + st)]);
                red[2u * tid + 1u] = max(red[2u * tid + 1u], red[2u * (tid + st) + 1u]);
            }
            workgroupBarrier();
        }
        let ta = red[0];
        let tb = red[1];
        var alpha: array<f32, 8>;
        for (var g = 0u; g < GH; g++) {
            let mn = max(m[g], pick(ta, tb, g));
            alpha[g] = exp(m[g] - mn);
            m[g] = mn;
            let p = select(0.0, exp(s[g] - mn), j < s1);
            l[g] = l[g] * alpha[g] + p;
            sc[g * WG + tid] = p;
        }
        workgroupBarrier();
        for (var g = 0u; g < GH; g++) {
            acc[2u * g] *= alpha[g];
            acc[2u * g + 1u] *= alpha[g];
        }
        let n = min(WG, s1 - t0);
        if (rs.slice < rs.ns) {
            for (var c = rs.slice; c < n; c += rs.ns) {
                let w = vc[(base + t0 + c) * rs.vl + rs.lane];
                let a = wlo4(w);
                let b = whi4(w);
                for (var g = 0u; g < GH; g++) {
                    let p = sc[g * WG + c];
                    acc[2u * g] += p * a;
                    if (W_F16) {
                        acc[2u * g + 1u] += p * b;
                    }
                }
            }
        }
        workgroupBarrier();
    }

    // per-head softmax denominators: sum of the per-invocation partials
    red[2u * tid] = vec4<f32>(l[0], l[1], l[2], l[3]);
    red[2u * tid + 1u] = vec4<f32>(l[4], l[5], l[6], l[7]);
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st >>= 1u) {
        if (tid < st) {
            red[2u * tid] += red[2u * (tid + st)];
            red[2u * tid + 1u] += red[2u * (tid + st) + 1u];
        }
        workgroupBarrier();
    }
    let la = red[0];
    let lb = red[1];
    let heads = dims.heads;
    if (tid < ng) {
        let mi = ml_off() + (wid.y * heads + h0 + tid) * 2u;
        part[mi] = m[tid];
        part[mi + 1u] = pick(la, lb, tid);
    }
    // partial outputs, one head at a time: sum the NS row slices through `red`
    for (var g = 0u; g < GH; g++) {
        workgroupBarrier();
        if (rs.slice < rs.ns) {
            red[2u * tid] = acc[2u * g];
            red[2u * tid + 1u] = acc[2u * g + 1u];
        }
        workgroupBarrier();
        if (tid < rs.vl && g < ng) {
            var a0 = vec4<f32>(0.0);
            var a1 = vec4<f32>(0.0);
            for (var sl = 0u; sl < rs.ns; sl++) {
                a0 += red[2u * (sl * rs.vl + tid)];
                a1 += red[2u * (sl * rs.vl + tid) + 1u];
            }
            let o = (wid.y * heads + h0 + g) * HD + tid * word_elems();
            for (var e = 0u; e < word_elems(); e++) {
                part[o + e] = word_elem(a0, a1, e);
            }
        }
    }
}

@compute @workgroup_size(WG)
fn reduce(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * WG;
    let heads = dims.heads;
    if (idx >= heads * HD) {
        return;
    }
    let h = idx / HD;
    let keys = position.kv_len - first_key_decode();
    let nsplit = (keys + CHUNK - 1u) / CHUNK;
    var mx = NEG;
    for (var s = 0u; s < nsplit; s++) {
        mx = max(mx, part[ml_off() + (s * heads + h) * 2u]);
    }
    var den = 0.0;
    var num = 0.0;
    for (var s = 0u; s < nsplit; s++) {
        let mi = ml_off() + (s * heads + h) * 2u;
        let w = exp(part[mi] - mx);
        den += w * part[mi + 1u];
        num += w * part[s * heads * HD + idx];
    }
    out[idx] = num / den;
}
