// The row collectives of the second-generation flash prefill attention for adapters
// without subgroups: the body is flash2.wgsl (Q slices in registers, head_dim split over LANES lanes
// per query row, the GQA heads of a workgroup sharing each K/V tile, one
// exponential per score); the row collectives go through workgroup memory. The
// reduce-scatter of LANES keys' partial dots is one exchange: every lane writes its
// LANES partials, a barrier, and lane c sums the row's partials of key c (one
// buffer, so a second barrier keeps the next write after the reads: half the
// memory of two alternating buffers, for adapters with 16 KiB); the row maximum
// and sum read the row's LANES values after a barrier; the probabilities of a tile
// go to `ps`.
// `flat` is local_invocation_index.
// Appended to flash2.wgsl (the shader's own file, with its overrides).
// Requires: flash2.wgsl.

var<workgroup> red: array<f32, BQ * GH * LANES * LANES>;
var<workgroup> rowv: array<f32, BQ * GH * LANES>;
var<workgroup> ps: array<f32, BQ * GH * BKV>;

fn lanes_scatter(v: array<f32, 16>, flat: u32) -> f32 {
    workgroupBarrier();
    for (var kk = 0u; kk < LANES; kk++) {
        red[flat * LANES + kk] = v[kk];
    }
    workgroupBarrier();
    let row = flat - flat % LANES;
    let lane = flat % LANES;
    var s = 0.0;
    for (var o = 0u; o < LANES; o++) {
        s += red[(row + o) * LANES + lane];
    }
    return s;
}

// The row's LANES values combined (max or sum); `rowv` is free again after the
// next barrier of the caller (every use is followed by one before the next).
fn lanes_fold(x: f32, flat: u32, is_max: bool) -> f32 {
    workgroupBarrier();
    rowv[flat] = x;
    workgroupBarrier();
    let row = flat - flat % LANES;
    var y = rowv[row];
    for (var o = 1u; o < LANES; o++) {
        let z = rowv[row + o];
        if (is_max) {
            y = max(y, z);
        } else {
            y += z;
        }
    }
    return y;
}

fn lanes_max(x: f32, flat: u32) -> f32 {
    return lanes_fold(x, flat, true);
}

fn lanes_sum(x: f32, flat: u32) -> f32 {
    return lanes_fold(x, flat, false);
}

// The tile's probabilities to `ps` (read back by p_of after the barrier). The
// previous tile's readers are past the barriers of this tile's scores.
fn share_p(sc: array<f32, 16>, r: u32, lane: u32) {
    for (var gi = 0u; gi < BKV / LANES; gi++) {
        ps[r * BKV + gi * LANES + lane] = sc[gi];
    }
    workgroupBarrier();
}

fn p_of(mine: f32, r: u32, flat: u32, c: u32, kk: u32) -> f32 {
    return ps[r * BKV + c];
}

@compute @workgroup_size(BQ * GH * LANES)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    flash2(wid, tid, tid);
}
