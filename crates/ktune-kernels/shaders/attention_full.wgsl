// The bindings of the bidirectional attention kernels (attention_full_rows,
// attention_full_flash; the SigLIP encoder): q, k, v and out, [tokens, heads,
// head_dim] f32 read as vec4, and the uniform block (hd4 = head_dim / 4).

struct Dims { tokens: u32, heads: u32, hd4: u32, scale: f32 }

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> k: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> v: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> dims: Dims;
