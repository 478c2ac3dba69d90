// The prologue pieces of the subgroup norm-fused GEMVs (norm_gemv_subgroup,
// norm_gemv_q_subgroup: `shader!(FILE, .., "norm_gemv_sg.wgsl")`): a workgroup-wide
// sum, the residual's 1 / rms, the write of the next residual stream. They use the
// including shader's `var<workgroup> sums: array<f32, WG>`, its residual
// `r: array<vec4<f32>>`, `h: array<f32>` and `dims` (k, eps, residual).
// Requires: grid_sg.wgsl.

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
