// Greedy selection on the GPU: the argmax of the logits row, so that a decode
// step reads back 8 bytes instead of the vocabulary's logits. `argmax`: one
// workgroup per LM-head block; out[2 * block] = the vocabulary index of its
// largest logit (0xffffffff when every logit is NaN), out[2 * block + 1] = the
// logit's bits (softcapped as the host softcaps: tanh(v / cap) * cap when cap >
// 0). `argmax_blocks` (a head split in blocks): one invocation combines the
// blocks' pairs into out[2 * blocks], out[2 * blocks + 1]. Ties go to the FIRST
// index and NaN never wins, as runtime::argmax on the host; when the first logit
// is NaN the pick is (0, NaN): the host scan never moves off a NaN at index 0.

override WG: u32 = 256;

struct Sel {
    rows: u32,   // logits in the block (argmax_blocks: the blocks)
    block: u32,  // the block's slot in `out`
    cap: f32,    // final logit softcapping (0: none)
    start: u32,  // the block's first vocabulary row
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<uniform> sel: Sel;

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

const NONE: u32 = 0xffffffffu;

// NaN by its bits (a compiler may assume `v != v` false).
fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

// Whether candidate (v, i) beats (bv, bi): larger, or equal at a smaller index.
fn beats(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    if (i == NONE) {
        return false;
    }
    if (bi == NONE) {
        return true;
    }
    return v > bv || (v == bv && i < bi);
}

@compute @workgroup_size(WG)
fn argmax(@builtin(local_invocation_index) lid: u32) {
    var bv = 0.0;
    var bi = NONE;
    for (var i = lid; i < sel.rows; i += WG) {
        var v = logits[i];
        if (is_nan(v)) {
            continue;
        }
        if (sel.cap > 0.0) {
            // |x| >= 20 gives tanh = +-1 in f32 anyway; clamped, no overflow inside tanh.
            v = tanh(clamp(v / sel.cap, -20.0, 20.0)) * sel.cap;
        }
        // Strided in increasing i: a later equal value never replaces.
        if (beats(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s && beats(best_v[lid + s], best_i[lid + s], best_v[lid], best_i[lid])) {
            best_v[lid] = best_v[lid + s];
            best_i[lid] = best_i[lid + s];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        if (sel.start == 0u && sel.rows > 0u && is_nan(logits[0])) {
            out[0] = 0u;
            out[1] = bitcast<u32>(logits[0]);
        } else {
            out[2u * sel.block] = select(best_i[0] + sel.start, NONE, best_i[0] == NONE);
            out[2u * sel.block + 1u] = bitcast<u32>(best_v[0]);
        }
    }
}

@group(0) @binding(1) var<storage, read_write> picks: array<u32>;
@group(0) @binding(2) var<uniform> blocks: Sel;

// The blocks' pairs (in vocabulary order) into the pair after them.
@compute @workgroup_size(1)
fn argmax_blocks() {
    let n = blocks.rows;
    var bi = NONE;
    var bv = 0.0;
    for (var k = 0u; k < n; k++) {
        let i = picks[2u * k];
        let v = bitcast<f32>(picks[2u * k + 1u]);
        if (k == 0u && i == 0u && is_nan(v)) {
            bi = 0u;
            bv = v;
            break;
        }
        if (beats(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    picks[2u * n] = bi;
    picks[2u * n + 1u] = bitcast<u32>(bv);
}
