// First head of the shaders on cooperative matrices (wgpu's
// EXPERIMENTAL_COOPERATIVE_MATRIX), before coop8.wgsl or coop16.wgsl: the
// extensions they enable (enable directives come before any declaration).
enable f16;
enable wgpu_cooperative_matrix;
