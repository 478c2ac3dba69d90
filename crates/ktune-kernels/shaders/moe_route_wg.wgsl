// A mixture-of-experts router's choice (Op::MoeRoute, as moe_route.wgsl computes
// it): a workgroup per row. The row's maximum and softmax denominator are workgroup
// reductions; each of the top_k rounds takes the largest logit after the last one
// taken in (value descending, index ascending) order by two reductions (the value,
// then the lowest index holding it, as -index: exact below 2^24); then every
// invocation writes its experts. Includes: reduce_wg.wgsl (row_sum, row_max).

override WG: u32 = 64;

var<workgroup> partial: array<f32, WG>;

struct Dims { rows: u32, experts: u32, top_k: u32, norm: u32 }

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> route: array<f32>;
@group(0) @binding(2) var<uniform> dims: Dims;

const NONE: f32 = -3.0e38;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let t = wid.x + wid.y * nwg.x;
    let ne = dims.experts;
    let base = min(t, dims.rows - 1u) * ne;
    var lm = NONE;
    for (var e = tid; e < ne; e += WG) {
        lm = max(lm, logits[base + e]);
    }
    let m = row_max(lm, tid);
    workgroupBarrier();
    var lz = 0.0;
    for (var e = tid; e < ne; e += WG) {
        lz += exp(logits[base + e] - m);
    }
    let z = row_sum(lz, tid);
    // The last expert kept, (pv, pe); none yet: every logit comes after.
    var pv = m;
    var pe = ne;
    var first = true;
    var kept_sum = 0.0;
    for (var j = 0u; j < min(dims.top_k, ne); j++) {
        var bv = NONE;
        var be = ne;
        for (var e = tid; e < ne; e += WG) {
            let v = logits[base + e];
            let later = first || v < pv || (v == pv && e > pe);
            if (later && (be == ne || v > bv)) {
                bv = v;
                be = e;
            }
        }
        workgroupBarrier();
        let best = row_max(bv, tid);
        workgroupBarrier();
        let idx = u32(-row_max(select(NONE, -f32(be), be < ne && bv == best), tid));
        workgroupBarrier();
        pv = best;
        pe = idx;
        first = false;
        kept_sum += exp(best - m);
    }
    let denom = select(z, kept_sum, dims.norm == 1u);
    if (t < dims.rows) {
        for (var e = tid; e < ne; e += WG) {
            let v = logits[base + e];
            let kept = v > pv || (v == pv && e <= pe);
            route[base + e] = select(0.0, exp(v - m) / denom, kept);
        }
    }
}
