// Decode attention, flash decoding with subgroup reductions: the visible key range
// [lo, kv_len) is cut into CHUNK-key partials, SPW of them per workgroup, each
// computed by one subgroup with no workgroup memory and no barriers.
//
// `split` (workgroup (kv head, head subgroup) x partial block): the GH query heads of
// one GQA group that this workgroup owns read the KV head once. A subgroup walks its
// partial one key row at a time: its lanes split the row's 16-byte words (lane c
// takes words c, c + subgroup size, ..: WPL words at most), so K and V loads of a
// row coalesce; each lane's dot products with the GH queries (held in registers,
// pre-scaled) become the scores through one subgroupAdd per 4 heads. The scores are
// uniform over the subgroup, so every lane keeps the same running (max, sum) per
// head and rescales its accumulators only when the maximum grows; P·V accumulates
// into the lane's own words. It writes each head's unnormalised partial output and
// its (max, sum) to `part`, the layout of attention_decode_splitkv.wgsl, whose
// `reduce` entry (run with the same CHUNK) merges the partials.
// A subgroup takes partials sg, sg + num_subgroups, .. < SPW of its workgroup's
// block: SPW = WG / the adapter's smallest subgroup size, so every lane is busy
// whatever size the driver picks.
//
// Bindings: q@0 k_cache@1 v_cache@2 dims@4 part@5 (binding 3, out, is the reduce's).
// `part` holds nparts * heads * HD partial outputs, then at ml_off nparts * heads
// (max, sum) pairs. K/V are u32 words decoded by W_F16 (vec4<u32> = 4 f32 or 8 f16).
// HD, GH (<= 8) and WPL (GH * WPL <= 16) are specialised by the host; needs SUBGROUP
// and a workgroup at least one subgroup wide.
// Heads: attention_decode_head.wgsl (WG, HD), attention_dims.wgsl (W_F16, Dims). Includes: attention.wgsl,
// wload.wgsl (W_F16, 16-byte words).
// Requires: attention_decode_head.wgsl, attention_dims.wgsl, attention.wgsl, position.wgsl.

override GH: u32 = 4;
override CHUNK: u32 = 64;
override SPW: u32 = 4;
override WPL: u32 = 1;

@group(0) @binding(5) var<storage, read_write> part: array<f32>;

@compute @workgroup_size(WG)
fn split(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32,
         @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sgs: u32) {
    let hb = head_block(wid.x, nsub(), GH, dims.heads, dims.kv_heads);
    let kh = hb.x;
    let h0 = hb.y;
    let ng = hb.z;
    let hd4 = HD / 4u;
    let vl = wwords16(HD);
    let heads = dims.heads;
    let lo = first_key(position.kv_len - 1u, dims.window);
    let base = kh * dims.kv_cap;

    // this lane's query words of every head, pre-scaled; slot g * WPL + i is word
    // lane + i * sgs of head g (.x elements 0..4, .y 4..8 of an f16 word)
    var qa: array<vec4<f32>, 16>;
    var qb: array<vec4<f32>, 16>;
    for (var g = 0u; g < GH; g++) {
        for (var i = 0u; i < WPL; i++) {
            let c = lane + i * sgs;
            var a = vec4<f32>(0.0);
            var b = vec4<f32>(0.0);
            if (g < ng && c < vl) {
                let qi = (h0 + g) * hd4 + wx16(c);
                a = q[qi.x] * dims.scale;
                b = q[qi.y] * dims.scale;
            }
            qa[g * WPL + i] = a;
            qb[g * WPL + i] = b;
        }
    }

    for (var vs = sg; vs < SPW; vs += nsg) {
        let pi = wid.y * SPW + vs;
        let s0 = lo + pi * CHUNK;
        if (s0 >= position.kv_len) {
            break;
        }
        let s1 = min(s0 + CHUNK, position.kv_len);
        var m: array<f32, 8>;
        var l: array<f32, 8>;
        var acc_a: array<vec4<f32>, 16>;
        var acc_b: array<vec4<f32>, 16>;
        for (var g = 0u; g < 8u; g++) {
            m[g] = NEG;
            l[g] = 0.0;
        }
        for (var r = 0u; r < 16u; r++) {
            acc_a[r] = vec4<f32>(0.0);
            acc_b[r] = vec4<f32>(0.0);
        }
        for (var j = s0; j < s1; j++) {
            let row = (base + j) * vl;
            // this lane's share of every head's score, then the subgroup's sums
            var sp: array<f32, 8>;
            for (var g = 0u; g < 8u; g++) {
                sp[g] = 0.0;
            }
            for (var i = 0u; i < WPL; i++) {
                let c = lane + i * sgs;
                if (c < vl) {
                    let w = kc[row + c];
                    for (var g = 0u; g < GH; g++) {
                        sp[g] += wdot16(w, qa[g * WPL + i], qb[g * WPL + i]);
                    }
                }
            }
            let ta = subgroupAdd(vec4<f32>(sp[0], sp[1], sp[2], sp[3]));
            var tb = vec4<f32>(0.0);
            if (GH > 4u) {
                tb = subgroupAdd(vec4<f32>(sp[4], sp[5], sp[6], sp[7]));
            }
            // online softmax, uniform over the subgroup
            var p: array<f32, 8>;
            for (var g = 0u; g < GH; g++) {
                var s = tb[(g - 4u) & 3u];
                if (g < 4u) {
                    s = ta[g];
                }
                if (s > m[g]) {
                    let alpha = exp(m[g] - s);
                    l[g] *= alpha;
                    for (var i = 0u; i < WPL; i++) {
                        acc_a[g * WPL + i] *= alpha;
                        acc_b[g * WPL + i] *= alpha;
                    }
                    m[g] = s;
                }
                p[g] = exp(s - m[g]);
                l[g] += p[g];
            }
            for (var i = 0u; i < WPL; i++) {
                let c = lane + i * sgs;
                if (c < vl) {
                    let w = vc[row + c];
                    let a = wlo4(w);
                    let b = whi4(w);
                    for (var g = 0u; g < GH; g++) {
                        acc_a[g * WPL + i] += p[g] * a;
                        if (W_F16) {
                            acc_b[g * WPL + i] += p[g] * b;
                        }
                    }
                }
            }
        }
        for (var g = 0u; g < ng; g++) {
            let ph = pi * heads + h0 + g;
            if (lane == 0u) {
                part[ml_off() + ph * 2u] = m[g];
                part[ml_off() + ph * 2u + 1u] = l[g];
            }
            for (var i = 0u; i < WPL; i++) {
                let c = lane + i * sgs;
                if (c < vl) {
                    let o = ph * HD + c * word_elems();
                    for (var e = 0u; e < word_elems(); e++) {
                        part[o + e] = word_elem(acc_a[g * WPL + i], acc_b[g * WPL + i], e);
                    }
                }
            }
        }
    }
}
