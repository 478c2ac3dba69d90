// Decode steps chained on the GPU (runtime/gpu.rs, `Picker`): what runs between
// the LM head and the next step's embedding so that the host neither reads the
// logits nor writes the next token.
// `gather`: one LM-head block's logits into the vocabulary row the sampler reads,
// softcapped as select_argmax.wgsl softcaps (softcap.wgsl); one dispatch per
// block.
// `advance`: one invocation reads the step's selected id (`picked[at]`, the
// argmax's 0xffffffff read as 0 as `Selector::token` reads it), stores it in
// slot `position.slot` of `ids` (copied to a mappable ring buffer once per
// chain), and moves the position buffer (position.wgsl's words, bound here as
// storage) to the next step: pos0 + 1, kv_len + 1, the id as its token, slot + 1.
// Requires: grid.wgsl, softcap.wgsl.

override WG: u32 = 256;

struct Gather {
    rows: u32,   // logits in the block
    start: u32,  // the block's first vocabulary row
    cap: f32,    // final logit softcapping (0: none)
    pad: u32,
}

@group(0) @binding(0) var<storage, read> block: array<f32>;
@group(0) @binding(1) var<storage, read_write> row: array<f32>;
@group(0) @binding(2) var<uniform> g: Gather;

@compute @workgroup_size(WG)
fn gather(grid: Grid) {
    let i = invocation(grid);
    if (i >= g.rows) {
        return;
    }
    row[g.start + i] = bitcast<f32>(softcap_bits(bitcast<u32>(block[i]), g.cap));
}

struct Advance {
    at: u32,  // the word of `picked` holding the id
    p1: u32,
    p2: u32,
    p3: u32,
}

@group(0) @binding(0) var<storage, read> picked: array<u32>;
// pos0, kv_len, token, slot (position.wgsl's `Position`).
@group(0) @binding(1) var<storage, read_write> pos: array<u32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<uniform> adv: Advance;

@compute @workgroup_size(1)
fn advance() {
    var id = picked[adv.at];
    if (id == 0xffffffffu) {
        id = 0u;
    }
    let slot = pos[3];
    if (slot < arrayLength(&ids)) {
        ids[slot] = id;
    }
    pos[0] = pos[0] + 1u;
    pos[1] = pos[1] + 1u;
    pos[2] = id;
    pos[3] = slot + 1u;
}
