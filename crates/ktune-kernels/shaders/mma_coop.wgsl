// The cooperative-matrix entry point of the matrix-tile GEMMs (their head coop8.wgsl
// or coop16.wgsl declares MAT and the matrix types CoopA, CoopB, CoopC: f16 inputs,
// f32 accumulators). Tiles, x staging and output: mma.wgsl; weight staging: mma_q.wgsl
// or mma_f.wgsl. Every subgroup runs every matrix operation (they need uniform
// control flow); the host admits only adapters whose subgroups are exactly 32
// invocations, so the WGS = SG_M·SG_N·32 invocations form exactly SG_M·SG_N
// subgroups (the min() below only keeps indices in range).

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32,
        @builtin(subgroup_id) sgid: u32) {
    let s = min(sgid, SG_M * SG_N - 1u);
    let sm = s / SG_N;
    let sn = s % SG_N;
    let m0 = wid.y * tile_m();
    let n0 = wid.x * tile_n();
    var acc: array<CoopC, 8>; // W_MATS * MAT_M * MAT_N <= 8 (checked on the host)
    var a: array<CoopA, 4>;   // MAT_M <= 4
    steps_begin(tid, m0, n0);
    for (var c0 = 0u; c0 < nchunks(); c0 += kstep()) {
        let buf = step_open(c0, tid, m0, n0);
        for (var kk = 0u; kk < TILE_K / MAT; kk++) {
            for (var mi = 0u; mi < MAT_M; mi++) {
                a[mi] = coopLoadT<CoopA>(&xs[a_base(sm, mi, kk, buf)], xstride());
            }
            for (var g = 0u; g < W_MATS; g++) {
                for (var nj = 0u; nj < MAT_N; nj++) {
                    let b = coopLoad<CoopB>(&wt[b_base(sn, nj, kk, g, buf)], xstride());
                    for (var mi = 0u; mi < MAT_M; mi++) {
                        let i = (g * MAT_M + mi) * MAT_N + nj;
                        acc[i] = coopMultiplyAdd(a[mi], b, acc[i]);
                    }
                }
            }
        }
        step_close(c0, tid);
    }
    for (var mi = 0u; mi < MAT_M; mi++) {
        for (var nj = 0u; nj < MAT_N; nj++) {
            for (var g = 0u; g < W_MATS; g++) {
                coopStoreT(acc[(g * MAT_M + mi) * MAT_N + nj], &cs[c_slot(s, g)], MAT);
            }
            workgroupBarrier();
            write_out(mi, nj, tid, m0, n0);
            workgroupBarrier();
        }
    }
}
