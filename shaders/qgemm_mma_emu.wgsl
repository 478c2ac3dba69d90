// Quantized GEMM y[m,n] = x[m,k] · w[n,k]ᵀ with the tiling of qgemm_coop8 /
// qgemm_coop16 (qgemm_mma.wgsl: the same f16 tiles, staging, matrix bases, strides
// and result slots) and the matrix operations written as plain loops: a virtual
// subgroup of 32 invocations (s = tid / 32) owns the same MAT_M x MAT_N matrices of
// MAT x MAT, each lane MAT·MAT/32 elements of each (element lane + 32q, row-major).
// A "load" reads A row-major and B column-major at stride xstride() from the same
// bases as coopLoadT / coopLoad, the multiply-add sums f16 products in f32, and the
// "store" writes the slot row-major at stride MAT as coopStoreT does. It runs where
// there are no matrix units, which is how the coop tiling is tested on a software
// adapter, and is a SIMT GEMM with f16 tiles in its own right.
enable f16;

override MAT: u32 = 16;   // matrix side, 8 or 16
override SG_M: u32 = 2;
override SG_N: u32 = 2;
override MAT_M: u32 = 2;
override MAT_N: u32 = 2;  // MAT_M * MAT_N * MAT * MAT / 32 <= 64 (checked on the host)
override TILE_K: u32 = 32;
override QFMT: u32 = 0u;
override WGS: u32 = 128;  // SG_M * SG_N * 32

struct Dims { m: u32, n: u32, k: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> ws: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;

var<workgroup> xs: array<f16, SG_M * MAT_M * MAT * (TILE_K + 8u)>;
var<workgroup> wt: array<f16, SG_N * MAT_N * MAT * (TILE_K + 8u)>;
var<workgroup> cs: array<f32, SG_M * SG_N * MAT * MAT>;

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let s = tid / 32u;
    let lane = tid % 32u;
    let sm = s / SG_N;
    let sn = s % SG_N;
    let m0 = wid.y * tile_m();
    let n0 = wid.x * tile_n();
    let nch = dims.k / 32u;
    let per = MAT * MAT / 32u; // elements of a matrix per lane
    let xs_row = xstride();
    var acc: array<f32, 64>;
    for (var i = 0u; i < MAT_M * MAT_N * per; i++) {
        acc[i] = 0.0;
    }
    for (var c0 = 0u; c0 < nch; c0 += TILE_K / 32u) {
        stage(c0, tid, m0, n0);
        workgroupBarrier();
        for (var kk = 0u; kk < TILE_K / MAT; kk++) {
            for (var mi = 0u; mi < MAT_M; mi++) {
                let ab = a_base(sm, mi, kk);
                for (var nj = 0u; nj < MAT_N; nj++) {
                    let bb = b_base(sn, nj, kk);
                    for (var q = 0u; q < per; q++) {
                        let e = lane + 32u * q;
                        let r = e / MAT;
                        let c = e % MAT;
                        var sum = 0.0;
                        for (var t = 0u; t < MAT; t++) {
                            sum += f32(xs[ab + r * xs_row + t]) * f32(wt[bb + c * xs_row + t]);
                        }
                        acc[(mi * MAT_N + nj) * per + q] += sum;
                    }
                }
            }
        }
        workgroupBarrier();
    }
    for (var mi = 0u; mi < MAT_M; mi++) {
        for (var nj = 0u; nj < MAT_N; nj++) {
            for (var q = 0u; q < per; q++) {
                cs[c_slot(s) + lane + 32u * q] = acc[(mi * MAT_N + nj) * per + q];
            }
            workgroupBarrier();
            write_out(mi, nj, tid, m0, n0);
            workgroupBarrier();
        }
    }
}
