//! Every WGSL shader (the kernel set's and the runtime's plumbing) parses and
//! validates with naga, without a GPU.

use ktune::{kernels, runtime};

fn all_shaders() -> Vec<&'static ktune::gpu::Shader> {
    let mut v = kernels::shaders();
    v.extend(runtime::gpu::shaders());
    v.extend(ktune::tuner::kbench::shaders());
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
