// The prologue of the subgroup norm-fused GEMVs (norm_gemv_subgroup,
// norm_gemv_q_subgroup: `shader!(FILE, .., "norm_gemv_sg.wgsl")`): the input formed
// once into workgroup memory, with a workgroup-wide sum, the residual's 1 / rms and
// the write of the next residual stream. It uses the including shader's
// `var<workgroup> sums: array<f32, WG>` and `xa: array<vec4<f32>, K4>`, its input
// `x` and residual `r` (`array<vec4<f32>>`), `h: array<f32>`, `dims` (k, eps,
// residual), and its gains of vec4 `c` as applied (g or 1 + g): `gain(c)` (the
// norm's) and `gain_r(c)` (the residual's norm, residual 2); its output
// `y: array<f32>`, `ROWS`, `dims` (n, act) and its `lane_dots(s, row)` (one lane's
// partial dots of row `row`, and of its up row with an activation) for the rows.
// Requires: grid_sg.wgsl, act.wgsl.

// Every invocation's value summed over the workgroup by one subgroupAdd per
// subgroup and the subgroups' partials through `sums`, returned to every
// invocation. Holds barriers: call it in uniform control flow.
fn wg_total(v: f32, s: SgGrid) -> f32 {
    let part = subgroupAdd(v);
    if (s.lane == 0u) {
        sums[s.sg] = part;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < s.nsg; i++) {
        total += sums[i];
    }
    workgroupBarrier();
    return total;
}

// 1 / rms(r) for the normed residual (dims.residual 2; 0 otherwise), invocation
// `tid` of the workgroup's `stride` taking vec4s tid, tid + stride, ...
fn residual_inv(s: SgGrid, tid: u32, stride: u32) -> f32 {
    if (dims.residual != 2u) {
        return 0.0;
    }
    var sr = 0.0;
    for (var c = tid; c < dims.k / 4u; c += stride) {
        let v = r[c];
        sr += dot(v, v);
    }
    return inverseSqrt(wg_total(sr, s) / f32(dims.k) + dims.eps);
}

// Elements 4c..4c+4 of the residual sum into h, by the first workgroup only, when
// there is a residual.
fn write_h(first: u32, c: u32, v: vec4<f32>) {
    if (dims.residual != 0u && first == 0u) {
        for (var e = 0u; e < 4u; e++) {
            h[4u * c + e] = v[e];
        }
    }
}

// The prologue: per vec4 c the input v = x (+ r, residual 1; + rmsnorm(r) · g_r',
// residual 2), v · g' into xa, v into h (with a residual); returns 1 / rms(v).
// Holds barriers: call it in uniform control flow.
fn prologue(s: SgGrid, first: u32) -> f32 {
    let tid = s.sg * s.sg_size + s.lane;
    let stride = s.nsg * s.sg_size;
    let inv_r = residual_inv(s, tid, stride);
    var ss = 0.0;
    for (var c = tid; c < dims.k / 4u; c += stride) {
        var v = x[c];
        if (dims.residual == 1u) {
            v += r[c];
        } else if (dims.residual == 2u) {
            v += r[c] * inv_r * gain_r(c);
        }
        ss += dot(v, v);
        xa[c] = v * gain(c);
        write_h(first, c, v);
    }
    return inverseSqrt(wg_total(ss, s) / f32(dims.k) + dims.eps);
}

// Row `row` from its subgroup's lanes' partial dots (`acc`; with an activation
// `acc_up` those of the up row): y = Σ · inv_rms, or act(gate) · up. Call it in
// the subgroup's uniform control flow.
fn store_row(s: SgGrid, row: u32, acc: f32, acc_up: f32, inv: f32) {
    let total = subgroupAdd(acc) * inv;
    let up = subgroupAdd(acc_up) * inv;
    if (s.lane == 0u) {
        y[row] = select(total, act(total, dims.act == 2u) * up, dims.act != 0u);
    }
}

// The workgroup's ROWS rows from `first` (inv: prologue()'s 1 / rms), each owned
// by one subgroup (sg, sg + num_subgroups, ...): the lanes' partial dots
// (lane_dots) finished by store_row.
fn rows(s: SgGrid, first: u32, inv: f32) {
    for (var rr = s.sg; rr < ROWS; rr += s.nsg) {
        let row = first * ROWS + rr;
        if (row >= dims.n) { break; }
        let a = lane_dots(s, row);
        store_row(s, row, a.x, a.y, inv);
    }
}
