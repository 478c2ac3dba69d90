// Workgroup tree reductions through workgroup memory, shared by the shaders that
// reduce one value per invocation (`shader!(FILE, .., "reduce_wg.wgsl")`). They use
// the including shader's `override WG: u32` (its workgroup size, a power of two) and
// `var<workgroup> partial: array<f32, N * WG>` (N >= the rows reduced; workgroup
// arrays sized by overrides must be declared by the shader itself). Every
// invocation of the workgroup must call them (uniform control flow: they hold
// barriers). Pairs (tid, tid + s) are combined for s = WG/2, WG/4, .., 1, so
// partial[r * WG] ends with the reduction of row r in that fixed order.

// Sums each of the rows 0..nrows of WG partials (row r at partial[r * WG + tid],
// written by every invocation before the call) into partial[r * WG].
fn wg_sum_rows(tid: u32, nrows: u32) {
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            for (var r = 0u; r < nrows; r++) {
                partial[r * WG + tid] += partial[r * WG + tid + s];
            }
        }
        workgroupBarrier();
    }
}

// The sum of v over the workgroup, returned to every invocation (tid: its
// local_invocation_index). partial[0] holds it until the next write: a caller that
// reduces again puts a barrier between. reduce_sg.wgsl has the subgroup versions of
// row_sum and row_max, so a row body can be written once for both.
fn row_sum(v: f32, tid: u32) -> f32 {
    partial[tid] = v;
    wg_sum_rows(tid, 1u);
    return partial[0];
}

// The maximum of v over the workgroup, as row_sum.
fn row_max(v: f32, tid: u32) -> f32 {
    partial[tid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            partial[tid] = max(partial[tid], partial[tid + s]);
        }
        workgroupBarrier();
    }
    return partial[0];
}
