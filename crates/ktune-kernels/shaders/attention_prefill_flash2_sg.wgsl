// The row collectives of the second-generation flash prefill attention on subgroup
// operations: the body is flash2.wgsl (Q slices in registers, head_dim split over
// LANES lanes per query row, the GQA heads of a workgroup sharing each K/V tile,
// one exponential per score); the row collectives are subgroup shuffles, with no workgroup memory or
// barrier beyond the K/V staging (none at all without it).
// A row's lanes are LANES consecutive invocations of one subgroup: `flat` =
// subgroup_id * subgroup_size + subgroup_invocation_id, so the host requires
// LANES <= the adapter's smallest subgroup size (and the workgroup, a power of
// two, is either within one subgroup or whole subgroups).
// Appended to flash2.wgsl (the shader's own file, with its overrides).
// Requires: flash2.wgsl.

// Lane c of the row gets the sum over the row's lanes of their v[c]: recursive
// halving, each step keeping the half of the keys whose bit matches the lane's.
fn lanes_scatter(v_in: array<f32, 16>, flat: u32) -> f32 {
    var v = v_in;
    let lane = flat % LANES;
    for (var half = LANES / 2u; half > 0u; half >>= 1u) {
        let up = (lane & half) != 0u;
        for (var i = 0u; i < half; i++) {
            let keep = select(v[i], v[i + half], up);
            let send = select(v[i + half], v[i], up);
            v[i] = keep + subgroupShuffleXor(send, half);
        }
    }
    return v[0];
}

fn lanes_max(x: f32, flat: u32) -> f32 {
    var y = x;
    for (var half = LANES / 2u; half > 0u; half >>= 1u) {
        y = max(y, subgroupShuffleXor(y, half));
    }
    return y;
}

fn lanes_sum(x: f32, flat: u32) -> f32 {
    var y = x;
    for (var half = LANES / 2u; half > 0u; half >>= 1u) {
        y += subgroupShuffleXor(y, half);
    }
    return y;
}

// Probabilities stay in their lanes' registers.
fn share_p(sc: array<f32, 16>, r: u32, lane: u32) {}

// Probability of tile key c (= gi * LANES + kk), owned by lane kk of the row.
fn p_of(mine: f32, r: u32, flat: u32, c: u32, kk: u32) -> f32 {
    return subgroupShuffle(mine, (sg_lane & ~(LANES - 1u)) | kk);
}

var<private> sg_lane: u32;

@compute @workgroup_size(BQ * GH * LANES)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32, @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) sl: u32, @builtin(subgroup_size) sgs: u32) {
    sg_lane = sl;
    flash2(wid, tid, sg * sgs + sl);
}
