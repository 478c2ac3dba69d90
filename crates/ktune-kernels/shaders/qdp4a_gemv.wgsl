// The GEMV family of the second-generation quantized projections (qdp4a.wgsl):
// y[n] = w[n,k] · x[k], one accumulator per output row (`shader!(head
// "qdp4a_head.wgsl"; "qdp4a_gemv.wgsl", MAIN, "qdp4a.wgsl", ..)`). With SPLIT > 1
// the splits' partials go through qdp4a_rows.wgsl's `part`.
// Requires: qdp4a_head.wgsl, qdp4a.wgsl, qgeom.wgsl, qdp4a_rows.wgsl.

// Accumulators per row of a row group (qdp4a.wgsl's dq_nacc).
const DQ_SETS: u32 = 1u;

fn dq_row(row0: u32, r: u32) -> u32 {
    return min(row0 + r, dims.n - 1u);
}

// Row j's output from its one total.
fn dq_value(v: vec2<f32>) -> f32 {
    return v.x;
}
