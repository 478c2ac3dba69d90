// The emulated entry point of the matrix-tile prefill attention: the tiling of
// attn_mma_coop.wgsl (attn_mma.wgsl; the same f16 tiles, masks, passes and matrix
// assignment) with the matrix operations as plain loops (16x16 matrices: the head
// coop_emu.wgsl's MAT stays at its default). A virtual subgroup of 32 invocations (s = tid /
// 32) takes the same S matrices and keeps the same O matrices, each lane 8 elements
// of each (element lane + 32q of a 16x16 matrix, row-major), products of f16 values
// summed in f32. It runs where there are no matrix units, which is how the coop
// tiling is tested on a software adapter.
// Requires: coop_emu.wgsl, attn_mma.wgsl.

// (row, column) in its block of the lane's q8-th element (lane + 32·q8, row-major)
// of 16x16 matrix idx of a block `cols` matrices wide.
fn lane_elem(idx: u32, cols: u32, lane: u32, q8: u32) -> vec2<u32> {
    let e = lane + 32u * q8;
    return vec2<u32>((idx / cols) * 16u + e / 16u, (idx % cols) * 16u + e % 16u);
}

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let b = block(wid);
    let s = tid / 32u;
    let lane = tid % 32u;
    let nsm = (BQ / 16u) * (BK / 16u);
    let nom = (BQ / 16u) * (HD / 16u);
    begin(b, tid);
    let nt = ntiles(b);
    var acc: array<f32, 64>; // NO matrices x 8 elements (NO <= 8, checked on the host)
    for (var sweep = 0u; sweep < 2u; sweep++) {
        for (var t = 0u; t < nt; t++) {
            let t0 = b.klo + t * BK;
            stage_k(b, t0, tid);
            for (var j = 0u; j < NS; j++) {
                let idx = s + j * NSG;
                if (idx < nsm) {
                    for (var q8 = 0u; q8 < 8u; q8++) {
                        let rc = lane_elem(idx, BK / 16u, lane, q8);
                        var sum = 0.0;
                        for (var d = 0u; d < HD; d++) {
                            sum += f32(qs[rc.x * qstride() + d]) * f32(kv[rc.y * qstride() + d]);
                        }
                        ss[rc.x * BK + rc.y] = sum;
                    }
                }
            }
            if (!scores_done(b, t0, tid, sweep)) {
                continue;
            }
            for (var j = 0u; j < NO; j++) {
                let idx = s + j * NSG;
                if (idx < nom) {
                    for (var q8 = 0u; q8 < 8u; q8++) {
                        let rc = lane_elem(idx, HD / 16u, lane, q8);
                        var sum = 0.0;
                        for (var k = 0u; k < BK; k++) {
                            sum += f32(ps[rc.x * pstride() + k]) * f32(kv[k * qstride() + rc.y]);
                        }
                        acc[j * 8u + q8] += sum;
                    }
                }
            }
        }
    }
    workgroupBarrier();
    for (var j = 0u; j < NO; j++) {
        let idx = s + j * NSG;
        if (idx < nom) {
            for (var q8 = 0u; q8 < 8u; q8++) {
                let rc = lane_elem(idx, HD / 16u, lane, q8);
                write_o(b, rc.x, rc.y, acc[j * 8u + q8]);
            }
        }
    }
}
