// Greedy selection on the GPU: the argmax of the logits row, so that a decode
// step reads back 8 bytes instead of the vocabulary's logits. `argmax`: one
// workgroup per LM-head block; out[2 * block] = the vocabulary index of its
// largest logit (0xffffffff for an empty block), out[2 * block + 1] = that
// logit's order key. `argmax_blocks` (a head split in blocks): one invocation
// combines the blocks' pairs into out[2 * blocks], out[2 * blocks + 1].
// The rule is the sampler's `kernels::sample::argmax` (runtime::argmax), with
// the values compared as integers so that no compiler's float assumptions reach
// it: each logit (softcapped first as the host softcaps: tanh(v / cap) * cap
// when cap > 0) is made canonical by its bits, NaN as -inf and zero or subnormal
// as +0 (`canon`), then mapped to an unsigned key in the same order
// (`value_key`, 0 never a logit's); the largest key wins, the FIRST index on ties.
// Requires: argmax_wg.wgsl, softcap.wgsl.

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

var<workgroup> red_a: array<u32, WG>;
var<workgroup> red_b: array<u32, WG>;

const NONE: u32 = 0xffffffffu;

// As kernels::sample::canon and value_key (sample.wgsl): NaN -> -inf, zero and
// subnormals -> +0, then an unsigned key in the values' order (> 0).
fn logit_key(b: u32) -> u32 {
    var c = b;
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        c = 0xff800000u;
    } else if ((b & 0x7f800000u) == 0u) {
        c = 0u;
    }
    return select(c | 0x80000000u, ~c, (c & 0x80000000u) != 0u);
}

@compute @workgroup_size(WG)
fn argmax(@builtin(local_invocation_index) lid: u32) {
    var bk = 0u;
    var bi = NONE;
    for (var i = lid; i < sel.rows; i += WG) {
        let k = logit_key(softcap_bits(bitcast<u32>(logits[i]), sel.cap));
        // Strided in increasing i: a later equal key never replaces.
        if (beats(k, i, bk, bi)) {
            bk = k;
            bi = i;
        }
    }
    let best = wg_argmax(lid, bk, bi);
    if (lid == 0u) {
        out[2u * sel.block] = select(best.y + sel.start, NONE, best.y == NONE);
        out[2u * sel.block + 1u] = best.x;
    }
}

@group(0) @binding(1) var<storage, read_write> picks: array<u32>;
@group(0) @binding(2) var<uniform> blocks: Sel;

// The blocks' pairs (in vocabulary order) into the pair after them.
@compute @workgroup_size(1)
fn argmax_blocks() {
    let n = blocks.rows;
    var bi = NONE;
    var bk = 0u;
    for (var k = 0u; k < n; k++) {
        let i = picks[2u * k];
        let key = picks[2u * k + 1u];
        if (beats(key, i, bk, bi)) {
            bk = key;
            bi = i;
        }
    }
    picks[2u * n] = bi;
    picks[2u * n + 1u] = bk;
}
