// Entry point `main` of the shaders that give each output element an invocation
// (`shader!(FILE, "grid_main.wgsl", "grid.wgsl")`): invocation i of the dispatch
// (grid.wgsl's `invocation`: a 1-D grid that the host lays over x and y) runs the
// shader's `fn run_item(i: u32)` for i below its `fn item_count() -> u32`. Uses
// the shader's `override WG: u32`, its workgroup size.
// Requires: grid.wgsl.

@compute @workgroup_size(WG)
fn main(g: Grid) {
    let i = invocation(g);
    if (i < item_count()) {
        run_item(i);
    }
}
