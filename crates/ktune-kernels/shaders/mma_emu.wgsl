// The entry point of the emulated matrix-tile GEMMs (head coop_emu.wgsl): the tiling of the
// cooperative-matrix GEMMs (mma.wgsl: the same f16 tiles, staging, matrix bases,
// strides and result slots) with the matrix operations written as plain loops: a
// virtual subgroup of 32 invocations (s = tid / 32) owns the same MAT_M x MAT_N
// matrices of MAT x MAT (per weight matrix), each lane MAT·MAT/32 elements of each
// (element lane + 32q, row-major). A "load" reads A row-major and B column-major at
// stride xstride() from the same bases as coopLoadT / coopLoad, the multiply-add
// sums f16 products in f32, and the "store" writes the slot row-major at stride MAT
// as coopStoreT does. It runs where there are no matrix units, which is how the coop
// tiling is tested on a software adapter, and is a SIMT GEMM with f16 tiles in its
// own right.

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let s = tid / 32u;
    let lane = tid % 32u;
    let sm = s / SG_N;
    let sn = s % SG_N;
    let m0 = wid.y * tile_m();
    let n0 = wid.x * tile_n();
    let per = MAT * MAT / 32u; // elements of a matrix per lane
    let xs_row = xstride();
    var acc: array<f32, 64>; // W_MATS * MAT_M * MAT_N * per <= 64 (checked on the host)
    for (var i = 0u; i < W_MATS * MAT_M * MAT_N * per; i++) {
        acc[i] = 0.0;
    }
    steps_begin(tid, m0, n0);
    for (var c0 = 0u; c0 < nchunks(); c0 += kstep()) {
        let buf = step_open(c0, tid, m0, n0);
        for (var kk = 0u; kk < TILE_K / MAT; kk++) {
            for (var mi = 0u; mi < MAT_M; mi++) {
                let ab = a_base(sm, mi, kk, buf);
                for (var g = 0u; g < W_MATS; g++) {
                    for (var nj = 0u; nj < MAT_N; nj++) {
                        let bb = b_base(sn, nj, kk, g, buf);
                        for (var q = 0u; q < per; q++) {
                            let e = lane + 32u * q;
                            let r = e / MAT;
                            let c = e % MAT;
                            var sum = 0.0;
                            for (var t = 0u; t < MAT; t++) {
                                sum += f32(xs[ab + r * xs_row + t]) * f32(wt[bb + c * xs_row + t]);
                            }
                            acc[(((g * MAT_M) + mi) * MAT_N + nj) * per + q] += sum;
                        }
                    }
                }
            }
        }
        step_close(c0, tid);
    }
    for (var mi = 0u; mi < MAT_M; mi++) {
        for (var nj = 0u; nj < MAT_N; nj++) {
            for (var g = 0u; g < W_MATS; g++) {
                for (var q = 0u; q < per; q++) {
                    cs[c_slot(s, g) + lane + 32u * q] = acc[(((g * MAT_M) + mi) * MAT_N + nj) * per + q];
                }
            }
            workgroupBarrier();
            write_out(mi, nj, tid, m0, n0);
            workgroupBarrier();
        }
    }
}
