// The workgroup's largest (key, index) pair, the FIRST index on equal keys, key 0
// meaning no candidate: the greedy pick of select_argmax.wgsl and the sampler's
// maximum (sample.wgsl). Reads the including shader's `WG` and its workgroup
// arrays `red_a` / `red_b` (WG u32 each, free on entry); every invocation calls
// `wg_argmax`, in uniform control flow.

// Whether candidate (k, i) beats (bk, bi): a larger key, or the same at a smaller index.
fn beats(k: u32, i: u32, bk: u32, bi: u32) -> bool {
    return k > bk || (k == bk && k != 0u && i < bi);
}

// The best of every invocation's (k, i): (key, index), the same in every invocation.
fn wg_argmax(lid: u32, k: u32, i: u32) -> vec2<u32> {
    red_a[lid] = k;
    red_b[lid] = i;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s && beats(red_a[lid + s], red_b[lid + s], red_a[lid], red_b[lid])) {
            red_a[lid] = red_a[lid + s];
            red_b[lid] = red_b[lid + s];
        }
        workgroupBarrier();
    }
    return vec2<u32>(red_a[0], red_b[0]);
}
