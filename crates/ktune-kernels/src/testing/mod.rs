//! Helpers for tests and benchmarks: opening the GPU the suite runs on, and the
//! source walk, import reader ([`layering`]) and cycle search of the layering
//! tests (this crate's and ktune's).
//!
//! GPU tests run for real on any adapter, software ones (lavapipe) included. When
//! none exists they skip loudly, unless `KTUNE_REQUIRE_GPU=1` or `CI=true` (every CI
//! service sets it), in which case they fail.

pub mod layering;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::device::{self, Device};
use crate::gpu::GpuCtx;

/// Environment variable that turns a missing GPU adapter into a test failure.
pub const REQUIRE_GPU_ENV: &str = "KTUNE_REQUIRE_GPU";

/// Whether a missing GPU adapter fails the GPU tests: `KTUNE_REQUIRE_GPU=1`, or
/// `CI=true` unless `KTUNE_REQUIRE_GPU=0` says otherwise.
pub fn gpu_required() -> bool {
    match std::env::var(REQUIRE_GPU_ENV).as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => std::env::var("CI").is_ok_and(|v| v == "true" || v == "1"),
    }
}

/// How many devices [`test_gpu`] opens on its adapter: `KTUNE_TEST_DEVICES`, else
/// the machine's parallelism (at most 4). A software adapter compiles each
/// pipeline's machine code on its device's one queue thread, when the pipeline
/// first runs; tests on threads of their own with a device each compile side by
/// side instead of queueing behind that one thread (a cold lavapipe parity sweep
/// is mostly compiling).
pub const TEST_DEVICES_ENV: &str = "KTUNE_TEST_DEVICES";

fn test_device_count() -> usize {
    std::env::var(TEST_DEVICES_ENV)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, HOLDERS.len())
}

/// Pipelines each test device keeps built. A sweep uses a pipeline over all its
/// shapes before the next (`verify::verify_kernel`'s loop order) and a program
/// holds a few, so a small bound rebuilds nothing while keeping a cold lavapipe
/// sweep's memory down (each pipeline holds its machine code: with 128 a device
/// over 2 devices the parity binary peaked at 2.0 GB).
pub const TEST_PIPELINES_PER_DEVICE: usize = 32;

/// Every device [`test_gpu`] opened (empty before the first call, and without a
/// GPU): for figures over the whole run, such as [`GpuCtx::pipeline_stats`].
pub fn test_gpus() -> &'static [Arc<GpuCtx>] {
    TEST_GPUS.get().map_or(&[], |g| g.as_deref().unwrap_or(&[]))
}

static TEST_GPUS: OnceLock<Option<Vec<Arc<GpuCtx>>>> = OnceLock::new();

/// The first GPU adapter (hardware preferred, software accepted), opened once per
/// process as a few devices ([`TEST_DEVICES_ENV`]); a thread gets one of them,
/// the same on every call (the least held when it first asks). `None` (with a loud message) when there
/// is none and it is not required.
pub fn test_gpu() -> Option<Arc<GpuCtx>> {
    let gpus = TEST_GPUS.get_or_init(|| {
        software_compile_fast();
        let devices = device::discover();
        let pick = devices
            .iter()
            .position(|d| matches!(d, Device::Gpu(g) if !g.info.software))
            .or_else(|| devices.iter().position(|d| matches!(d, Device::Gpu(_))));
        let required = gpu_required();
        match pick.map(|i| &devices[i]) {
            Some(Device::Gpu(g)) => match (0..test_device_count()).map(|_| GpuCtx::open(g)).collect::<Result<Vec<_>, _>>() {
                Ok(ctxs) => {
                    ctxs.iter().for_each(|c| c.limit_pipelines(TEST_PIPELINES_PER_DEVICE));
                    Some(ctxs)
                }
                Err(e) if required => panic!("{REQUIRE_GPU_ENV}=1 but the GPU adapter could not be opened: {e}"),
                Err(e) => {
                    eprintln!("\n!!!! SKIPPING GPU TESTS: adapter could not be opened: {e} !!!!\n");
                    None
                }
            },
            _ if required => panic!(
                "{REQUIRE_GPU_ENV}=1 but no GPU adapter was found (install a Vulkan driver, e.g. mesa-vulkan-drivers)"
            ),
            _ => {
                eprintln!(
                    "\n!!!! SKIPPING GPU TESTS: no GPU adapter found (install mesa-vulkan-drivers for lavapipe, or set {REQUIRE_GPU_ENV}=1 to fail instead) !!!!\n"
                );
                None
            }
        }
    });
    let gpus = gpus.as_ref()?;
    thread_local! {
        static SLOT: DeviceSlot = DeviceSlot::take();
    }
    Some(gpus[SLOT.with(|s| s.0) % gpus.len()].clone())
}

/// Mesa's software drivers (lavapipe, llvmpipe) read `GALLIVM_PERF` once, when the
/// first device opens; with `nopt` they skip LLVM's IR optimization passes. A cold
/// parity sweep on lavapipe is mostly compiling and its kernels run on tiny
/// shapes, so this takes about 30% off it (`wgsl/gemm_q_mma_emu`, cold cache:
/// 103 s -> 73 s); the kernels' results are checked the same way. Only when the
/// variable is unset: `GALLIVM_PERF= cargo test` tests optimized machine code.
fn software_compile_fast() {
    const VAR: &str = "GALLIVM_PERF";
    if std::env::var_os(VAR).is_none() {
        // SAFETY: called once, inside `TEST_GPUS`'s initialisation and before any
        // adapter is opened: no other thread is inside the Vulkan loader or a
        // driver (every test reaches the GPU through this function and waits on
        // that initialisation), and Rust's own environment reads take the lock
        // `set_var` takes.
        unsafe { std::env::set_var(VAR, "nopt") };
    }
}

/// Threads holding each test device (index modulo the device count).
static HOLDERS: [std::sync::atomic::AtomicUsize; 4] = [const { std::sync::atomic::AtomicUsize::new(0) }; 4];

/// A thread's test device for its lifetime: the one fewest live threads hold when
/// it first asks (libtest runs each test on a thread of its own, so concurrent
/// tests land on different devices), given back when the thread ends.
struct DeviceSlot(usize);

impl DeviceSlot {
    fn take() -> DeviceSlot {
        use std::sync::atomic::Ordering::SeqCst;
        let n = test_gpus().len().clamp(1, HOLDERS.len());
        let i = (0..n).min_by_key(|&i| HOLDERS[i].load(SeqCst)).unwrap_or(0);
        HOLDERS[i].fetch_add(1, SeqCst);
        DeviceSlot(i)
    }
}

impl Drop for DeviceSlot {
    fn drop(&mut self) {
        HOLDERS[self.0].fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The limits of a typical desktop adapter with subgroups of 8 to 32 lanes and
/// shader f16, for validity tests that vary one field at a time.
pub fn typical_gpu_caps() -> crate::device::GpuCaps {
    crate::device::GpuCaps {
        shader_f16: true,
        subgroups: true,
        subgroup_min_size: 8,
        subgroup_max_size: 32,
        timestamp_query: true,
        timestamp_inside_passes: true,
        max_workgroup_storage: 16384,
        max_invocations_per_workgroup: 256,
        max_workgroup_size: [256, 256, 64],
        max_workgroups_per_dimension: 65535,
        max_storage_binding: 1 << 30,
        max_buffer_size: 1 << 30,
        max_storage_buffers_per_stage: 8,
        coop_matrix: Vec::new(),
        software: false,
    }
}

/// An adapter with matrix units, as NVIDIA's Vulkan driver reports one: subgroups
/// of 32, 48 KiB of workgroup memory, workgroups of 1024, and the square
/// cooperative matrix shapes `shapes` (`(m, ab, cr)`: `m`×`m`×`m`, `ab` operands,
/// a `cr` result); the rest as [`typical_gpu_caps`].
pub fn coop_gpu_caps(shapes: &[(u32, &'static str, &'static str)]) -> crate::device::GpuCaps {
    crate::device::GpuCaps {
        subgroup_min_size: 32,
        subgroup_max_size: 32,
        max_workgroup_storage: 49152,
        max_invocations_per_workgroup: 1024,
        max_workgroup_size: [1024, 1024, 64],
        coop_matrix: shapes.iter().map(|&(m, ab, cr)| crate::device::CoopShape { m, n: m, k: m, ab, cr }).collect(),
        ..typical_gpu_caps()
    }
}

/// Every `.rs` file under `dir`, sorted.
pub fn rust_sources(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Whether `from` reaches `to` along the edges of an import graph (module -> the
/// modules it imports).
pub fn reaches(g: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_string()];
    while let Some(m) = stack.pop() {
        for n in g.get(&m).into_iter().flatten() {
            if n == to {
                return true;
            }
            if seen.insert(n.clone()) {
                stack.push(n.clone());
            }
        }
    }
    false
}

/// The edges of an import graph that close a cycle, as `a -> b`: those whose
/// target reaches back to their source.
pub fn import_cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    g.iter().flat_map(|(a, bs)| bs.iter().filter(|b| reaches(g, b, a)).map(move |b| format!("{a} -> {b}"))).collect()
}
