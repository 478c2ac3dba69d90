// The position of a forward pass (`shader!(.., "position.wgsl")`): the first
// position pos0 of the pass's tokens and the KV length after them (pos0 + tokens),
// in one 16-byte uniform buffer at binding 7. The runtime writes it once a pass
// and builds the programs that read it once per schedule (the same command stream
// every token); a kernel prepared on its own gets a buffer of its problem's values
// (kernels/mod.rs, WgslSetup::position). Read by RoPE (rope.wgsl, the fused q/k
// norm + RoPE), the KV-cache write (runtime_plumb.wgsl) and the decode attention
// kernels, instead of the position words of their own uniform blocks; a decode
// step's token id rides along for the GPU embedding (embed.wgsl). In a chain of
// decode steps the GPU advances these words itself (chain.wgsl's `advance`, which
// binds the buffer as storage): the next position, the selected id as the next
// token, and the step's slot in the chain's id buffer. A pass whose rows stand at
// positions of their own (a batch of sequences) reads them through `row_position`
// from position_rows.wgsl, which takes this file's place (`Shader::rows_form`).

struct Position {
    pos0: u32,
    kv_len: u32,
    token: u32,  // a decode step's token id (embed.wgsl); 0 elsewhere
    slot: u32,   // a chained decode step's slot in the chain (chain.wgsl); 0 elsewhere
}

@group(0) @binding(7) var<uniform> position: Position;

// The position of the pass's row `r` (its token index): pos0 + r.
fn row_position(r: u32) -> u32 {
    return position.pos0 + r;
}
