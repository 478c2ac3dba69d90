// Prefill attention, second generation of the flash form: the body shared by the
// subgroup and the workgroup-memory forms (`shader!(head
// "attention_dims.wgsl"; "flash2.wgsl", FORM, "attention.wgsl",
// "wload.wgsl")`); each form, attention_prefill_flash2_sg.wgsl or
// attention_prefill_flash2.wgsl, supplies the four row collectives this body
// calls (`lanes_scatter`, `lanes_max`, `lanes_sum`, `share_p`/`p_of`).
//
// Workgroup (query block, KV head, head sub-block): BQ consecutive query tokens times
// GH query heads of one GQA group, so a K/V row read (or staged) once serves every
// head of the group the workgroup holds. Each (token, head) query row belongs to
// LANES invocations (`flat` = row * LANES + lane; the rows of a subgroup are whole)
// that split head_dim: lane takes the 16-byte cache words lane, lane + LANES, ..
// (NW at most), holds its slice of the pre-scaled query row in registers and
// accumulates those output columns. Per tile of BKV keys, LANES keys at a time:
// every lane computes its partial dot with each of the LANES keys, then a
// reduce-scatter over the row's lanes leaves lane c with the full score of key c
// (LANES - 1 exchanges per LANES keys, where an all-reduce per key needs
// log2(LANES) each); the lane keeps the BKV / LANES scores it owns in registers.
// Online softmax with one exponential per score: the tile maximum first (one row
// reduction), then exp(m_old - m_new) once per tile rescales the accumulators and
// exp(s - m_new) once per score gives the probabilities; each lane keeps a partial
// denominator of its own keys, summed over the row at the end. P·V: each key's
// probability is fetched from the lane that owns it.
// K/V rows come from workgroup memory (STAGE: tiles of BKV rows, row stride RW + PAD
// words; PAD = 1 starts consecutive rows in different banks, for adapters where
// the lanes' reads of one row are split into phases that meet other rows) or
// straight from the cache (rows past the block's last position are never read
// either way).
// Query at token i has position kv_len - tokens + i and sees keys (pos - window,
// pos], and the whole bidirectional block [b0, b1) when pos lies in it (key_lo,
// key_hi); query head h reads KV head h / (heads / kv_heads).
// K/V are u32 words decoded by W_F16 (vec4<u32> = 4 f32 or 8 packed f16); the host
// specialises HD, RW (= HD / 4 or HD / 8 words per row), NW (= ceil(RW / LANES) <= 8),
// BKV / LANES <= 16, PAD (0 or 1), TILE (BKV * (RW + PAD), or 1 without staging).
// Bindings: q@0 k_cache@1 v_cache@2 out@3 dims@4; the uniform's own word is nsub.
// Head: attention_dims.wgsl (W_F16, Dims). Includes: attention.wgsl,
// wload.wgsl.
// Requires: attention_dims.wgsl, attention.wgsl.

override BQ: u32 = 8;
override GH: u32 = 4;
override BKV: u32 = 32;
override LANES: u32 = 8;
override HD: u32 = 64;
override RW: u32 = 16;
override NW: u32 = 2;
override STAGE: bool = true;
override PAD: u32 = 0;
override TILE: u32 = 544;

@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;

var<workgroup> kvt: array<vec4<u32>, TILE>;

// Workgroups per KV head along y (head sub-blocks of GH heads): the uniform's own word.
fn nsub() -> u32 {
    return dims.own;
}

// Stages cache rows t0 .. t0 + BKV of K or V (rows past `last` as zeros) in `kvt`:
// an invocation's share rounded up, a loop of constant trip count whose loads have
// no branch (a row past `last` loads word 0 and drops it), so it can be unrolled
// with every load in flight before the first store.
fn stage_tile(is_v: bool, base: u32, t0: u32, last: u32, tid: u32) {
    let wg = BQ * GH * LANES;
    for (var t = 0u; t < (BKV * RW + wg - 1u) / wg; t++) {
        let idx = tid + t * wg;
        let c = idx / RW;
        let x = idx % RW;
        let ok = t0 + c <= last;
        let gi = select(0u, (base + t0 + c) * RW + x, ok);
        var w: vec4<u32>;
        if (is_v) {
            w = vc[gi];
        } else {
            w = kc[gi];
        }
        if (idx < BKV * RW) {
            kvt[c * (RW + PAD) + x] = select(vec4<u32>(0u), w, ok);
        }
    }
}

// Word x of key row j (tile row c = j - t0): from the tile, or from the cache.
fn kv_word(is_v: bool, base: u32, j: u32, c: u32, x: u32) -> vec4<u32> {
    if (STAGE) {
        return kvt[c * (RW + PAD) + x];
    }
    if (is_v) {
        return vc[(base + j) * RW + x];
    }
    return kc[(base + j) * RW + x];
}

fn flash2(wid: vec3<u32>, tid: u32, flat: u32) {
    let group = dims.heads / dims.kv_heads;
    let kh = wid.y / nsub();
    let g0 = (wid.y % nsub()) * GH;
    let r = flat / LANES;
    let lane = flat % LANES;
    let ti = r / GH;
    let g = r % GH;
    let h = kh * group + g0 + g;
    let heads = dims.heads;
    let past = dims.kv_len - dims.tokens;
    let i0 = wid.x * BQ;
    let ntok = min(BQ, dims.tokens - i0);
    let valid = ti < ntok && g0 + g < group;
    let hd4 = HD / 4u;

    // this row's visible keys [span.x, span.y], the block's [klo, khi]
    let span = key_span(past + i0 + min(ti, ntok - 1u), past + i0, past + i0 + ntok - 1u);
    let klo = span.z;
    let khi = span.w;
    let base = kh * dims.kv_cap;

    // the lane's query words, pre-scaled (.x elements 0..4, .y 4..8 of an f16 word)
    var qa: array<vec4<f32>, 8>;
    var qb: array<vec4<f32>, 8>;
    var acc_a: array<vec4<f32>, 8>;
    var acc_b: array<vec4<f32>, 8>;
    let qrow = ((i0 + min(ti, ntok - 1u)) * heads + h) * hd4;
    for (var k = 0u; k < NW; k++) {
        let x = lane + k * LANES;
        var a = vec4<f32>(0.0);
        var b = vec4<f32>(0.0);
        if (valid && x < RW) {
            let qi = qrow + wx16(x);
            a = q[qi.x] * dims.scale;
            if (W_F16) {
                b = q[qi.y] * dims.scale;
            }
        }
        qa[k] = a;
        qb[k] = b;
        acc_a[k] = vec4<f32>(0.0);
        acc_b[k] = vec4<f32>(0.0);
    }

    var m = NEG;
    var l = 0.0;
    for (var t0 = klo; t0 <= khi; t0 += BKV) {
        if (STAGE) {
            workgroupBarrier();
            stage_tile(false, base, t0, khi, tid);
            workgroupBarrier();
        }
        // scores: lane owns keys t0 + gi * LANES + lane
        var sc: array<f32, 16>;
        var mt = NEG;
        for (var gi = 0u; gi < BKV / LANES; gi++) {
            var v: array<f32, 16>;
            for (var kk = 0u; kk < LANES; kk++) {
                let c = gi * LANES + kk;
                var a = 0.0;
                if (t0 + c <= khi) {
                    for (var k = 0u; k < NW; k++) {
                        let x = lane + k * LANES;
                        if (x < RW) {
                            a += wdot16(kv_word(false, base, t0 + c, c, x), qa[k], qb[k]);
                        }
                    }
                }
                v[kk] = a;
            }
            let s_full = lanes_scatter(v, flat);
            let j = t0 + gi * LANES + lane;
            var s = NEG;
            if (valid && j >= span.x && j <= span.y) {
                s = s_full;
            }
            sc[gi] = s;
            mt = max(mt, s);
        }
        let m_new = max(m, lanes_max(mt, flat));
        let alpha = exp(m - m_new);
        l *= alpha;
        for (var k = 0u; k < NW; k++) {
            acc_a[k] *= alpha;
            acc_b[k] *= alpha;
        }
        m = m_new;
        for (var gi = 0u; gi < BKV / LANES; gi++) {
            var p = 0.0;
            if (sc[gi] > -1.0e38) {
                p = exp(sc[gi] - m_new);
            }
            sc[gi] = p;
            l += p;
        }
        share_p(sc, r, lane);
        if (STAGE) {
            workgroupBarrier();
            stage_tile(true, base, t0, khi, tid);
            workgroupBarrier();
        }
        for (var gi = 0u; gi < BKV / LANES; gi++) {
            for (var kk = 0u; kk < LANES; kk++) {
                let c = gi * LANES + kk;
                let p = p_of(sc[gi], r, flat, c, kk);
                if (t0 + c <= khi) {
                    for (var k = 0u; k < NW; k++) {
                        let x = lane + k * LANES;
                        if (x < RW) {
                            let w = kv_word(true, base, t0 + c, c, x);
                            acc_a[k] += p * wlo4(w);
                            if (W_F16) {
                                acc_b[k] += p * whi4(w);
                            }
                        }
                    }
                }
            }
        }
    }

    let inv = 1.0 / lanes_sum(l, flat);
    if (valid) {
        for (var k = 0u; k < NW; k++) {
            let x = lane + k * LANES;
            if (x < RW) {
                let oi = qrow + wx16(x);
                out[oi.x] = acc_a[k] * inv;
                if (W_F16) {
                    out[oi.y] = acc_b[k] * inv;
                }
            }
        }
    }
}
