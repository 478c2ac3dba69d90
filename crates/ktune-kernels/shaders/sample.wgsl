// The token sampler (kernels/sample/mod.rs describes the chain and why this file
// and the CPU take the same decisions): Philox4x32-10 from u32 arithmetic, the
// integer weights, canonical logits and integer order keys mirror the CPU's
// functions of the same names. Entry points: `prep` (canonical logits into the
// scratch), `penalty` (one workgroup), `pick` (one workgroup: the id, the step,
// the history), and `probe` (the primitives over many inputs, for the tests).
// Requires: argmax_wg.wgsl.

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;
const NEG_INF: u32 = 0xff800000u;
const Q24: u32 = 16777216u;

struct Params {
    vocab: u32,
    top_k: u32,
    greedy: u32,
    top_p_q: u32,
    seed_lo: u32,
    seed_hi: u32,
    last_n: u32,
    _pad: u32,
    neg_scale_p: f32,
    neg_scale_t: f32,
    ln_min_p: f32,
    penalty: f32,
    inv_penalty: f32,
}

@group(0) @binding(0) var<storage, read> logits: array<u32>;
// Canonical logits (the penalty applied), as bits; `probe`'s inputs.
@group(0) @binding(1) var<storage, read_write> xs: array<u32>;
// step, history length, head, capacity, then the history ring.
@group(0) @binding(2) var<storage, read_write> state: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
@group(0) @binding(4) var<uniform> P: Params;

// ---- the primitives (mirrors of the CPU's) ----

// (high, low) words of a * b, from 16-bit halves.
fn mulhilo(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let p11 = a1 * b1;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    let hi = p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u);
    return vec2<u32>(hi, a * b);
}

fn philox(ctr: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    var x = ctr;
    var k = key;
    for (var r = 0u; r < 10u; r++) {
        let p0 = mulhilo(0xD2511F53u, x.x);
        let p1 = mulhilo(0xCD9E8D57u, x.z);
        x = vec4<u32>(p1.x ^ x.y ^ k.x, p1.y, p0.x ^ x.w ^ k.y, p0.y);
        k = k + vec2<u32>(0x9E3779B9u, 0xBB67AE85u);
    }
    return x;
}

fn exp2_neg_q31(f: u32) -> u32 {
    if (f == 0u) {
        return 0x80000000u;
    }
    var c = array<u32, 9>(1073741824u, 744261118u, 257941248u, 59597083u, 10327387u, 1431680u, 165394u, 16377u, 1419u);
    let t = (65536u - f) << 16u;
    var p = c[8];
    for (var k = 7i; k >= 0i; k--) {
        p = c[k] + mulhilo(p, t).x;
    }
    return p;
}

fn weight(d: f32, neg_scale: f32) -> u32 {
    let p = d * neg_scale;
    if (!(p < 1572864.0)) {
        return 0u;
    }
    let q = u32(p);
    return exp2_neg_q31(q & 0xffffu) >> ((q >> 16u) + 7u);
}

fn canon(b: u32) -> u32 {
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return NEG_INF;
    }
    if ((b & 0x7f800000u) == 0u) {
        return 0u;
    }
    return b;
}

fn value_key(b: u32) -> u32 {
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn penalize(b: u32) -> u32 {
    let x = bitcast<f32>(b);
    var y: f32;
    if (x > 0.0) {
        y = x * P.inv_penalty;
    } else {
        y = x * P.penalty;
    }
    return canon(bitcast<u32>(y));
}

// u64 as (low, high).
fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn lt64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.y < b.y || (a.y == b.y && a.x < b.x);
}

// ---- prep and penalty ----

@compute @workgroup_size(WG)
fn prep(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * WG + lid;
    if (i < P.vocab) {
        xs[i] = canon(logits[i]);
    }
}

@compute @workgroup_size(WG)
fn penalty(@builtin(local_invocation_index) lid: u32) {
    let len = min(state[1], P.last_n);
    for (var j = lid; j < len; j += WG) {
        let id = state[4u + j];
        if (id >= P.vocab) {
            continue;
        }
        var first = true;
        for (var e = 0u; e < j; e++) {
            if (state[4u + e] == id) {
                first = false;
                break;
            }
        }
        if (first) {
            xs[id] = penalize(xs[id]);
        }
    }
}

// ---- pick ----

var<workgroup> red_a: array<u32, WG>;
var<workgroup> red_b: array<u32, WG>;
var<workgroup> hist_n: array<atomic<u32>, 256>;
var<workgroup> hist_lo: array<atomic<u32>, 256>;
var<workgroup> hist_hi: array<atomic<u32>, 256>;
var<workgroup> s_u0: u32;
var<workgroup> s_u1: u32;
var<workgroup> s_u2: u32;
var<workgroup> s_max: u32;
var<workgroup> s_done: u32;

var<private> g_max: f32;

// `x - max` with a subnormal difference as 0.
fn below_max(i: u32) -> f32 {
    return bitcast<f32>(canon(bitcast<u32>(bitcast<f32>(xs[i]) - g_max)));
}

// The order key's high word (value descending).
fn key_hi(i: u32) -> u32 {
    return ~value_key(xs[i]);
}

// Key (hi, index) <= cut (hi, index).
fn key_le(i: u32, cut: vec2<u32>) -> bool {
    let h = key_hi(i);
    return h < cut.x || (h == cut.x && i <= cut.y);
}

// The order key (hi, index) of the last token whose exclusive metric (count, or
// the weight at temperature 1) is below `limit` (a u64, at least 1).
fn select_cutoff(lid: u32, by_weight: bool, limit: vec2<u32>) -> vec2<u32> {
    var pre = vec2<u32>(0u, 0u);
    var acc = vec2<u32>(0u, 0u);
    for (var r = 0u; r < 8u; r++) {
        let shift = select(24u - 8u * r, 56u - 8u * r, r >= 4u);
        if (r >= 4u && ((P.vocab - 1u) >> shift) == 0u) {
            continue;
        }
        // the bits above this digit must match the prefix
        let mh = select(select(0u, 0xffffffffu << (32u - 8u * r), r > 0u), 0xffffffffu, r >= 4u);
        let ml = select(0u, 0xffffffffu << (64u - 8u * r), r > 4u);
        atomicStore(&hist_n[lid], 0u);
        atomicStore(&hist_lo[lid], 0u);
        atomicStore(&hist_hi[lid], 0u);
        workgroupBarrier();
        for (var i = lid; i < P.vocab; i += WG) {
            let h = key_hi(i);
            if ((h & mh) == (pre.x & mh) && (i & ml) == (pre.y & ml)) {
                let dg = select((h >> shift) & 255u, (i >> shift) & 255u, r >= 4u);
                atomicAdd(&hist_n[dg], 1u);
                if (by_weight) {
                    let w = weight(below_max(i), P.neg_scale_p);
                    atomicAdd(&hist_lo[dg], w & 0xfffu);
                    atomicAdd(&hist_hi[dg], w >> 12u);
                }
            }
        }
        workgroupBarrier();
        if (lid == 0u) {
            var run = acc;
            var best = 0u;
            var best_acc = acc;
            for (var b = 0u; b < 256u; b++) {
                let n = atomicLoad(&hist_n[b]);
                if (n == 0u) {
                    continue;
                }
                if (!lt64(run, limit)) {
                    break;
                }
                best = b;
                best_acc = run;
                var m = vec2<u32>(n, 0u);
                if (by_weight) {
                    let hi = atomicLoad(&hist_hi[b]);
                    m = add64(vec2<u32>(hi << 12u, hi >> 20u), vec2<u32>(atomicLoad(&hist_lo[b]), 0u));
                }
                run = add64(run, m);
            }
            s_u0 = best;
            s_u1 = best_acc.x;
            s_u2 = best_acc.y;
        }
        let b = workgroupUniformLoad(&s_u0);
        acc = vec2<u32>(workgroupUniformLoad(&s_u1), workgroupUniformLoad(&s_u2));
        if (r < 4u) {
            pre.x = pre.x | (b << shift);
        } else {
            pre.y = pre.y | (b << shift);
        }
    }
    return pre;
}

// Sums a u64 per invocation over the workgroup (red_a/red_b: low/high words).
fn reduce64(lid: u32, v: vec2<u32>) -> vec2<u32> {
    red_a[lid] = v.x;
    red_b[lid] = v.y;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let t = add64(vec2<u32>(red_a[lid], red_b[lid]), vec2<u32>(red_a[lid + s], red_b[lid + s]));
            red_a[lid] = t.x;
            red_b[lid] = t.y;
        }
        workgroupBarrier();
    }
    let total = vec2<u32>(red_a[0], red_b[0]);
    workgroupBarrier();
    return total;
}

// The id chosen: written out, the step advanced, the id appended to the history.
fn finish(id: u32) {
    out[0] = id;
    state[0] = state[0] + 1u;
    let cap = state[3];
    if (P.last_n > 0u && cap > 0u) {
        let head = state[2];
        state[4u + head] = id;
        state[2] = (head + 1u) % cap;
        state[1] = min(state[1] + 1u, cap);
    }
}

fn kept(i: u32, cut: vec2<u32>) -> bool {
    return key_le(i, cut) && below_max(i) >= P.ln_min_p;
}

@compute @workgroup_size(WG)
fn pick(@builtin(local_invocation_index) lid: u32) {
    let v = P.vocab;
    // the maximum's value key and first index
    var bk = 0u;
    var bi = NONE;
    for (var i = lid; i < v; i += WG) {
        let k = value_key(xs[i]);
        if (beats(k, i, bk, bi)) {
            bk = k;
            bi = i;
        }
    }
    let best = wg_argmax(lid, bk, bi).y;
    if (lid == 0u) {
        s_u0 = best;
        s_max = xs[best];
        let mx = bitcast<f32>(s_max);
        // greedy, or a maximum that is not finite: the first maximum
        s_done = select(0u, 1u, P.greedy != 0u || (s_max & 0x7f800000u) == 0x7f800000u);
        if (s_done != 0u) {
            finish(best);
        }
    }
    if (workgroupUniformLoad(&s_done) != 0u) {
        return;
    }
    let imax = workgroupUniformLoad(&s_u0);
    g_max = bitcast<f32>(workgroupUniformLoad(&s_max));
    // top-k
    var cut = vec2<u32>(NONE, NONE);
    if (P.top_k > 0u && P.top_k < v) {
        cut = select_cutoff(lid, false, vec2<u32>(P.top_k, 0u));
    }
    // top-p over the top-k tokens
    if (P.top_p_q < Q24) {
        var sum = vec2<u32>(0u, 0u);
        for (var i = lid; i < v; i += WG) {
            if (key_le(i, cut)) {
                sum = add64(sum, vec2<u32>(weight(below_max(i), P.neg_scale_p), 0u));
            }
        }
        let total = reduce64(lid, sum);
        // ceil(total * p / 2^24): a 96-bit product (words w0, w1, w2)
        let a = mulhilo(total.x, P.top_p_q);
        let b = mulhilo(total.y, P.top_p_q);
        let w0 = a.y;
        let mid = add64(vec2<u32>(a.x, 0u), vec2<u32>(b.y, 0u));
        let w1 = mid.x;
        let w2 = b.x + mid.y;
        let lo = add64(vec2<u32>(w0, w1), vec2<u32>(Q24 - 1u, 0u));
        let w2c = w2 + select(0u, 1u, lo.y < w1);
        var limit = vec2<u32>((lo.x >> 24u) | (lo.y << 8u), (lo.y >> 24u) | (w2c << 8u));
        if (limit.x == 0u && limit.y == 0u) {
            limit = vec2<u32>(1u, 0u);
        }
        let cp = select_cutoff(lid, true, limit);
        if (cp.x < cut.x || (cp.x == cut.x && cp.y < cut.y)) {
            cut = cp;
        }
    }
    // the draw: chunk sums in index order, one scan, one chunk walked
    let chunk = (v + WG - 1u) / WG;
    let start = min(lid * chunk, v);
    let end = min(start + chunk, v);
    var own = vec2<u32>(0u, 0u);
    for (var i = start; i < end; i++) {
        if (kept(i, cut)) {
            own = add64(own, vec2<u32>(weight(below_max(i), P.neg_scale_t), 0u));
        }
    }
    red_a[lid] = own.x;
    red_b[lid] = own.y;
    workgroupBarrier();
    if (lid == 0u) {
        var run = vec2<u32>(0u, 0u);
        for (var t = 0u; t < WG; t++) {
            let x = vec2<u32>(red_a[t], red_b[t]);
            red_a[t] = run.x;
            red_b[t] = run.y;
            run = add64(run, x);
        }
        // floor(r * total / 2^32)
        let r = philox(vec4<u32>(state[0], 0u, 0u, 0u), vec2<u32>(P.seed_lo, P.seed_hi)).x;
        let hi = mulhilo(r, run.y);
        let tgt = add64(vec2<u32>(hi.y, hi.x), vec2<u32>(mulhilo(r, run.x).x, 0u));
        s_u1 = tgt.x;
        s_u2 = tgt.y;
        s_u0 = imax;
    }
    workgroupBarrier();
    let tgt = vec2<u32>(s_u1, s_u2);
    var cum = vec2<u32>(red_a[lid], red_b[lid]);
    if ((own.x != 0u || own.y != 0u) && !lt64(tgt, cum) && lt64(tgt, add64(cum, own))) {
        for (var i = start; i < end; i++) {
            if (kept(i, cut)) {
                cum = add64(cum, vec2<u32>(weight(below_max(i), P.neg_scale_t), 0u));
                if (lt64(tgt, cum)) {
                    s_u0 = i;
                    break;
                }
            }
        }
    }
    workgroupBarrier();
    if (lid == 0u) {
        finish(s_u0);
    }
}

// ---- probe: the primitives over inputs xs[0..vocab), 8 words out per input ----

@compute @workgroup_size(WG)
fn probe(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= P.vocab) {
        return;
    }
    let x = xs[i];
    let y = xs[(i + 1u) % P.vocab];
    let r = philox(vec4<u32>(x, i, y, ~x), vec2<u32>(P.seed_lo, P.seed_hi));
    let m = mulhilo(x, y);
    out[8u * i] = r.x;
    out[8u * i + 1u] = r.y;
    out[8u * i + 2u] = r.z;
    out[8u * i + 3u] = r.w;
    out[8u * i + 4u] = m.x;
    out[8u * i + 5u] = m.y;
    // a weight of d = -|canon(x)| at both scales
    let d = -abs(bitcast<f32>(canon(x)));
    out[8u * i + 6u] = weight(d, P.neg_scale_p);
    out[8u * i + 7u] = weight(d, P.neg_scale_t);
}
