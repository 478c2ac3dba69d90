// RMSNorm row pieces shared by the RMSNorm shaders (norm_rms_wg/subgroup,
// fused_residual_rms_norm_*, fused_qk_norm_rope_*: `shader!(FILE, .., "rms.wgsl")`).
// A row of d values starting at `base` is walked by one workgroup or one subgroup,
// invocation `first` taking c = first, first + stride, ... (stride WG or the
// subgroup size). They read the including shader's `x: array<f32>`; rms_write also
// writes its `y: array<f32>`, rms_at and rms_write call its `wload(i: u32) -> f32`
// (the norm weight, see wload.wgsl), rms_row_inv its row_sum (reduce_wg.wgsl or
// reduce_sg.wgsl).

// Σ x[base + c]² over the invocation's share of c in [0, d), in order.
fn row_sumsq(base: u32, first: u32, stride: u32, d: u32) -> f32 {
    var ss = 0.0;
    for (var c = first; c < d; c += stride) {
        let v = x[base + c];
        ss += v * v;
    }
    return ss;
}

// 1 / sqrt(mean + eps) from the row's sum of squares.
fn rms_inv(ss: f32, d: u32, eps: f32) -> f32 {
    return inverseSqrt(ss / f32(d) + eps);
}

// rms_inv of the row of x, reduced over the invocations sharing the row.
fn rms_row_inv(base: u32, first: u32, stride: u32, d: u32, eps: f32) -> f32 {
    return rms_inv(row_sum(row_sumsq(base, first, stride, d), first), d, eps);
}

// The norm weight g as applied: g, or 1 + g when unit_offset (Gemma).
fn rms_gain(g: f32, unit: bool) -> f32 {
    return select(g, 1.0 + g, unit);
}

// Normalized element c of the row: x[base + c] * inv * gain(c).
fn rms_at(base: u32, c: u32, inv: f32, unit: bool) -> f32 {
    return x[base + c] * inv * rms_gain(wload(c), unit);
}

// y[base + c] = rms_at(c) over the invocation's share of c in [start, d).
fn rms_write(base: u32, start: u32, first: u32, stride: u32, d: u32, inv: f32, unit: bool) {
    for (var c = start + first; c < d; c += stride) {
        y[base + c] = rms_at(base, c, inv, unit);
    }
}
