// The experts' down projections summed with their route weights (Op::MoeDown):
// workgroup (wid.x, t) owns ROWS output features of token t; for each of the
// token's slots j (its expert e from the route, moe_slot.wgsl) every invocation
// strides over the units of e's rows of all ROWS features against h[t, j], scaled
// by route[t, e], into register accumulators (features past n recompute the last
// one, never stored); the workgroup reduces them once. Only the token's experts
// are read. Includes: moe_wq.wgsl or moe_wf.wgsl (interface), moe_slot.wgsl, the
// weight decoding (qblock.wgsl + qgeom.wgsl, or wload.wgsl), reduce_wg.wgsl.

override WG: u32 = 64;
override ROWS: u32 = 2;
override QFMT: u32 = 0u;
override W_F16: bool = false;

var<workgroup> partial: array<f32, WG * ROWS>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let f0 = wid.x * ROWS;
    let t = wid.y;
    let n = dims.n;
    let units = row_units();
    let last = n - 1u;
    var acc: array<f32, 8>;
    for (var j = 0u; j < dims.top_k; j++) {
        let e = slot_expert(t, j);
        if (e >= dims.experts) {
            break;
        }
        let g = route[t * dims.experts + e];
        let xv = (t * dims.top_k + j) * (dims.k / 4u);
        for (var wi = tid; wi < units; wi += WG) {
            for (var r = 0u; r < ROWS; r++) {
                acc[r] += g * row_dot(e * n + min(f0 + r, last), wi, xv);
            }
        }
    }
    for (var r = 0u; r < ROWS; r++) {
        partial[r * WG + tid] = acc[r];
    }
    wg_sum_rows(tid, ROWS);
    if (tid < ROWS && f0 + tid < n && t < dims.rows) {
        out[t * n + f0 + tid] = partial[tid * WG];
    }
}
