//! Every WGSL shader (the kernel set's and the runtime's plumbing) parses and
//! validates with naga, without a GPU.

use ktune_kernels::{gpu, kernels};

fn all_shaders() -> Vec<&'static gpu::Shader> {
    let mut v = kernels::shaders();
    v.extend(gpu::builtin::shaders());
    v
}

#[test]
fn every_shader_validates_with_naga() {
    let shaders = all_shaders();
    assert!(!shaders.is_empty(), "the kernel set has no WGSL shader");
    let mut failures = Vec::new();
    for s in shaders {
        let module = match naga::front::wgsl::parse_str(s.source) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{}: parse error:\n{}", s.name, e.emit_to_string(s.source)));
                continue;
            }
        };
        let mut v = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all());
        if let Err(e) = v.validate(&module) {
            failures.push(format!("{}: validation error: {e:?}", s.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn every_shader_file_is_used_by_a_kernel() {
    let used: Vec<_> = all_shaders().iter().flat_map(|s| std::iter::once(s.name).chain(s.includes.iter().copied())).collect();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/shaders");
    for entry in std::fs::read_dir(dir).expect("shaders/ exists") {
        let name = entry.expect("dir entry").file_name().to_string_lossy().to_string();
        if name.ends_with(".wgsl") {
            assert!(used.contains(&name.as_str()), "shaders/{name} is not used by any kernel in the registry nor by the runtime");
        }
    }
}

/// Includes (files that shaders append, never a kernel's own file) declare no
/// `override`: an override declared in an appended include, after an array sized by
/// overrides, trips naga's pipeline-constant pass (a panic at pipeline creation, not
/// at validation). Each shader keeps its overrides in its own file.
#[test]
fn includes_declare_no_override() {
    let shaders = all_shaders();
    let mains: Vec<_> = shaders.iter().map(|s| s.name).collect();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/shaders");
    for include in shaders.iter().flat_map(|s| s.includes.iter().copied()) {
        assert!(!mains.contains(&include), "shaders/{include} is both a kernel's shader and an include");
        let text = std::fs::read_to_string(format!("{dir}/{include}")).expect("include exists");
        let line = text.lines().find(|l| l.trim_start().starts_with("override "));
        assert!(line.is_none(), "shaders/{include} declares an override: {}", line.unwrap_or_default());
    }
}

/// Instructions of a SPIR-V module, by opcode.
fn spirv_opcodes(words: &[u32]) -> Vec<u16> {
    let mut ops = Vec::new();
    let mut i = 5; // after the header
    while i < words.len() {
        let len = (words[i] >> 16) as usize;
        ops.push((words[i] & 0xffff) as u16);
        i += len.max(1);
    }
    ops
}

/// The cooperative-matrix shaders cannot run on the software adapter (no matrix
/// units), so beyond naga's validation above they go through naga's SPIR-V backend,
/// what wgpu's Vulkan path does with them, at the default overrides and at the
/// largest tiling the host admits, and must come out as cooperative-matrix loads,
/// multiply-adds and stores.
#[test]
fn cooperative_matrix_shaders_translate_to_spirv() {
    const TYPE: u16 = 4456; // OpTypeCooperativeMatrixKHR
    const LOAD: u16 = 4457;
    const STORE: u16 = 4458;
    const MULADD: u16 = 4459;
    let coop: Vec<_> = all_shaders().into_iter().filter(|s| s.source.contains("enable wgpu_cooperative_matrix;")).collect();
    // 8x8 and 16x16, over block-format and over float weights (each also gate_up); prefill attention
    let names: Vec<_> = coop.iter().map(|s| s.name).collect();
    for want in ["qgemm_coop8.wgsl", "qgemm_coop16.wgsl", "gemm_coop8.wgsl", "gemm_coop16.wgsl", "attention_prefill_coop16.wgsl"] {
        assert!(names.contains(&want), "{want} missing from the cooperative-matrix shaders {names:?}");
    }
    // defaults; the largest gemm tiling the host admits; gate_up (two weight
    // matrices) at its largest, f16 weights; the attention's largest tiling (64
    // queries x 64 keys, 4 subgroups of 8 output matrices, head_dim 128, f16 cache);
    // two tile buffers (the next step's loads in flight) at the deepest step whose
    // loads fit the registers; each shader takes the overrides it declares
    let settings: [&[(&str, f64)]; 5] = [
        &[],
        &[("BQ", 64.0), ("BK", 64.0), ("NSG", 4.0), ("WGS", 128.0), ("NS", 4.0), ("NO", 8.0), ("HD", 128.0), ("W_F16", 1.0)],
        &[("SG_M", 4.0), ("MAT_M", 4.0), ("MAT_N", 2.0), ("TILE_K", 64.0), ("WGS", 512.0), ("QFMT", 7.0)],
        &[("SG_M", 2.0), ("SG_N", 4.0), ("MAT_M", 2.0), ("MAT_N", 2.0), ("W_MATS", 2.0), ("WGS", 256.0), ("QFMT", 9.0), ("W_F16", 1.0)],
        &[("TILE_K", 64.0), ("STAGES", 2.0), ("QFMT", 7.0)],
    ];
    for s in coop {
        let module = naga::front::wgsl::parse_str(s.source).unwrap_or_else(|e| panic!("{}: {}", s.name, e.emit_to_string(s.source)));
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}: {e:?}", s.name));
        for consts in settings {
            let mut pc = naga::back::PipelineConstants::default();
            for &(k, v) in consts.iter().filter(|(k, _)| s.source.contains(&format!("override {k}:"))) {
                pc.insert(k.to_string(), v);
            }
            let entry = Some((naga::ShaderStage::Compute, "main"));
            let (m, i) = naga::back::pipeline_constants::process_overrides(&module, &info, entry, &pc)
                .unwrap_or_else(|e| panic!("{} {consts:?}: {e:?}", s.name));
            let opts = naga::back::spv::Options { lang_version: (1, 3), ..Default::default() };
            let pipe = naga::back::spv::PipelineOptions { shader_stage: naga::ShaderStage::Compute, entry_point: "main".into() };
            let words = naga::back::spv::write_vec(&m, &i, &opts, Some(&pipe)).unwrap_or_else(|e| panic!("{} {consts:?}: {e:?}", s.name));
            let ops = spirv_opcodes(&words);
            for (op, what) in [(TYPE, "matrix type"), (LOAD, "load"), (MULADD, "multiply-add"), (STORE, "store")] {
                assert!(ops.contains(&op), "{} {consts:?}: no cooperative-matrix {what} in the SPIR-V", s.name);
            }
        }
    }
}
