//! A CPU decode step allocates nothing on the heap once the first step has
//! compiled its schedule: counted with a counting global allocator over every
//! thread (the kernels' pool workers included), on each tiny Hugging Face fixture
//! (Llama, Qwen 2 with biases, Gemma 3, SmolLM2), for f32, f16 and block-quantized
//! weights, with the runtime's default kernels (and, for the block formats, with
//! int8 activations on every decode projection), fusions off and on.
//!
//! One test in this binary, so no other test allocates while it counts.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

use ktune::device::CpuCaps;
use ktune::kernels::DType;
use ktune::kernels::{Params, find};
use ktune::plan::select::{Choice, DeviceCaps, Slot};
use ktune::plan::{Fusion, Parallel, Plan, PlanOptions, Regime, Selection};
use ktune::runtime::{Engine, TensorStore, argmax};
use ktune::session::load_model;

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to the system allocator unchanged; the counter is
// a side effect only.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(SeqCst) {
            ALLOCS.fetch_add(1, SeqCst);
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(SeqCst) {
            ALLOCS.fetch_add(1, SeqCst);
        }
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(SeqCst) {
            ALLOCS.fetch_add(1, SeqCst);
        }
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
                let opts = PlanOptions {
                    weight_dtype: dtype,
                    matrix_formats: Default::default(),
                    kv_dtype: DType::F32,
                    max_tokens: PROMPT.len(),
                    context: PROMPT.len() + WARM + COUNTED + 1,
                    all_logits: false,
                    fusion,
                    parallel: Parallel::default(),
                };
                let plan = Plan::new("fixture", &m.config, opts, selection(&caps, int8)).expect("plan");
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
                if n > 0 {
                    failures.push(format!(
                        "{} {dtype} fusion {fusion:?} int8 {int8}: {n} allocations in {COUNTED} decode steps",
                        dir.display()
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "decode steps allocated:\n{}", failures.join("\n"));
}
