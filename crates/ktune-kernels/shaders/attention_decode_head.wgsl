// Head of the WGSL decode attention kernels (attention_decode_stream,
// attention_decode_splitkv, attention_decode_splitkv_sg), before
// attention_dims.wgsl: the overrides they share, and the split-KV kernels' names for
// the uniform's own words. The KV length is position.wgsl's kv_len (one buffer a
// pass), not the uniform block's: their programs serve every position, on grids
// sized for the cache's capacity whose workgroups past the visible keys exit.

override WG: u32 = 128;
override HD: u32 = 64;        // head_dim, specialised by the host

// How a decode workgroup's WG invocations cover a cache row of HD elements: `vl`
// lanes of 16-byte words a row, `ns` = WG / vl row slices side by side, and
// invocation tid's slice and lane.
struct RowSplit { vl: u32, ns: u32, slice: u32, lane: u32 }

fn row_split(tid: u32) -> RowSplit {
    let vl = wwords16(HD);
    return RowSplit(vl, WG / vl, tid / vl, tid % vl);
}

// Workgroups per KV head along x (head subgroups of GH heads): the uniform's own word.
fn nsub() -> u32 {
    return dims.own;
}

// Where the partials' (max, sum) pairs start in `part`: the uniform's second own word.
fn ml_off() -> u32 {
    return dims.own2;
}
