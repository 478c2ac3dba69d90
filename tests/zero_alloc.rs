//! A CPU decode step allocates nothing on the heap once the first step has
//! compiled its schedule: counted with a counting global allocator over every
//! thread (the kernels' pool workers included), on each tiny Hugging Face fixture
//! (Llama, Qwen 2 with biases, Gemma 3, SmolLM2), for f32, f16 and block-quantized
//! weights, with the runtime's default kernels (and, for the block formats, with
//! int8 activations on every decode projection), fusions off and on; then every
//! CPU kernel of every decode slot, with each value of each of its parameters
//! (what a tuned profile can choose), on one fixture per dtype.
//!
//! One test in this binary, so no other test allocates while it counts.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

use ktune::device::CpuCaps;
use ktune::kernels::DType;
use ktune::kernels::{Impl, Params, find, for_op};
use ktune::plan::select::{Choice, DeviceCaps, Slot};
use ktune::plan::{Fusion, Plan, PlanOptions, Regime, Selection};
use ktune::runtime::{Engine, TensorStore, argmax};
use ktune::session::load_model;

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

/// The first counted allocations' sizes and threads, for the failure message
/// (recorded without allocating: a thread is told by the address of a
/// thread-local).
const SEEN: usize = 8;
static SEEN_SIZE: [AtomicUsize; SEEN] = [const { AtomicUsize::new(0) }; SEEN];
static SEEN_THREAD: [AtomicUsize; SEEN] = [const { AtomicUsize::new(0) }; SEEN];

thread_local! {
    static TAG: u8 = const { 0 };
}

fn thread_tag() -> usize {
    TAG.with(|t| t as *const u8 as usize)
}

fn count(layout: Layout) {
    if COUNTING.load(SeqCst) {
        let i = ALLOCS.fetch_add(1, SeqCst);
        if i < SEEN {
            SEEN_SIZE[i].store(layout.size(), SeqCst);
            SEEN_THREAD[i].store(thread_tag(), SeqCst);
        }
    }
}

// SAFETY: every call forwards to the system allocator unchanged; the counter is
// a side effect only.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(Layout::from_size_align(new_size, layout.align()).unwrap_or(layout));
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const PROMPT: [u32; 5] = [1, 17, 42, 99, 3];
const WARM: usize = 2;
const COUNTED: usize = 12;

/// The defaults, or every quantized decode projection on int8 activations
/// (quantized once per call into reused buffers) and four rows a pass.
/// Runs `WARM` then `COUNTED` decode steps after a prompt; the allocations of the
/// counted ones, with the first ones' sizes and threads when there are any.
fn count_decode_allocs(
    m: &ktune::session::LoadedModel,
    store: &Arc<dyn TensorStore>,
    dtype: DType,
    fusion: Fusion,
    sel: Selection,
) -> (usize, String) {
    let opts = PlanOptions::new(dtype, PROMPT.len(), PROMPT.len() + WARM + COUNTED + 1).with_fusion(fusion);
    let plan = Plan::new("fixture", &m.config, opts, sel).expect("plan");
    let mut e = Engine::cpu(plan, store.clone()).expect("engine");
    let rows = e.forward(&PROMPT).expect("prefill");
    let mut next = argmax(rows.last().expect("logits"));
    for _ in 0..WARM {
        next = argmax(e.decode_step(next).expect("decode"));
    }
    ALLOCS.store(0, SeqCst);
    COUNTING.store(true, SeqCst);
    for _ in 0..COUNTED {
        next = argmax(e.decode_step(next).expect("decode"));
    }
    COUNTING.store(false, SeqCst);
    let n = ALLOCS.load(SeqCst);
    let main = thread_tag();
    let seen: Vec<String> = (0..n.min(SEEN))
        .map(|i| {
            let t = SEEN_THREAD[i].load(SeqCst);
            format!(
                "{} B on {}",
                SEEN_SIZE[i].load(SeqCst),
                if t == main { "the calling thread".to_string() } else { format!("thread {t:#x}") }
            )
        })
        .collect();
    (n, seen.join(", "))
}

fn selection(caps: &DeviceCaps, int8: bool) -> Selection {
    let mut sel = Selection::defaults(caps.clone());
    if int8 {
        let with = |id: &str, extra: &[(&str, u32)]| {
            let k = find(id).expect("kernel");
            let mut p: Params = k.default_params();
            p.insert("act_bits".into(), 8);
            for (n, v) in extra {
                p.insert((*n).into(), *v);
            }
            Choice::new(k, p)
        };
        for slot in [Slot::MatmulQkv, Slot::MatmulO, Slot::MatmulGateUp, Slot::MatmulDown, Slot::MatmulLmHead] {
            sel.slots.insert((slot, Regime::Decode), with("gemv_q_cpu", &[("rows_per_pass", 4)]));
        }
        sel.slots.insert((Slot::NormMatmul, Regime::Decode), with("norm_gemv_q_cpu", &[]));
        sel.slots.insert((Slot::FusedQkv, Regime::Decode), with("qkv_proj_q_cpu", &[]));
        sel.slots.insert((Slot::FusedGateUp, Regime::Decode), with("gate_up_q_cpu", &[]));
    }
    sel
}

#[test]
fn cpu_decode_steps_allocate_nothing() {
    let caps = DeviceCaps::Cpu(CpuCaps::detect());
    let mut failures = Vec::new();
    for dir in common::hf_fixtures() {
        let m = load_model(None, Some(&dir), None, 0).expect("fixture loads");
        let store: Arc<dyn TensorStore> = m.weights.clone();
        for dtype in [DType::F32, DType::F16, DType::Q8_0, DType::Q4_1] {
            for (fusion, int8) in [(Fusion::NONE, false), (Fusion::ALL, false), (Fusion::NONE, true), (Fusion::ALL, true)] {
                if int8 && !dtype.is_quant() {
                    continue;
                }
                let (n, seen) = count_decode_allocs(&m, &store, dtype, fusion, selection(&caps, int8));
                if n > 0 {
                    failures.push(format!(
                        "{} {dtype} fusion {fusion:?} int8 {int8}: {n} allocations in {COUNTED} decode steps ({seen})",
                        dir.display()
                    ));
                }
            }
        }
    }
    // every CPU kernel a profile can put in a decode slot, each parameter value
    let dir = common::hf_fixtures().into_iter().find(|d| d.ends_with("gemma3-tiny")).expect("the Gemma 3 fixture");
    let m = load_model(None, Some(&dir), None, 0).expect("fixture loads");
    let store: Arc<dyn TensorStore> = m.weights.clone();
    let mut variants = 0;
    for &slot in Slot::ALL {
        let Some(op) = slot.op(Regime::Decode) else { continue };
        let fused = matches!(slot, Slot::FusedQkv | Slot::FusedGateUp | Slot::QkNormRope | Slot::ResidualNorm | Slot::NormMatmul);
        // norm_matmul takes the QKV and gate/up projections over when on
        let fusion = if fused { Fusion { norm_matmul: slot == Slot::NormMatmul, ..Fusion::ALL } } else { Fusion::NONE };
        for k in for_op(op).filter(|k| matches!(k.imp, Impl::Cpu(_))) {
            let mut params_list = vec![k.default_params()];
            for spec in k.params {
                for &v in spec.values.iter().filter(|&&v| v != spec.default) {
                    let mut p = k.default_params();
                    p.insert(spec.name.into(), v);
                    params_list.push(p);
                }
            }
            for dtype in [DType::F32, DType::F16, DType::Q8_0, DType::Q4_1].into_iter().filter(|d| k.dtypes.contains(d)) {
                for p in &params_list {
                    let mut sel = Selection::defaults(caps.clone());
                    sel.slots.insert((slot, Regime::Decode), Choice::new(k, p.clone()));
                    variants += 1;
                    let (n, seen) = count_decode_allocs(&m, &store, dtype, fusion, sel);
                    if n > 0 {
                        failures.push(format!(
                            "{} {} {p:?} {dtype}: {n} allocations in {COUNTED} decode steps ({seen})",
                            slot.name(),
                            k.id
                        ));
                    }
                }
            }
        }
    }
    assert!(variants > 50, "only {variants} kernel variants swept");
    assert!(failures.is_empty(), "decode steps allocated:\n{}", failures.join("\n"));
}
