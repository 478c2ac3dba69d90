// The experts' gate and up projections grouped by expert (Op::MoeGateUp, the
// prefill form): workgroup (wid.x, e) owns ROWS features of expert e and walks the
// tokens routed to it TT at a time (moe_tokens.wgsl); every invocation strides
// over the units of e's gate and up rows of its ROWS features, each unit read and
// decoded once for all TT tokens of the tile (an expert's rows are read once per
// TT of its tokens, where the gathered kernel reads them once per token), into
// register accumulators; one workgroup reduction per tile, the activation product
// in the epilogue, each token's result in its slot of e. The workgroups of y =
// experts write zeros into the slots past a token's experts (the gathered
// kernel's rule). Includes: moe_wq.wgsl or moe_wf.wgsl (interface),
// moe_tokens.wgsl, the weight decoding (qblock.wgsl + qgeom.wgsl, or wload.wgsl),
// act.wgsl, reduce_wg.wgsl.

override WG: u32 = 64;
override ROWS: u32 = 2;
override TT: u32 = 4;
override QFMT: u32 = 0u;
override W_F16: bool = false;

var<workgroup> partial: array<f32, 2 * WG * ROWS * TT>;
var<workgroup> toks: array<u32, TT>;
var<workgroup> slots: array<u32, TT>;
var<workgroup> ntok: u32;
var<workgroup> cursor: u32;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let f0 = wid.x * ROWS;
    let e = wid.y;
    let n = dims.n;
    if (e >= dims.experts) {
        // The slots no expert fills.
        for (var t = tid; t < dims.rows; t += WG) {
            for (var j = slot_of(t, dims.experts); j < dims.top_k; j++) {
                for (var r = 0u; r < ROWS && f0 + r < n; r++) {
                    out[(t * dims.top_k + j) * n + f0 + r] = 0.0;
                }
            }
        }
        return;
    }
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
        // Gate of (feature r, token i) at 2 r TT + i, up at (2 r + 1) TT + i.
        var acc: array<f32, 32>;
        for (var wi = tid; wi < units; wi += WG) {
            for (var r = 0u; r < ROWS; r++) {
                let f = min(f0 + r, last);
                let g = unit_of(e * n + f, wi);
                let u = unit_of((dims.experts + e) * n + f, wi);
                for (var i = 0u; i < m; i++) {
                    let xv = toks[i] * kv;
                    acc[2u * r * TT + i] += unit_dot(g, xv);
                    acc[(2u * r + 1u) * TT + i] += unit_dot(u, xv);
                }
            }
        }
        for (var q = 0u; q < 2u * ROWS * TT; q++) {
            partial[q * WG + tid] = acc[q];
        }
        wg_sum_rows(tid, 2u * ROWS * TT);
        if (tid < ROWS * TT) {
            let r = tid / TT;
            let i = tid % TT;
            if (i < m && f0 + r < n) {
                let t = toks[i];
                let gate = partial[(2u * r * TT + i) * WG];
                let up = partial[((2u * r + 1u) * TT + i) * WG];
                out[(t * dims.top_k + slots[i]) * n + f0 + r] = act(gate, dims.act == 1u) * up;
            }
        }
        // The next tile overwrites toks and partial.
        workgroupBarrier();
    }
}
