// The experts' projections grouped by expert (the prefill forms): workgroup
// (wid.x, e) owns ROWS features of expert e and walks the tokens routed to it TT
// at a time (moe_tokens.wgsl); every invocation strides over the units of e's
// rows of its ROWS features, each unit read and decoded once for all TT tokens of
// the tile (an expert's rows are read once per TT of its tokens, where the
// gathered kernels read them once per token), into register accumulators; one
// workgroup reduction per tile.
// GATED (Op::MoeGateUp): e's gate and up rows against the tokens' activations,
// the activation product into each token's slot of e; the workgroups of y =
// experts write zeros into the slots past a token's experts (the gathered
// kernel's rule). Otherwise (Op::MoeDown, first of two passes): e's down rows
// against each token's slot activations h[t, slot], the product weighted by the
// route into the slot's row of `out` (the kernel's scratch, [rows * top_k, n];
// slots past a token's experts are never read); moe_down_sum.wgsl then sums a
// token's slots (no float atomics could add into a token's row).
// Includes: moe_wq.wgsl or moe_wf.wgsl (interface), moe_tokens.wgsl, the weight
// decoding (qblock.wgsl + qgeom.wgsl, or wload.wgsl), act.wgsl, reduce_wg.wgsl.

override WG: u32 = 64;
override ROWS: u32 = 2;
override TT: u32 = 4;
override GATED: bool = true;
override QFMT: u32 = 0u;
override W_F16: bool = false;

var<workgroup> partial: array<f32, 2 * WG * ROWS * TT>;
var<workgroup> toks: array<u32, TT>;
var<workgroup> slots: array<u32, TT>;
var<workgroup> ntok: u32;
var<workgroup> cursor: u32;

// The slots no expert fills (GATED: wid.y = experts), features f0..f0 + ROWS.
fn zero_empty_slots(tid: u32, f0: u32) {
    for (var t = tid; t < dims.rows; t += WG) {
        for (var j = slot_of(t, dims.experts); j < dims.top_k; j++) {
            for (var r = 0u; r < ROWS && f0 + r < dims.n; r++) {
                out[(t * dims.top_k + j) * dims.n + f0 + r] = 0.0;
            }
        }
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let f0 = wid.x * ROWS;
    let e = wid.y;
    let n = dims.n;
    if (e >= dims.experts) {
        zero_empty_slots(tid, f0);
        return;
    }
    // Weight rows per feature (gate and up, or down), the tile's accumulators.
    let per = select(1u, 2u, GATED);
    let count = per * ROWS * TT;
    let units = row_units();
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
        // Row h of feature r against token i at (per r + h) TT + i.
        var acc: array<f32, 32>;
        for (var wi = tid; wi < units; wi += WG) {
            for (var r = 0u; r < ROWS; r++) {
                let f = min(f0 + r, n - 1u);
                for (var h = 0u; h < per; h++) {
                    let u = unit_of((h * dims.experts + e) * n + f, wi);
                    for (var i = 0u; i < m; i++) {
                        let xrow = select(toks[i] * dims.top_k + slots[i], toks[i], GATED);
                        acc[(per * r + h) * TT + i] += unit_dot(u, xrow * kv);
                    }
                }
            }
        }
        for (var q = 0u; q < count; q++) {
            partial[q * WG + tid] = acc[q];
        }
        wg_sum_rows(tid, count);
        if (tid < ROWS * TT) {
            let r = tid / TT;
            let i = tid % TT;
            if (i < m && f0 + r < n) {
                let t = toks[i];
                let first = partial[(per * r * TT + i) * WG];
                var y = route[t * dims.experts + e] * first;
                if (GATED) {
                    y = act(first, dims.act == 1u) * partial[((per * r + 1u) * TT + i) * WG];
                }
                out[(t * dims.top_k + slots[i]) * n + f0 + r] = y;
            }
        }
        // The next tile overwrites toks and partial.
        workgroupBarrier();
    }
}
