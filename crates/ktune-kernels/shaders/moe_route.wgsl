// A mixture-of-experts router's choice: route[t, e] = softmax(logits[t])[e] for the
// top_k largest logits of row t (ties to the lower index), 0 elsewhere, the kept
// ones divided by their sum when norm (kernels::reference::moe_route). One
// invocation per row: top_k passes over the row, each taking the largest logit
// below the last one taken in (value descending, index ascending) order, so no
// per-row memory; then one pass writes the row.

override WG: u32 = 64;

struct Dims { rows: u32, experts: u32, top_k: u32, norm: u32 }

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> route: array<f32>;
@group(0) @binding(2) var<uniform> dims: Dims;

// Whether logit (v, e) comes after (pv, pe) in (value descending, index ascending) order.
fn after(v: f32, e: u32, pv: f32, pe: u32) -> bool {
    return v < pv || (v == pv && e > pe);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * WG;
    if (t >= dims.rows) {
        return;
    }
    let ne = dims.experts;
    let base = t * ne;
    var m = logits[base];
    for (var e = 1u; e < ne; e++) {
        m = max(m, logits[base + e]);
    }
    // The last expert kept, (pv, pe); a start that every logit comes after.
    var pv = m;
    var pe = 0xffffffffu;
    var kept_sum = 0.0;
    for (var j = 0u; j < min(dims.top_k, ne); j++) {
        var bv = 0.0;
        var be = ne;
        for (var e = 0u; e < ne; e++) {
            let v = logits[base + e];
            let later = select(after(v, e, pv, pe), v <= pv, pe == 0xffffffffu);
            if (later && (be == ne || v > bv)) {
                bv = v;
                be = e;
            }
        }
        pv = bv;
        pe = be;
        kept_sum += exp(bv - m);
    }
    var z = 0.0;
    for (var e = 0u; e < ne; e++) {
        z += exp(logits[base + e] - m);
    }
    let denom = select(z, kept_sum, dims.norm == 1u);
    for (var e = 0u; e < ne; e++) {
        let v = logits[base + e];
        let kept = v > pv || (v == pv && e <= pe);
        route[base + e] = select(0.0, exp(v - m) / denom, kept);
    }
}
