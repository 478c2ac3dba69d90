// The second pass of the grouped down projection (moe_grouped.wgsl): out[t, f] = the sum over token t's slots
// that hold an expert (moe_slot.wgsl's count: its nonzero routes) of the route-
// weighted products the first pass left in `parts` [rows * top_k, n], in slot
// order (as the gathered kernel adds them). An invocation per output element.

override WG: u32 = 64;

struct Dims { rows: u32, experts: u32, top_k: u32, n: u32, k: u32, act: u32 }

@group(0) @binding(0) var<storage, read> parts: array<f32>;
@group(0) @binding(1) var<storage, read> route: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + tid;
    let n = dims.n;
    if (i >= dims.rows * n) {
        return;
    }
    let t = i / n;
    let f = i % n;
    var used = 0u;
    for (var e = 0u; e < dims.experts; e++) {
        used += select(0u, 1u, route[t * dims.experts + e] != 0.0);
    }
    var sum = 0.0;
    for (var j = 0u; j < min(used, dims.top_k); j++) {
        sum += parts[(t * dims.top_k + j) * n + f];
    }
    out[i] = sum;
}
