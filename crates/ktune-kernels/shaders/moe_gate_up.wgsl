// The experts' gate and up projections with the activation product (Op::MoeGateUp):
// workgroup (wid.x, p) owns ROWS features of slot p = t * top_k + j, whose expert
// e it finds in the route (moe_slot.wgsl); each invocation strides over the units
// of e's gate and up rows of all ROWS features from the same x loads into
// register accumulators (features past n recompute the last one, never stored),
// the workgroup reduces them once and applies the activation in the epilogue. A
// slot past the token's experts writes zeros. Only the experts the tokens route to
// are read: the decode form is a gathered GEMV, the prefill form the same per
// token. Includes: moe_wq.wgsl or moe_wf.wgsl (interface), moe_slot.wgsl, the
// weight decoding (qblock.wgsl + qgeom.wgsl, or wload.wgsl), act.wgsl,
// reduce_wg.wgsl.

override WG: u32 = 64;
override ROWS: u32 = 2;
override QFMT: u32 = 0u;
override W_F16: bool = false;

var<workgroup> partial: array<f32, 2 * WG * ROWS>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let f0 = wid.x * ROWS;
    let p = wid.y;
    let t = p / dims.top_k;
    let n = dims.n;
    let e = slot_expert(t, p % dims.top_k);
    let units = row_units();
    let xv = t * (dims.k / 4u);
    let last = n - 1u;
    var acc: array<f32, 16>;
    if (e < dims.experts) {
        for (var wi = tid; wi < units; wi += WG) {
            for (var r = 0u; r < ROWS; r++) {
                let f = min(f0 + r, last);
                acc[r] += row_dot(e * n + f, wi, xv);
                acc[ROWS + r] += row_dot((dims.experts + e) * n + f, wi, xv);
            }
        }
    }
    for (var r = 0u; r < 2u * ROWS; r++) {
        partial[r * WG + tid] = acc[r];
    }
    wg_sum_rows(tid, 2u * ROWS);
    if (tid < ROWS && f0 + tid < n && t < dims.rows) {
        out[p * n + f0 + tid] = act(partial[tid * WG], dims.act == 1u) * partial[(ROWS + tid) * WG];
    }
}
