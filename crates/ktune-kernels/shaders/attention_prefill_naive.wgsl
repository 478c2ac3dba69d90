// Prefill attention, textbook form: the score matrix is materialised in a scratch
// buffer `sc[tokens, heads, kv_len]` and the three stages run as three dispatches.
//   scores  (one invocation per score): sc = scale * q · K[j] for visible keys,
//           NEG elsewhere (K rows at or past kv_len are never read);
//   softmax (one workgroup per (token, head) row): max and sum by tree reductions,
//           the visible scores become probabilities in place;
//   pv      (one invocation per 16-byte output word): out = Σ_j p_j V[j] over the
//           row's visible keys.
// Query at token i has position kv_len - tokens + i and sees keys (pos - window, pos]
// (every key up to pos when window == 0), and every key of the bidirectional block
// [b0, b1) when pos lies in it (attention.wgsl's key_lo, key_hi). Query head h reads KV head h / (heads / kv_heads).
//
// Bindings are unique across the module; each entry binds its subset:
//   scores: q@0 k_cache@1 dims@4 sc@5;  softmax: dims@4 sc@5;  pv: v_cache@2 out@3 dims@4 sc@5
// K/V are u32 words decoded by W_F16 (vec4<u32> = 4 f32 or 8 packed f16), so
// head_dim % 4 == 0 (f32) or % 8 == 0 (f16); WG must be a power of two.
// Head: attention_dims.wgsl (W_F16, Dims; its own word is head_dim).
// Includes: attention.wgsl, reduce_wg.wgsl (the trees), wload.wgsl (W_F16, 16-byte words).
// Requires: attention_dims.wgsl, attention.wgsl, reduce_wg.wgsl.

override WG: u32 = 128;

@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> sc: array<f32>;

var<workgroup> partial: array<f32, WG>;

// The head dimension (the uniform's own word).
fn head_dim() -> u32 {
    return dims.own;
}

// Absolute position of the query at token index i.
fn position(i: u32) -> u32 {
    return dims.kv_len - dims.tokens + i;
}

@compute @workgroup_size(WG)
fn scores(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) tid: u32) {
    let idx = (wid.x + wid.y * nwg.x) * WG + tid;
    let kv_len = dims.kv_len;
    if (idx >= dims.tokens * dims.heads * kv_len) {
        return;
    }
    let row = idx / kv_len;
    let j = idx % kv_len;
    let i = row / dims.heads;
    let h = row % dims.heads;
    let kh = kv_head(h, dims.heads, dims.kv_heads);
    let pos = position(i);
    var s = NEG;
    if (j <= key_hi(pos, dims.b0, dims.b1) && j >= key_lo(pos, dims.window, dims.b0, dims.b1)) {
        let n = wwords16(head_dim());
        let hd4 = head_dim() / 4u;
        let qb = row * hd4;
        let kb = (kh * dims.kv_cap + j) * n;
        var acc = vec4<f32>(0.0);
        for (var c = 0u; c < n; c++) {
            let qi = qb + wx16(c);
            acc += kv_mul16(k_word(kb + c), q[qi.x], q[qi.y]);
        }
        s = (acc.x + acc.y + acc.z + acc.w) * dims.scale;
    }
    sc[idx] = s;
}

@compute @workgroup_size(WG)
fn softmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) tid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= dims.tokens * dims.heads) {
        return;
    }
    let pos = position(row / dims.heads);
    let lo = key_lo(pos, dims.window, dims.b0, dims.b1);
    let hi = key_hi(pos, dims.b0, dims.b1);
    let base = row * dims.kv_len;
    var mx = NEG;
    for (var j = lo + tid; j <= hi; j += WG) {
        mx = max(mx, sc[base + j]);
    }
    mx = row_max(mx, tid);
    workgroupBarrier();
    var sum = 0.0;
    for (var j = lo + tid; j <= hi; j += WG) {
        sum += exp(sc[base + j] - mx);
    }
    let inv = 1.0 / row_sum(sum, tid);
    for (var j = lo + tid; j <= hi; j += WG) {
        sc[base + j] = exp(sc[base + j] - mx) * inv;
    }
}

@compute @workgroup_size(WG)
fn pv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
      @builtin(local_invocation_index) tid: u32) {
    let idx = (wid.x + wid.y * nwg.x) * WG + tid;
    let n = wwords16(head_dim());
    if (idx >= dims.tokens * dims.heads * n) {
        return;
    }
    let row = idx / n;
    let lane = idx % n;
    let h = row % dims.heads;
    let kh = kv_head(h, dims.heads, dims.kv_heads);
    let pos = position(row / dims.heads);
    let base = row * dims.kv_len;
    let vb = kh * dims.kv_cap;
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    let hi = key_hi(pos, dims.b0, dims.b1);
    for (var j = key_lo(pos, dims.window, dims.b0, dims.b1); j <= hi; j++) {
        let p = sc[base + j];
        let w = v_word((vb + j) * n + lane);
        a0 += p * w.lo;
        if (W_F16) {
            a1 += p * w.hi;
        }
    }
    let o = row * head_dim() + lane * word_elems();
    for (var e = 0u; e < word_elems(); e++) {
        out[o + e] = word_elem(a0, a1, e);
    }
}
