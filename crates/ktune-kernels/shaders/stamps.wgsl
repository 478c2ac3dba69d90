// The GPU time of a chain of decode steps (runtime/gpu.rs, `TokenStamps`): each
// step's first pass writes a timestamp as it begins and its last pass (the token's
// pick) one as it ends; the chain resolves the pairs (u64 ticks as lo, hi words)
// into `stamps`, and this entry sums the steps' spans (end - start, with the
// borrow across words) as f32 ticks into the word of `ids` after the chain's last
// id (the slot position.wgsl's `slot` holds once the chain has run), so the span
// comes back with the ids: 4 bytes a chain. The host multiplies by the queue's
// timestamp period.

@group(0) @binding(0) var<storage, read> stamps: array<u32>;
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;

@compute @workgroup_size(1)
fn sum_spans() {
    let n = position.slot;
    var ticks = 0.0;
    for (var j = 0u; j < n; j = j + 1u) {
        let b = 4u * j;
        let lo = stamps[b + 2u] - stamps[b];
        let borrow = select(0u, 1u, stamps[b + 2u] < stamps[b]);
        let hi = stamps[b + 3u] - stamps[b + 1u] - borrow;
        ticks = ticks + f32(hi) * 4294967296.0 + f32(lo);
    }
    if (n < arrayLength(&ids)) {
        ids[n] = bitcast<u32>(ticks);
    }
}
