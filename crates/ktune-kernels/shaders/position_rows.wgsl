// The positions of a pass whose rows stand each at its own position (a batch of
// sequences, each a decode token or a prompt's chunk): position.wgsl's
// `row_position` with the binding 7 a storage buffer of one u32 a row, written by
// the host each pass. It takes position.wgsl's place in a shader
// (`Shader::rows_form`), so a kernel that reads its position through
// `row_position` (RoPE, the fused q/k norm + RoPE) serves both.

@group(0) @binding(7) var<storage, read> position_rows: array<u32>;

// The position of the pass's row `r`.
fn row_position(r: u32) -> u32 {
    return position_rows[r];
}
