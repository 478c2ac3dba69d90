// The cooperative-matrix entry point of the matrix-tile prefill attention
// (attn_mma.wgsl: the block, staging, masks and row passes): S = Q·Kᵀ and O += P·V
// on cooperative matrices (CoopA, CoopB, CoopC of the head coop16.wgsl: f16 inputs,
// f32 accumulators). Subgroup s
// takes the S matrices s, s + NSG, .. of each tile (stored to ss) and keeps the O
// matrices s, s + NSG, .. (NO of them, <= 8, in registers) for the whole block.
// Every subgroup runs every matrix operation (uniform control flow): an index past
// the last matrix is clamped to it, and its result neither stored nor written. The
// host admits only adapters whose subgroups are exactly 32 invocations, so WGS =
// NSG·32 invocations form NSG subgroups.
// Requires: coop16.wgsl, attn_mma.wgsl.

// Each subgroup's 16x16 slot for its O matrices on the way out.
var<workgroup> cs: array<f32, NSG * 256u>;

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32,
        @builtin(subgroup_id) sgid: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let b = block(wid);
    let s = min(sgid, NSG - 1u);
    let nsm = (BQ / 16u) * (BK / 16u);
    let nom = (BQ / 16u) * (HD / 16u);
    begin(b, tid);
    let nt = ntiles(b);
    var acc: array<CoopC, 8>; // NO <= 8 (checked on the host)
    for (var sweep = 0u; sweep < 2u; sweep++) {
        for (var t = 0u; t < nt; t++) {
            let t0 = b.klo + t * BK;
            stage_k(b, t0, tid);
            for (var j = 0u; j < NS; j++) {
                let idx = min(s + j * NSG, nsm - 1u);
                let mi = idx / (BK / 16u);
                let nj = idx % (BK / 16u);
                var sc: CoopC;
                for (var d0 = 0u; d0 < HD; d0 += 16u) {
                    let a = coopLoadT<CoopA>(&qs[mi * 16u * qstride() + d0], qstride());
                    let k = coopLoad<CoopB>(&kv[nj * 16u * qstride() + d0], qstride());
                    sc = coopMultiplyAdd(a, k, sc);
                }
                if (s + j * NSG < nsm) {
                    coopStoreT(sc, &ss[mi * 16u * BK + nj * 16u], BK);
                }
            }
            if (!scores_done(b, t0, tid, sweep)) {
                continue;
            }
            for (var j = 0u; j < NO; j++) {
                let idx = min(s + j * NSG, nom - 1u);
                let mi = idx / (HD / 16u);
                let dj = idx % (HD / 16u);
                for (var k0 = 0u; k0 < BK; k0 += 16u) {
                    let p = coopLoadT<CoopA>(&ps[mi * 16u * pstride() + k0], pstride());
                    let v = coopLoadT<CoopB>(&kv[k0 * qstride() + dj * 16u], qstride());
                    acc[j] = coopMultiplyAdd(p, v, acc[j]);
                }
            }
        }
    }
    // each subgroup's O matrices through its 16x16 slot of cs, normalised by the row sums
    for (var j = 0u; j < NO; j++) {
        let raw = s + j * NSG;
        let idx = min(raw, nom - 1u);
        workgroupBarrier();
        coopStoreT(acc[j], &cs[s * 256u], 16u);
        workgroupBarrier();
        if (raw < nom && sgid < NSG) {
            let mi = idx / (HD / 16u);
            let dj = idx % (HD / 16u);
            for (var e = lane; e < 256u; e += 32u) {
                write_o(b, mi * 16u + e / 16u, dj * 16u + e % 16u, cs[s * 256u + e]);
            }
        }
    }
}
