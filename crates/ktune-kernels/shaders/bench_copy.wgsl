// The copy kernel of `ktune bench-kernels`: the adapter's achievable memory
// bandwidth, measured in the same run as the kernels it is compared with. Each
// invocation copies VPT 16-byte vectors, vector lid, lid + WG, ... of its
// workgroup's stretch, so every load and store instruction of the workgroup is
// contiguous. The length comes from the destination binding.

override WG: u32 = 256;
override VPT: u32 = 4;

@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;

@compute @workgroup_size(WG)
fn copy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let base = (wid.x + wid.y * nwg.x) * WG * VPT + lid;
    let n = arrayLength(&dst);
    for (var v = 0u; v < VPT; v++) {
        let i = base + v * WG;
        if (i < n) {
            dst[i] = src[i];
        }
    }
}
