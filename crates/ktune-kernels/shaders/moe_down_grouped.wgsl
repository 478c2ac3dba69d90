// The experts' down projections grouped by expert (Op::MoeDown, the prefill
// form), first of two passes: workgroup (wid.x, e) owns ROWS features of expert e
// and walks the tokens routed to it TT at a time (moe_tokens.wgsl); every
// invocation strides over the units of e's rows of its ROWS features, each unit
// read and decoded once for all TT tokens of the tile against their slot's
// activations h[t, slot], into register accumulators; one workgroup reduction per
// tile, each token's product weighted by its route into its slot's row of `out`
// (the kernel's scratch, [rows * top_k, n]; the slots past a token's experts
// are never read). The second pass (moe_down_sum.wgsl) sums a token's slots.
// Includes: moe_wq.wgsl or moe_wf.wgsl (interface), moe_tokens.wgsl, the weight
// decoding (qblock.wgsl + qgeom.wgsl, or wload.wgsl), reduce_wg.wgsl.

override WG: u32 = 64;
override ROWS: u32 = 2;
override TT: u32 = 4;
override QFMT: u32 = 0u;
override W_F16: bool = false;

var<workgroup> partial: array<f32, WG * ROWS * TT>;
var<workgroup> toks: array<u32, TT>;
var<workgroup> slots: array<u32, TT>;
var<workgroup> ntok: u32;
var<workgroup> cursor: u32;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let f0 = wid.x * ROWS;
    let e = wid.y;
    let n = dims.n;
    let units = row_units();
    let last = n - 1u;
    let kv = dims.k / 4u;
    // Workgroup memory is not zeroed for us: the walk starts at the first token.
    if (tid == 0u) {
        cursor = 0u;
    }
    loop {
        let m = next_tokens(tid, e);
        if (m == 0u) {
            break;
        }
        // Feature r, token i at r TT + i.
        var acc: array<f32, 32>;
        for (var wi = tid; wi < units; wi += WG) {
            for (var r = 0u; r < ROWS; r++) {
                let u = unit_of(e * n + min(f0 + r, last), wi);
                for (var i = 0u; i < m; i++) {
                    acc[r * TT + i] += unit_dot(u, (toks[i] * dims.top_k + slots[i]) * kv);
                }
            }
        }
        for (var q = 0u; q < ROWS * TT; q++) {
            partial[q * WG + tid] = acc[q];
        }
        wg_sum_rows(tid, ROWS * TT);
        if (tid < ROWS * TT) {
            let r = tid / TT;
            let i = tid % TT;
            if (i < m && f0 + r < n) {
                let t = toks[i];
                out[(t * dims.top_k + slots[i]) * n + f0 + r] = route[t * dims.experts + e] * partial[(r * TT + i) * WG];
            }
        }
        // The next tile overwrites toks and partial.
        workgroupBarrier();
    }
}
