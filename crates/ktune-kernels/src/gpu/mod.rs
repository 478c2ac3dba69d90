//! The wgpu context: one device and queue per adapter, the pipeline cache keyed by
//! shader, entry point and `override` constants, buffer helpers, programs (the
//! dispatches of one kernel variant, built once and recorded many times),
//! timestamp-query timing, and the counters of what the context does on the
//! host's behalf ([`GpuCounters`]: objects created, queue writes, passes,
//! dispatches, submits, waits, bytes read back), each counted in the one place
//! that does it.
//!
//! Shader modules are built checked (wgpu's runtime bounds checks) or, on
//! request, trusted ([`GpuCtx::with_trusted_shaders`]): `create_shader_module_trusted`
//! with [`wgpu::ShaderRuntimeChecks::unchecked`], for kernels whose every access the
//! host has already bounded (each kernel's `check` validates the shapes against the
//! bound buffers before a program is built). Both kinds share one cache, keyed by it.
//!
//! Conventions for shaders (see `shaders/`): bindings at `@group(0)` in the op's
//! buffer order, the uniform block right after them; weight and cache buffers are
//! declared as `u32` words and decoded with `bitcast<f32>` or `unpack2x16float`
//! chosen by the `override W_F16: bool` constant (the decoders are in
//! `shaders/wload.wgsl`), so one shader serves both dtypes without `SHADER_F16`.
//! GPU buffers are padded to 16 bytes.
//!
//! Faults ([`faults`]): errors outside an error scope and the loss of the device
//! are recorded by the device's callbacks (never wgpu's panicking default) and
//! returned as a [`GpuError`] by the next wait; a wait never blocks on a lost
//! device; the big allocations run inside out-of-memory and validation scopes
//! ([`GpuCtx::allocating`]) after a check of their size against the device's
//! limits ([`GpuCtx::check_size`]).

pub mod faults;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::device::{GpuCaps, GpuDevice};

/// A WGSL shader assembled from files of `shaders/`: its heads, its own file and its
/// includes, in that order.
#[derive(Debug)]
pub struct Shader {
    /// The shader's own file (what errors and labels name it by).
    pub name: &'static str,
    /// The concatenated text of the heads, `name` and the includes.
    pub source: &'static str,
    /// Files of `shaders/` prepended to `name`'s text, in order: `override`
    /// constants, uniform structs and bindings several shaders share.
    pub heads: &'static [&'static str],
    /// Files of `shaders/` appended to `name`'s text (shared WGSL), in order.
    pub includes: &'static [&'static str],
}

impl Shader {
    /// What the module and pipeline caches know this shader by (two shaders that
    /// differ only in a head or an include are two modules).
    pub(crate) fn key(&self) -> ShaderKey {
        (self.heads, self.name, self.includes)
    }

    /// Every file of the shader in source order: heads, its own file, includes.
    pub fn files(&self) -> impl Iterator<Item = &'static str> {
        self.heads.iter().copied().chain(std::iter::once(self.name)).chain(self.includes.iter().copied())
    }

    /// Its files joined by `+`: how labels and errors name it.
    pub fn label(&self) -> String {
        self.files().collect::<Vec<_>>().join("+")
    }

    /// This shader with `position_rows.wgsl` in place of `position.wgsl`: its
    /// `row_position` then reads each row's own position from a storage buffer
    /// at the position binding (a pass over a batch of sequences); None for a
    /// shader that does not include `position.wgsl`. Made once a shader, kept for
    /// the process (the pipeline caches key it by its includes).
    pub fn rows_form(&'static self) -> Option<&'static Shader> {
        const POSITION: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/shaders/position.wgsl"));
        const ROWS: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/shaders/position_rows.wgsl"));
        static FORMS: std::sync::Mutex<Vec<(usize, &'static Shader)>> = std::sync::Mutex::new(Vec::new());
        if !self.includes.contains(&"position.wgsl") {
            return None;
        }
        let me = self as *const Shader as usize;
        let mut forms = FORMS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, f)) = forms.iter().find(|(k, _)| *k == me) {
            return Some(f);
        }
        let includes: Vec<&'static str> =
            self.includes.iter().map(|&f| if f == "position.wgsl" { "position_rows.wgsl" } else { f }).collect();
        let form: &'static Shader = Box::leak(Box::new(Shader {
            name: self.name,
            source: Box::leak(self.source.replacen(POSITION, ROWS, 1).into_boxed_str()),
            heads: self.heads,
            includes: Box::leak(includes.into_boxed_slice()),
        }));
        forms.push((me, form));
        Some(form)
    }
}

/// Declares a `Shader` for `shaders/<file>` with any number of files of shared
/// WGSL appended in order: `shader!("gemv_wg.wgsl", "reduce_wg.wgsl", "wload.wgsl")`,
/// and optionally heads prepended in order:
/// `shader!(head "mma_coop8.wgsl", "mma_tiling.wgsl"; "qgemm_mma.wgsl", "mma.wgsl", ..)`.
/// Module-scope declarations may come in any order, so an include uses what the
/// heads and the main file declare and the other way round. `override` constants
/// live in the heads and the main file only, ahead of every use: an override
/// declared after an array its siblings size trips naga's pipeline-constant pass.
/// A file that needs other files says so in a line `// Requires: a.wgsl, b.wgsl`,
/// and every shader that uses it lists them (checked by `tests/shaders.rs`).
#[macro_export]
macro_rules! shader {
    (head $($head:literal),+ ; $file:literal $(, $include:literal)* $(,)?) => {
        $crate::gpu::Shader {
            name: $file,
            source: concat!(
                $(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/shaders/", $head)), "\n",)+
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/shaders/", $file)),
                $("\n", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/shaders/", $include)),)*
            ),
            heads: &[$($head),+],
            includes: &[$($include),*],
        }
    };
    ($file:literal $(, $include:literal)* $(,)?) => {
        $crate::gpu::Shader {
            name: $file,
            source: concat!(
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/shaders/", $file)),
                $("\n", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/shaders/", $include)),)*
            ),
            heads: &[],
            includes: &[$($include),*],
        }
    };
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no GPU adapter could be opened: {0}")]
    NoAdapter(String),
    #[error("could not open a device on adapter `{adapter}`: {source}")]
    RequestDevice { adapter: String, source: wgpu::RequestDeviceError },
    #[error(
        "the GPU driver rejected shader `{shader}` entry `{entry}`: {message}; run on the CPU (`--device cpu`), or tune for this device (`ktune tune`) so that the profile picks another kernel"
    )]
    Pipeline { shader: String, entry: String, message: String },
    #[error("GPU error while {what}: {message}")]
    Validation { what: String, message: String },
    #[error("reading back a GPU buffer failed: {0}")]
    Map(String),
    #[error("waiting for the GPU failed: {0}")]
    Poll(String),
    #[error("the GPU device was lost ({0}): the driver reset it or it went away; run again, or run on the CPU (`--device cpu`)")]
    DeviceLost(String),
    #[error("the GPU ran out of memory while {what}: {message}; {FIX_SIZE}")]
    OutOfMemory { what: String, message: String },
    #[error("{what} needs {bytes} bytes, over the device's {limit_name} of {limit} bytes; {FIX_SIZE}")]
    TooLarge { what: String, bytes: u64, limit_name: &'static str, limit: u64 },
    #[error("GPU error: {0}")]
    Uncaptured(String),
    #[error("{0}")]
    Fault(String),
}

/// The fix for a GPU allocation that does not fit, as every such message gives it.
const FIX_SIZE: &str =
    "use a smaller `--context`, a quantized `--weight-dtype` (e.g. q4_k), fewer layers (`--layers`), or the CPU (`--device cpu`)";

/// A shader's identity: its heads, its file and its includes (two shaders may share
/// a file and differ in what they prepend or append to it).
pub(crate) type ShaderKey = (&'static [&'static str], &'static str, &'static [&'static str]);
/// (shader, entry, sorted override constants, trusted module).
type PipelineKey = (ShaderKey, String, Vec<(String, u64)>, bool);
type ModuleCache = Arc<Mutex<HashMap<(ShaderKey, bool), Arc<wgpu::ShaderModule>>>>;
type PipelineCache = Arc<Mutex<lru::LruCache<PipelineKey, Arc<wgpu::ComputePipeline>>>>;

/// How many compute pipelines a device has built (cache misses) and the time spent
/// building them (module creation included), wall-clock and, on Linux, the building
/// thread's CPU time (the driver compiles on the calling thread; the CPU time is the
/// figure that other work on the machine does not inflate): on a software adapter
/// the compiler is most of a parity sweep's time.
#[derive(Debug, Default)]
pub struct PipelineStats {
    built: std::sync::atomic::AtomicU64,
    wall_nanos: std::sync::atomic::AtomicU64,
    cpu_nanos: std::sync::atomic::AtomicU64,
}

impl PipelineStats {
    /// (pipelines built, wall seconds, CPU seconds spent building them).
    pub fn get(&self) -> (u64, f64, f64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.built.load(Relaxed), self.wall_nanos.load(Relaxed) as f64 * 1e-9, self.cpu_nanos.load(Relaxed) as f64 * 1e-9)
    }

    fn add(&self, since: (std::time::Instant, u64)) {
        use std::sync::atomic::Ordering::Relaxed;
        self.built.fetch_add(1, Relaxed);
        self.wall_nanos.fetch_add(since.0.elapsed().as_nanos() as u64, Relaxed);
        self.cpu_nanos.fetch_add(thread_cpu_nanos().saturating_sub(since.1), Relaxed);
    }

    fn start() -> (std::time::Instant, u64) {
        (std::time::Instant::now(), thread_cpu_nanos())
    }
}

/// Declares [`GpuCounts`] (plain totals) and [`GpuCounters`] (the same fields as
/// atomics, shared by a device's views) from one list of fields.
macro_rules! counters {
    ($($(#[$doc:meta])* $field:ident),+ $(,)?) => {
        /// What a device's context did on the host's behalf, as totals since it was
        /// opened ([`GpuCounters::snapshot`]) or between two snapshots ([`GpuCounts::since`]).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct GpuCounts {
            $($(#[$doc])* pub $field: u64,)+
        }

        /// The running totals behind [`GpuCounts`], one atomic per field, bumped where
        /// the context does the thing counted.
        #[derive(Debug, Default)]
        pub struct GpuCounters {
            $($field: std::sync::atomic::AtomicU64,)+
        }

        impl GpuCounters {
            /// The totals so far.
            pub fn snapshot(&self) -> GpuCounts {
                use std::sync::atomic::Ordering::Relaxed;
                GpuCounts { $($field: self.$field.load(Relaxed),)+ }
            }
        }

        impl GpuCounts {
            /// What happened between `earlier` and `self` (two snapshots of one device).
            pub fn since(&self, earlier: &GpuCounts) -> GpuCounts {
                GpuCounts { $($field: self.$field.saturating_sub(earlier.$field),)+ }
            }

            /// Field-wise sum.
            pub fn plus(&self, other: &GpuCounts) -> GpuCounts {
                GpuCounts { $($field: self.$field + other.$field,)+ }
            }
        }
    };
}

counters! {
    /// Compute dispatches recorded ([`GpuCtx::record`]).
    dispatches,
    /// Compute passes begun ([`GpuCtx::begin_pass`]).
    passes,
    /// Command buffers submitted ([`GpuCtx::submit`]).
    submits,
    /// `queue.write_buffer` calls and the bytes they wrote ([`GpuCtx::write`]).
    writes,
    write_bytes,
    /// Buffers created ([`GpuCtx::buffer`]).
    buffers,
    /// Bind groups created ([`GpuCtx::bind_group`]; a recycled one is not).
    bind_groups,
    /// Timestamp query sets created ([`GpuCtx::query_set`]).
    query_sets,
    /// Compute pipelines built (cache misses of [`GpuCtx::pipeline`]).
    pipelines,
    /// Host waits on the GPU: blocking polls ([`GpuCtx::wait`]), a buffer map's included.
    waits,
    /// Bytes copied out of mapped buffers to the host ([`GpuCtx::read_mapped`]).
    read_bytes,
}

/// Adds `n` to one counter.
fn bump(counter: &std::sync::atomic::AtomicU64, n: u64) {
    counter.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
}

/// The calling thread's CPU time in nanoseconds (0 where it cannot be read).
fn thread_cpu_nanos() -> u64 {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes one timespec through a valid pointer.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
            return ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
        }
    }
    0
}

/// How long one blocking poll waits before the device's loss is checked again.
const POLL_SLICE: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a buffer map may take to answer after its submission finished (it
/// answers within the poll that finished it; only a lost device leaves it silent).
const MAP_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// How many compute pipelines a device keeps built, least recently used dropped
/// first. A model's plan uses a few dozen and a race alternates between at most
/// its slot's candidates, so the runtime and the tuner rebuild none; a parity sweep
/// over every parameter set of the kernel set (thousands of pipelines, a few MB of
/// machine code each on a software adapter) stays within a bounded memory. A
/// program holds its pipelines itself, so dropping one from the cache never
/// invalidates a built program.
pub const PIPELINE_CACHE_ENTRIES: usize = 256;

/// One opened adapter: device, queue, capabilities, caches. Reused across runs.
/// Views of one device that differ only in [`GpuCtx::trusted_shaders`] share the
/// device, the queue and the caches.
pub struct GpuCtx {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub caps: GpuCaps,
    pub name: String,
    /// Shader modules built without wgpu's runtime checks (see the module doc).
    trusted: bool,
    modules: ModuleCache,
    pipelines: PipelineCache,
    /// Pipelines built on this device and the time it took (shared by its views).
    pub pipeline_stats: Arc<PipelineStats>,
    /// What this device's context has done (shared by its views).
    pub counters: Arc<GpuCounters>,
    /// What a program being rebuilt leaves to its successor ([`GpuCtx::rebuild`]).
    recycle: Mutex<Recycle>,
    /// What the device's callbacks recorded (shared by its views).
    faults: Arc<Mutex<faults::Faults>>,
    /// The fault `KTUNE_FAULT` injects ([`faults`]), if any.
    inject: Option<faults::Inject>,
}

/// One binding of a bind group as built: binding number, buffer, offset and size
/// (`None`: to the buffer's end). Each step keeps its own, so that a rebuild of
/// the same kernel over the same buffers finds its bind group again.
pub type BindEntry = (u32, wgpu::Buffer, u64, Option<u64>);

/// The uniform and scratch buffers and the bind groups of a program being
/// rebuilt, open to the thread that rebuilds it.
#[derive(Default)]
struct Recycle {
    thread: Option<std::thread::ThreadId>,
    buffers: Vec<wgpu::Buffer>,
    groups: Vec<(Arc<wgpu::ComputePipeline>, Vec<BindEntry>, wgpu::BindGroup)>,
}

/// One binding of a step: a whole buffer, or `size` bytes of one from `offset`.
#[derive(Clone, Copy)]
pub enum Bind<'a> {
    Whole(&'a wgpu::Buffer),
    Range(&'a wgpu::Buffer, u64, u64),
}

impl Bind<'_> {
    /// This binding at `binding`.
    pub fn entry(&self, binding: u32) -> BindEntry {
        match *self {
            Bind::Whole(b) => (binding, b.clone(), 0, None),
            Bind::Range(b, offset, size) => (binding, b.clone(), offset, Some(size)),
        }
    }
}

/// One dispatch: pipeline, bind group and workgroup counts.
pub struct GpuStep {
    pub label: String,
    pub pipeline: Arc<wgpu::ComputePipeline>,
    pub bind_group: wgpu::BindGroup,
    pub workgroups: [u32; 3],
    /// What `bind_group` binds.
    pub binds: Vec<BindEntry>,
}

/// The dispatches of one kernel variant over fixed buffers, in order, plus the
/// uniform and scratch buffers they own.
pub struct GpuProgram {
    pub steps: Vec<GpuStep>,
    pub owned: Vec<wgpu::Buffer>,
}

impl GpuProgram {
    /// Records every step into one compute pass.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        for s in &self.steps {
            pass.set_pipeline(&s.pipeline);
            pass.set_bind_group(0, &s.bind_group, &[]);
            let [x, y, z] = s.workgroups;
            pass.dispatch_workgroups(x, y, z);
        }
    }
    pub fn dispatches(&self) -> usize {
        self.steps.len()
    }
}

/// The binding of the pass-position uniform (`shaders/position.wgsl`).
pub const POSITION_BINDING: u32 = 7;

/// The pass-position uniform's words for a pass of `tokens` tokens from `pos0`:
/// `[pos0, kv_len = pos0 + tokens, token 0, chain slot 0]` (16 bytes).
pub fn position_words(pos0: usize, tokens: usize) -> [u32; 4] {
    [pos0 as u32, (pos0 + tokens) as u32, 0, 0]
}

/// Rounds a size up to a multiple of 16 bytes (the widest vector element).
pub fn padded(bytes: u64) -> u64 {
    bytes.max(16).div_ceil(16) * 16
}

/// Workgroup count for `n` items at `per` items per workgroup.
pub fn groups(n: usize, per: u32) -> u32 {
    n.div_ceil(per.max(1) as usize) as u32
}

/// Splits a workgroup count over x and y when it exceeds the per-dimension limit
/// (65535): kernels recover the linear index as `wid.x + wid.y * nwg.x`.
pub fn grid_2d(count: u32) -> [u32; 3] {
    if count <= 65535 {
        [count.max(1), 1, 1]
    } else {
        let y = count.div_ceil(65535);
        [count.div_ceil(y), y, 1]
    }
}

impl GpuCtx {
    /// Opens a device on the adapter with the features kernels can use.
    pub fn open(dev: &GpuDevice) -> Result<Arc<GpuCtx>, GpuError> {
        let adapter = &dev.adapter;
        let feats = adapter.features();
        let wanted = wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
            | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        let required_features = feats & wanted;
        let experimental_features = if required_features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            // SAFETY: the only experimental feature requested is cooperative matrices,
            // used by the `gemm_q_coop*` shaders alone, and only on the shapes the
            // adapter reports (`GpuCaps::coop_f16_f32`).
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        };
        let inject = faults::Inject::from_env()?;
        let mut required_limits = wgpu::Limits::downlevel_defaults().using_resolution(adapter.limits());
        let al = adapter.limits();
        required_limits.max_storage_buffer_binding_size = al.max_storage_buffer_binding_size;
        required_limits.max_buffer_size = al.max_buffer_size;
        required_limits.max_compute_workgroup_storage_size = al.max_compute_workgroup_storage_size;
        required_limits.max_compute_invocations_per_workgroup = al.max_compute_invocations_per_workgroup;
        required_limits.max_compute_workgroup_size_x = al.max_compute_workgroup_size_x;
        required_limits.max_compute_workgroup_size_y = al.max_compute_workgroup_size_y;
        required_limits.max_compute_workgroup_size_z = al.max_compute_workgroup_size_z;
        required_limits.max_compute_workgroups_per_dimension = al.max_compute_workgroups_per_dimension;
        required_limits.max_storage_buffers_per_shader_stage = al.max_storage_buffers_per_shader_stage;
        required_limits.max_bind_groups = al.max_bind_groups;
        required_limits.max_bindings_per_bind_group = al.max_bindings_per_bind_group;
        if let Some(faults::Inject::Limit(bytes)) = inject {
            required_limits.max_buffer_size = required_limits.max_buffer_size.min(bytes);
            required_limits.max_storage_buffer_binding_size = required_limits.max_storage_buffer_binding_size.min(bytes);
        }
        let desc = wgpu::DeviceDescriptor {
            label: Some("ktune"),
            required_features,
            required_limits,
            experimental_features,
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc))
            .map_err(|source| GpuError::RequestDevice { adapter: dev.info.name.clone(), source })?;
        let faults = faults::Faults::install(&device);
        Ok(Arc::new(GpuCtx {
            device,
            queue,
            caps: dev.caps.clone(),
            name: dev.info.name.clone(),
            trusted: false,
            modules: Arc::default(),
            pipelines: Arc::new(Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(PIPELINE_CACHE_ENTRIES).expect("a non-zero capacity"),
            ))),
            pipeline_stats: Arc::default(),
            counters: Arc::default(),
            recycle: Mutex::default(),
            faults,
            inject,
        }))
    }

    /// This device with shader modules built trusted (`true`: no runtime bounds
    /// checks) or checked; the same context when it already is. Device, queue and
    /// caches are shared (the caches are keyed by the kind of module).
    pub fn with_trusted_shaders(self: &Arc<Self>, trusted: bool) -> Arc<GpuCtx> {
        if self.trusted == trusted {
            return self.clone();
        }
        Arc::new(GpuCtx {
            device: self.device.clone(),
            queue: self.queue.clone(),
            caps: self.caps.clone(),
            name: self.name.clone(),
            trusted,
            modules: self.modules.clone(),
            pipelines: self.pipelines.clone(),
            pipeline_stats: self.pipeline_stats.clone(),
            counters: self.counters.clone(),
            recycle: Mutex::default(),
            faults: self.faults.clone(),
            inject: self.inject.clone(),
        })
    }

    /// Keeps at most `n` (at least 1) pipelines built from now on, the least
    /// recently used dropped first (several devices opened side by side share
    /// [`PIPELINE_CACHE_ENTRIES`] between them).
    pub fn limit_pipelines(&self, n: usize) {
        let n = std::num::NonZeroUsize::new(n.max(1)).expect("at least one");
        self.pipelines.lock().unwrap_or_else(|e| e.into_inner()).resize(n);
    }

    /// Whether this context builds its shader modules without runtime checks.
    pub fn trusted_shaders(&self) -> bool {
        self.trusted
    }

    fn module(&self, shader: &'static Shader) -> Result<Arc<wgpu::ShaderModule>, GpuError> {
        let mut cache = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = cache.get(&(shader.key(), self.trusted)) {
            return Ok(m.clone());
        }
        let label = shader.label();
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let source = faults::Inject::shader_source(self.inject.as_ref(), shader.name, shader.source);
        let desc = wgpu::ShaderModuleDescriptor { label: Some(&label), source: wgpu::ShaderSource::Wgsl(source) };
        let m = if self.trusted {
            // SAFETY: the shaders of `shaders/` index their buffers only within the
            // sizes the host binds: every kernel's `check` validates the problem's
            // shapes against the device limits and the buffers `Problem::buffers`
            // sizes, and a program is only built for a problem that passed it; the
            // loops are bounded by uniforms derived from those shapes. The parity
            // tests run every family with trusted modules (tests/parity.rs).
            unsafe { self.device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
        } else {
            self.device.create_shader_module(desc)
        };
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Pipeline { shader: label, entry: "(module)".into(), message: faults::describe(&e) });
        }
        let m = Arc::new(m);
        cache.insert((shader.key(), self.trusted), m.clone());
        Ok(m)
    }

    /// The compute pipeline for `entry` of `shader` with these `override` constants,
    /// built once and cached (the [`PIPELINE_CACHE_ENTRIES`] most recently used).
    pub fn pipeline(
        &self,
        shader: &'static Shader,
        entry: &str,
        constants: &[(&str, f64)],
    ) -> Result<Arc<wgpu::ComputePipeline>, GpuError> {
        let mut sorted: Vec<(String, u64)> = constants.iter().map(|(k, v)| (k.to_string(), v.to_bits())).collect();
        sorted.sort();
        let key = (shader.key(), entry.to_string(), sorted, self.trusted);
        if let Some(p) = self.pipelines.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(p.clone());
        }
        let start = PipelineStats::start();
        let module = self.module(shader)?;
        let label = format!("{}:{}{:?}{}", shader.label(), entry, constants, if self.trusted { " trusted" } else { "" });
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let pipe = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: None,
            module: &module,
            entry_point: Some(entry),
            compilation_options: wgpu::PipelineCompilationOptions { constants, zero_initialize_workgroup_memory: false },
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Pipeline { shader: shader.label(), entry: entry.into(), message: faults::describe(&e) });
        }
        self.pipeline_stats.add(start);
        bump(&self.counters.pipelines, 1);
        let pipe = Arc::new(pipe);
        self.pipelines.lock().unwrap_or_else(|e| e.into_inner()).put(key, pipe.clone());
        Ok(pipe)
    }

    /// The bind group of `entries` for `pipeline`'s group 0, with validation
    /// errors caught and named after `label`; during a [`GpuCtx::rebuild`], the
    /// old program's group when it binds the same buffers to the same pipeline.
    pub fn bind_group(
        &self,
        label: &str,
        pipeline: &Arc<wgpu::ComputePipeline>,
        entries: &[BindEntry],
    ) -> Result<wgpu::BindGroup, GpuError> {
        if let Some(g) = self.recycled_group(pipeline, entries) {
            return Ok(g);
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let layout = pipeline.get_bind_group_layout(0);
        let wgpu_entries: Vec<wgpu::BindGroupEntry<'_>> = entries
            .iter()
            .map(|(binding, buffer, offset, size)| wgpu::BindGroupEntry {
                binding: *binding,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer,
                    offset: *offset,
                    size: size.and_then(wgpu::BufferSize::new),
                }),
            })
            .collect();
        let group =
            self.device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(label), layout: &layout, entries: &wgpu_entries });
        bump(&self.counters.bind_groups, 1);
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Validation { what: format!("binding `{label}`"), message: faults::describe(&e) });
        }
        Ok(group)
    }

    /// One step: `pipeline` and the bind group of `entries` (see [`GpuCtx::bind_group`]).
    pub fn step_entries(
        &self,
        label: String,
        pipeline: Arc<wgpu::ComputePipeline>,
        entries: Vec<BindEntry>,
        workgroups: [u32; 3],
    ) -> Result<GpuStep, GpuError> {
        let bind_group = self.bind_group(&label, &pipeline, &entries)?;
        Ok(GpuStep { label, pipeline, bind_group, workgroups, binds: entries })
    }

    /// One step: pipeline + bind group over `buffers` (binding i: buffers[i], whole).
    pub fn step(
        &self,
        label: &str,
        pipeline: Arc<wgpu::ComputePipeline>,
        buffers: &[&wgpu::Buffer],
        workgroups: [u32; 3],
    ) -> Result<GpuStep, GpuError> {
        let entries = buffers.iter().enumerate().map(|(i, b)| (i as u32, (*b).clone(), 0, None)).collect();
        self.step_entries(label.to_string(), pipeline, entries, workgroups)
    }

    /// One step whose bindings may be byte ranges of buffers (a quantized weight's
    /// quants and scales regions, bound side by side from one buffer).
    pub fn step_ranges(
        &self,
        label: &str,
        pipeline: Arc<wgpu::ComputePipeline>,
        binds: &[Bind<'_>],
        workgroups: [u32; 3],
    ) -> Result<GpuStep, GpuError> {
        let entries = binds.iter().enumerate().map(|(i, b)| b.entry(i as u32)).collect();
        self.step_entries(label.to_string(), pipeline, entries, workgroups)
    }

    /// Runs `build` (a kernel's `prepare` for a problem that differs from `old`'s
    /// in values only, e.g. a decode step's position) with `old`'s uniform and
    /// scratch buffers and bind groups open to it: [`GpuCtx::uniform`] and
    /// [`GpuCtx::storage`] hand back an old buffer of the same size and usage
    /// (uniforms rewritten), [`GpuCtx::bind_group`] an old group of the same
    /// pipeline and bindings. What is not taken is dropped. A decode token then
    /// costs queue writes instead of buffer and bind-group creation.
    pub fn rebuild<R>(&self, old: GpuProgram, build: impl FnOnce() -> R) -> R {
        {
            let mut r = self.recycle.lock().unwrap_or_else(|e| e.into_inner());
            r.thread = Some(std::thread::current().id());
            r.buffers = old.owned;
            r.groups = old.steps.into_iter().map(|s| (s.pipeline, s.binds, s.bind_group)).collect();
        }
        let out = build();
        *self.recycle.lock().unwrap_or_else(|e| e.into_inner()) = Recycle::default();
        out
    }

    fn recycled_buffer(&self, size: u64, usage: wgpu::BufferUsages) -> Option<wgpu::Buffer> {
        let mut r = self.recycle.lock().unwrap_or_else(|e| e.into_inner());
        if r.thread != Some(std::thread::current().id()) {
            return None;
        }
        let i = r.buffers.iter().position(|b| b.size() == size && b.usage() == usage)?;
        Some(r.buffers.swap_remove(i))
    }

    fn recycled_group(&self, pipeline: &Arc<wgpu::ComputePipeline>, entries: &[BindEntry]) -> Option<wgpu::BindGroup> {
        let mut r = self.recycle.lock().unwrap_or_else(|e| e.into_inner());
        if r.thread != Some(std::thread::current().id()) {
            return None;
        }
        let i = r.groups.iter().position(|(p, e, _)| Arc::ptr_eq(p, pipeline) && e.as_slice() == entries)?;
        Some(r.groups.swap_remove(i).2)
    }

    /// A uniform buffer holding `words` (u32s; floats go in as `f32::to_bits`).
    pub fn uniform(&self, label: &str, words: &[u32]) -> wgpu::Buffer {
        let mut data = words.to_vec();
        while !data.len().is_multiple_of(4) {
            data.push(0);
        }
        let (size, usage) = ((data.len() * 4) as u64, wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST);
        let buf = self.recycled_buffer(size, usage).unwrap_or_else(|| self.buffer(label, size, usage));
        self.write(&buf, 0, bytemuck::cast_slice(&data));
        buf
    }

    /// A new buffer of `size` bytes (the one place the context creates buffers).
    pub fn buffer(&self, label: &str, size: u64, usage: wgpu::BufferUsages) -> wgpu::Buffer {
        bump(&self.counters.buffers, 1);
        self.device.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size, usage, mapped_at_creation: false })
    }

    /// A new timestamp query set of `count` queries.
    pub fn query_set(&self, label: &str, count: u32) -> wgpu::QuerySet {
        bump(&self.counters.query_sets, 1);
        self.device.create_query_set(&wgpu::QuerySetDescriptor { label: Some(label), ty: wgpu::QueryType::Timestamp, count })
    }

    /// `queue.write_buffer` of `data` into `buf` at `offset`.
    pub fn write(&self, buf: &wgpu::Buffer, offset: u64, data: &[u8]) {
        bump(&self.counters.writes, 1);
        bump(&self.counters.write_bytes, data.len() as u64);
        self.queue.write_buffer(buf, offset, data);
    }

    /// Submits one command buffer; its index is what [`GpuCtx::read_mapped_after`] waits for.
    pub fn submit(&self, commands: wgpu::CommandBuffer) -> wgpu::SubmissionIndex {
        bump(&self.counters.submits, 1);
        if let Some(faults::Inject::LostAtSubmit(n)) = self.inject
            && self.counters.submits.load(std::sync::atomic::Ordering::Relaxed) == n
        {
            self.device.destroy();
        }
        self.queue.submit([commands])
    }

    /// Whether `bytes` fit one buffer of this device, and one storage binding when
    /// `binding`: else [`GpuError::TooLarge`] naming `what`, the size, the limit
    /// and the fix.
    pub fn check_size(&self, what: &str, bytes: u64, binding: bool) -> Result<(), GpuError> {
        let l = self.device.limits();
        let mut limits = vec![("max buffer size", l.max_buffer_size)];
        if binding {
            limits.push(("max storage buffer binding size", l.max_storage_buffer_binding_size));
        }
        match limits.into_iter().find(|(_, limit)| padded(bytes) > *limit) {
            Some((limit_name, limit)) => Err(GpuError::TooLarge { what: what.to_string(), bytes, limit_name, limit }),
            None => Ok(()),
        }
    }

    /// The device's loss, if it was lost (its callbacks run first: a non-blocking
    /// poll). What the tuner checks after a failure, to stop rather than go on
    /// failing every candidate.
    pub fn lost(&self) -> Option<GpuError> {
        let _ = self.device.poll(wgpu::PollType::Poll);
        faults::Faults::lost(&self.faults)
    }

    /// Runs `allocate` (buffer creation and uploads) inside out-of-memory and
    /// validation error scopes: an allocation the device cannot make comes back
    /// as [`GpuError::OutOfMemory`] or [`GpuError::Validation`] naming `what`.
    pub fn allocating<R>(&self, what: &str, allocate: impl FnOnce() -> R) -> Result<R, GpuError> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let invalid = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let out = allocate();
        let invalid = pollster::block_on(invalid.pop());
        let oom = pollster::block_on(oom.pop());
        if let Some(lost) = (oom.is_some() || invalid.is_some()).then(|| self.lost()).flatten() {
            return Err(lost);
        }
        if let Some(e) = oom {
            return Err(GpuError::OutOfMemory { what: what.to_string(), message: faults::describe(&e) });
        }
        if let Some(e) = invalid {
            return Err(GpuError::Validation { what: what.to_string(), message: faults::describe(&e) });
        }
        faults::Faults::check(&self.faults)?;
        Ok(out)
    }

    /// Begins a compute pass on `enc`.
    pub fn begin_pass<'e>(
        &self,
        enc: &'e mut wgpu::CommandEncoder,
        label: &str,
        timestamp_writes: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> wgpu::ComputePass<'e> {
        bump(&self.counters.passes, 1);
        enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(label), timestamp_writes })
    }

    /// Records `program`'s dispatches into `pass`.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, program: &GpuProgram) {
        bump(&self.counters.dispatches, program.dispatches() as u64);
        program.record(pass);
    }

    /// A storage buffer of at least `bytes`, padded to 16 bytes.
    pub fn storage(&self, label: &str, bytes: u64) -> wgpu::Buffer {
        let (size, usage) = (padded(bytes), wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC);
        self.recycled_buffer(size, usage).unwrap_or_else(|| self.buffer(label, size, usage))
    }

    /// A storage buffer initialised with `data` (padded with zeros to 16 bytes).
    pub fn upload(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        let buf = self.storage(label, data.len() as u64);
        let mut padded_data = data.to_vec();
        padded_data.resize(padded(data.len() as u64) as usize, 0);
        self.write(&buf, 0, &padded_data);
        buf
    }

    /// The first `bytes` of a mappable buffer whose contents are already there
    /// (the submit that filled it has been waited for): map, copy out, unmap.
    pub fn read_mapped(&self, staging: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>, GpuError> {
        self.read_mapped_after(staging, bytes, None)
    }

    /// [`GpuCtx::read_mapped`] waiting only for the submission `after` (None: the
    /// queue's last), so that work submitted since keeps the GPU busy while the
    /// host reads: one host wait.
    pub fn read_mapped_after(&self, staging: &wgpu::Buffer, bytes: u64, after: Option<wgpu::SubmissionIndex>) -> Result<Vec<u8>, GpuError> {
        let slice = staging.slice(..padded(bytes).min(staging.size()));
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.wait_for(after)?;
        let mapped = match rx.recv_timeout(MAP_GRACE) {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = mapped {
            // A map refused or never answered on a lost device is the loss.
            return Err(faults::Faults::lost(&self.faults).unwrap_or(GpuError::Map(e)));
        }
        let out = slice.get_mapped_range().map_err(|e| GpuError::Map(e.to_string()))?[..bytes as usize].to_vec();
        staging.unmap();
        bump(&self.counters.read_bytes, bytes);
        Ok(out)
    }

    /// A mappable buffer of `bytes` (padded) that copies land in for reading back.
    pub fn staging(&self, bytes: u64) -> wgpu::Buffer {
        self.buffer("readback", padded(bytes), wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST)
    }

    /// Copies `bytes` of `src` back to the host (through a new staging buffer).
    pub fn read(&self, src: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>, GpuError> {
        let size = padded(bytes);
        let staging = self.staging(bytes);
        let mut enc = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("readback") });
        enc.copy_buffer_to_buffer(src, 0, &staging, 0, size);
        self.submit(enc.finish());
        self.read_mapped(&staging, bytes)
    }

    /// Blocks until the queue is idle.
    pub fn wait(&self) -> Result<(), GpuError> {
        self.wait_for(None)
    }

    /// Blocks until the submission `after` has finished (None: the last one): a
    /// sync point, where what the device's callbacks recorded (its loss, an
    /// uncaptured error) comes back as the error. The wait is cut in slices of
    /// [`POLL_SLICE`], the device's loss checked between them, so that a wait on
    /// a lost device ends.
    pub fn wait_for(&self, after: Option<wgpu::SubmissionIndex>) -> Result<(), GpuError> {
        bump(&self.counters.waits, 1);
        loop {
            faults::Faults::lost(&self.faults).map_or(Ok(()), Err)?;
            match self.device.poll(wgpu::PollType::Wait { submission_index: after.clone(), timeout: Some(POLL_SLICE) }) {
                Ok(_) => break,
                Err(wgpu::PollError::Timeout) => continue,
                // A lost device's callback runs when the device is next maintained.
                Err(e) => return Err(self.lost().unwrap_or(GpuError::Poll(e.to_string()))),
            }
        }
        faults::Faults::check(&self.faults)
    }

    /// Runs `programs` once in one command buffer (one compute pass) and waits,
    /// catching validation errors.
    pub fn run(&self, label: &str, programs: &[&GpuProgram]) -> Result<(), GpuError> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut enc = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) });
        {
            let mut pass = self.begin_pass(&mut enc, label, None);
            for p in programs {
                self.record(&mut pass, p);
            }
        }
        self.submit(enc.finish());
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Validation { what: format!("running `{label}`"), message: faults::describe(&e) });
        }
        self.wait()
    }

    /// GPU time of `reps` back-to-back executions of `program` in one pass, in
    /// seconds per execution, from timestamp queries when the adapter has them;
    /// `None` when it does not (callers then use the wall clock).
    pub fn time_program(&self, program: &GpuProgram, reps: u32) -> Result<Option<f64>, GpuError> {
        self.time_programs(std::slice::from_ref(program), 0, reps)
    }

    /// As [`GpuCtx::time_program`], execution `r` running `programs[(first + r) %
    /// len]`: the same kernel over rotating copies of its buffers, so that no
    /// execution finds its inputs in the cache the previous one left them in.
    pub fn time_programs(&self, programs: &[GpuProgram], first: usize, reps: u32) -> Result<Option<f64>, GpuError> {
        if !self.caps.timestamp_query || programs.is_empty() {
            return Ok(None);
        }
        let qs = self.query_set("ktune timing", 2);
        let resolve = self.buffer("timestamps", 16, wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC);
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut enc = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("timed") });
        {
            let ts = wgpu::ComputePassTimestampWrites {
                query_set: &qs,
                beginning_of_pass_write_index: Some(0),
                end_of_pass_write_index: Some(1),
            };
            let mut pass = self.begin_pass(&mut enc, "timed", Some(ts));
            for r in 0..reps.max(1) as usize {
                self.record(&mut pass, &programs[(first + r) % programs.len()]);
            }
        }
        enc.resolve_query_set(&qs, 0..2, &resolve, 0);
        self.submit(enc.finish());
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Validation { what: "timing".into(), message: faults::describe(&e) });
        }
        let bytes = self.read(&resolve, 16)?;
        let t: &[u64] = bytemuck::cast_slice(&bytes);
        let period = self.queue.get_timestamp_period() as f64;
        let ns = t[1].saturating_sub(t[0]) as f64 * period;
        Ok(Some(ns * 1e-9 / reps.max(1) as f64))
    }
}

/// Shaders that are not kernels of the registry: the runtime's own data movement
/// and the measurement kernels of `bench-kernels` and the tuner's limits. Declared
/// here because `shader!` reads `shaders/` of this crate.
pub mod builtin {
    use super::Shader;

    /// Splitting a fused QKV projection, a broadcast bias add, KV-cache writes.
    pub static RUNTIME_PLUMB: Shader = crate::shader!("runtime_plumb.wgsl", "grid.wgsl", "position.wgsl");
    /// Greedy selection: one LM-head block's argmax (first on ties, NaN never wins).
    pub static SELECT_ARGMAX: Shader = crate::shader!("select_argmax.wgsl", "argmax_wg.wgsl", "softcap.wgsl");
    /// A decode token's embedding row, read from the table on the GPU.
    pub static EMBED: Shader = crate::shader!("embed.wgsl", "grid.wgsl", "position.wgsl", "qblock.wgsl", "qgeom.wgsl");
    /// Decode steps chained on the GPU: LM-head blocks gathered (softcapped)
    /// for the sampler, the selected id stored and the position advanced.
    pub static CHAIN: Shader = crate::shader!("chain.wgsl", "grid.wgsl", "softcap.wgsl");
    /// The GPU time of a chain of decode steps: its steps' timestamp spans summed.
    pub static STAMPS: Shader = crate::shader!("stamps.wgsl", "position.wgsl");
    /// A streaming copy: the device's memory bandwidth.
    pub static BENCH_COPY: Shader = crate::shader!("bench_copy.wgsl");
    /// An FMA chain: the device's f32 FMA peak.
    pub static BENCH_FMA: Shader = crate::shader!("bench_fma.wgsl");

    /// All of them (validated with the kernel set's shaders).
    pub fn shaders() -> Vec<&'static Shader> {
        vec![&RUNTIME_PLUMB, &SELECT_ARGMAX, &EMBED, &CHAIN, &STAMPS, &BENCH_COPY, &BENCH_FMA]
    }
}
