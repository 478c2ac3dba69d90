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
                failures.push(format!("{}: parse error:\n{}", s.label(), e.emit_to_string(s.source)));
                continue;
            }
        };
        let mut v = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all());
        if let Err(e) = v.validate(&module) {
            failures.push(format!("{}: validation error: {e:?}", s.label()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn every_shader_file_is_used_by_a_kernel() {
    let used: Vec<_> = all_shaders().iter().flat_map(|s| s.files()).collect();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/shaders");
    for entry in std::fs::read_dir(dir).expect("shaders/ exists") {
        let name = entry.expect("dir entry").file_name().to_string_lossy().to_string();
        if name.ends_with(".wgsl") {
            assert!(used.contains(&name.as_str()), "shaders/{name} is not used by any kernel in the registry nor by the runtime");
        }
    }
}

fn shader_text(file: &str) -> String {
    std::fs::read_to_string(format!("{}/shaders/{file}", env!("CARGO_MANIFEST_DIR"))).expect("shader file exists")
}

/// Each file has one role: a head (prepended), a shader's own file, or an include
/// (appended). Includes declare no `override`: an override declared in an appended
/// include, after an array sized by overrides, trips naga's pipeline-constant pass
/// (a panic at pipeline creation, not at validation). The overrides live in the
/// heads and the shaders' own files, which come first.
#[test]
fn includes_declare_no_override() {
    let shaders = all_shaders();
    let heads: Vec<_> = shaders.iter().flat_map(|s| s.heads.iter().copied()).collect();
    let mains: Vec<_> = shaders.iter().map(|s| s.name).collect();
    let includes: Vec<_> = shaders.iter().flat_map(|s| s.includes.iter().copied()).collect();
    assert!(!heads.is_empty(), "no shader has a head");
    for head in &heads {
        assert!(!mains.contains(head) && !includes.contains(head), "shaders/{head} is both a head and another shader's file");
    }
    for include in includes {
        assert!(!mains.contains(&include), "shaders/{include} is both a kernel's shader and an include");
        let text = shader_text(include);
        let line = text.lines().find(|l| l.trim_start().starts_with("override "));
        assert!(line.is_none(), "shaders/{include} declares an override: {}", line.unwrap_or_default());
    }
}

/// The files a file says it needs, in a line `// Requires: a.wgsl, b.wgsl`.
fn required(text: &str) -> Vec<String> {
    let line = text.lines().find_map(|l| l.trim_start().strip_prefix("// Requires:"));
    line.map(|l| l.split(',').map(|f| f.trim().trim_end_matches('.').to_string()).collect()).unwrap_or_default()
}

/// A file that needs others (its `// Requires:` line) is only used by shaders
/// that list every one of them, as a head, their own file or an include.
#[test]
fn every_shader_lists_what_its_files_require() {
    let mut declaring = 0;
    for s in all_shaders() {
        let files: Vec<_> = s.files().collect();
        for file in &files {
            let needs = required(&shader_text(file));
            declaring += usize::from(!needs.is_empty());
            for need in needs {
                assert!(need.ends_with(".wgsl"), "shaders/{file}: `// Requires:` names `{need}`, not a .wgsl file");
                // position_rows.wgsl stands in for position.wgsl (`Shader::rows_form`).
                let met = files.contains(&need.as_str()) || (need == "position.wgsl" && files.contains(&"position_rows.wgsl"));
                assert!(met, "{} uses shaders/{file}, which requires {need}", s.label());
            }
        }
    }
    assert!(declaring > 0, "no shader file declares what it requires");
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
    let labels: Vec<_> = coop.iter().map(|s| s.label()).collect();
    let wanted = [
        ("coop8.wgsl", "qgemm_mma.wgsl"),
        ("coop16.wgsl", "qgemm_mma.wgsl"),
        ("coop8.wgsl", "gemm_mma.wgsl"),
        ("coop16.wgsl", "gemm_mma.wgsl"),
        ("coop16.wgsl", "attn_mma.wgsl"),
    ];
    for (head, name) in wanted {
        assert!(
            coop.iter().any(|s| s.heads.contains(&head) && s.name == name),
            "{head} + {name} missing from the cooperative-matrix shaders {labels:?}"
        );
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
        let module = naga::front::wgsl::parse_str(s.source).unwrap_or_else(|e| panic!("{}: {}", s.label(), e.emit_to_string(s.source)));
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}: {e:?}", s.label()));
        for consts in settings {
            let mut pc = naga::back::PipelineConstants::default();
            for &(k, v) in consts.iter().filter(|(k, _)| s.source.contains(&format!("override {k}:"))) {
                pc.insert(k.to_string(), v);
            }
            let entry = Some((naga::ShaderStage::Compute, "main"));
            let (m, i) = naga::back::pipeline_constants::process_overrides(&module, &info, entry, &pc)
                .unwrap_or_else(|e| panic!("{} {consts:?}: {e:?}", s.label()));
            let opts = naga::back::spv::Options { lang_version: (1, 3), ..Default::default() };
            let pipe = naga::back::spv::PipelineOptions { shader_stage: naga::ShaderStage::Compute, entry_point: "main".into() };
            let words =
                naga::back::spv::write_vec(&m, &i, &opts, Some(&pipe)).unwrap_or_else(|e| panic!("{} {consts:?}: {e:?}", s.label()));
            let ops = spirv_opcodes(&words);
            for (op, what) in [(TYPE, "matrix type"), (LOAD, "load"), (MULADD, "multiply-add"), (STORE, "store")] {
                assert!(ops.contains(&op), "{} {consts:?}: no cooperative-matrix {what} in the SPIR-V", s.label());
            }
        }
    }
}
