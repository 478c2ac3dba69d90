// The FMA-chain kernel of `ktune bench-kernels`: the adapter's f32 peak. Each
// invocation runs ITERS steps of eight independent vec4 fused multiply-adds (so
// the chains hide the FMA latency), 64 flops a step. The multiplier and addend
// come from a buffer, so no compiler can fold the chains; the sum is written out
// so none can drop them. `coef` = [start, multiplier, addend, unused] per lane.

override WG: u32 = 256;
override ITERS: u32 = 256;

@group(0) @binding(0) var<storage, read> coef: array<vec4<f32>, 3>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn fma_chain(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let g = (wid.x + wid.y * nwg.x) * WG + lid;
    let m = coef[1];
    let c = coef[2];
    let s = coef[0] + vec4<f32>(f32(lid) * 1e-3);
    var a0 = s;
    var a1 = s + c;
    var a2 = s - c;
    var a3 = s * m;
    var a4 = s + 2.0 * c;
    var a5 = s - 2.0 * c;
    var a6 = s * m + c;
    var a7 = s * m - c;
    for (var i = 0u; i < ITERS; i++) {
        a0 = fma(a0, m, c);
        a1 = fma(a1, m, c);
        a2 = fma(a2, m, c);
        a3 = fma(a3, m, c);
        a4 = fma(a4, m, c);
        a5 = fma(a5, m, c);
        a6 = fma(a6, m, c);
        a7 = fma(a7, m, c);
    }
    if (g < arrayLength(&out)) {
        out[g] = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
    }
}
