// The cooperative-matrix entry point of qgemm_coop8 / qgemm_coop16 (which declare
// MAT and the matrix types CoopA, CoopB, CoopC: f16 inputs, f32 accumulators).
// Tiles and staging: qgemm_mma.wgsl. Every subgroup runs every matrix operation
// (they need uniform control flow); the host admits only adapters whose subgroups
// are exactly 32 invocations, so the WGS = SG_M·SG_N·32 invocations form exactly
// SG_M·SG_N subgroups (the min() below only keeps indices in range).

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32,
        @builtin(subgroup_id) sgid: u32) {
    let s = min(sgid, SG_M * SG_N - 1u);
    let sm = s / SG_N;
    let sn = s % SG_N;
    let m0 = wid.y * tile_m();
    let n0 = wid.x * tile_n();
    let nch = dims.k / 32u;
    var acc: array<CoopC, 8>; // MAT_M * MAT_N <= 8 (checked on the host)
    var a: array<CoopA, 4>;   // MAT_M <= 4
    for (var c0 = 0u; c0 < nch; c0 += TILE_K / 32u) {
        stage(c0, tid, m0, n0);
        workgroupBarrier();
        for (var kk = 0u; kk < TILE_K / MAT; kk++) {
            for (var mi = 0u; mi < MAT_M; mi++) {
                a[mi] = coopLoadT<CoopA>(&xs[a_base(sm, mi, kk)], xstride());
            }
            for (var nj = 0u; nj < MAT_N; nj++) {
                let b = coopLoad<CoopB>(&wt[b_base(sn, nj, kk)], xstride());
                for (var mi = 0u; mi < MAT_M; mi++) {
                    acc[mi * MAT_N + nj] = coopMultiplyAdd(a[mi], b, acc[mi * MAT_N + nj]);
                }
            }
        }
        workgroupBarrier();
    }
    for (var mi = 0u; mi < MAT_M; mi++) {
        for (var nj = 0u; nj < MAT_N; nj++) {
            coopStoreT(acc[mi * MAT_N + nj], &cs[c_slot(s)], MAT);
            workgroupBarrier();
            write_out(mi, nj, tid, m0, n0);
            workgroupBarrier();
        }
    }
}
