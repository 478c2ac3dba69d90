//! A persistent thread pool for the CPU kernels: workers that spin between
//! kernels instead of sleeping, so a decode step's hundreds of sub-0.1 ms kernels
//! do not each pay a wake-up.
//!
//! Why not rayon here: rayon's workers go to sleep shortly after their deque runs
//! dry and its spin time is not a setting; a call from outside the pool injects a
//! job through a queue that allocates a block every 63 jobs; a parallel iterator
//! splits recursively through `join`. A decode step needs none of that: one
//! caller hands out `n` independent tasks, the workers claim them through one
//! atomic counter, the caller takes its share and waits for the rest. That is
//! what [`Pool::run`] does, with no allocation per call. Rayon stays where it
//! fits (weight loading, the prefill GEMM's blocked loops).
//!
//! How long idle workers spin before they park is [`Pool::set_spin`] (2 ms by
//! default; not yet a profile setting); parked workers are woken through a condition
//! variable. A task that calls [`Pool::run`] again (a parallel group's kernels
//! run concurrently, each with its own parallel loop) runs its inner tasks
//! inline, and so does a second caller while the pool is busy: never a deadlock.

use std::cell::{Cell, UnsafeCell};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Most participants (the caller and its workers) of one pool.
pub const MAX_THREADS: usize = 256;

/// The fields of the claim word: index and task count 20 bits each, the epoch 24.
const TASK_SHIFT: u32 = 20;
const EPOCH_SHIFT: u32 = 40;
const FIELD: u64 = (1 << TASK_SHIFT) - 1;
const FIELD_EPOCH: u64 = (1 << (64 - EPOCH_SHIFT)) - 1;
/// Most tasks of one job handed to the workers (a larger job runs inline).
const MAX_TASKS: usize = FIELD as usize;

/// The claim word of task `index` of a job of `tasks` tasks in `epoch`.
fn pack(epoch: u64, tasks: usize, index: usize) -> u64 {
    (epoch & FIELD_EPOCH) << EPOCH_SHIFT | (tasks as u64 & FIELD) << TASK_SHIFT | (index as u64 & FIELD)
}

type Task<'a> = dyn Fn(usize) + Sync + 'a;

struct Shared {
    /// `epoch << 40 | task count << 20 | next task index` ([`pack`]): a worker
    /// claims a task of the current job by a compare-and-swap that fails when the
    /// job changed under it. The count travels in the same word as the index: a
    /// worker that read the count apart (an earlier version) could take a late
    /// job's larger count for a finished job's, claim an index past that job's
    /// end, run a task of a job whose caller had returned, and count it into the
    /// next job's `done` (a crash in `rms_norm_split`'s back-to-back jobs).
    claim: AtomicU64,
    /// The current job's body, written by the caller before the `claim` store
    /// that publishes the job (Release) and read by a worker only after a
    /// successful claim of one of its tasks (Acquire), while the caller is still
    /// waiting for that task: valid for exactly as long as it is read.
    job: UnsafeCell<Option<*const Task<'static>>>,
    /// Whether a claim of the current job takes a share of the tasks left
    /// ([`Pool::run_runs`]) rather than one; written with `job`.
    guided: AtomicBool,
    /// Tasks of the current job finished.
    done: AtomicUsize,
    /// A task of the current job panicked.
    panicked: AtomicBool,
    /// Spin time before parking, in nanoseconds.
    spin_ns: AtomicU64,
    sleepers: AtomicUsize,
    /// Participants that take tasks (workers with a higher index stay idle).
    active: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
    /// Workers that have started (the pool waits for all of them).
    started: AtomicUsize,
}

// SAFETY: `job` is written only by the one caller holding `Pool::busy`, before the
// Release store that publishes it, and read by workers only after an Acquire claim
// of a task of that job and before that task is reported done (see `Shared`).
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

thread_local! {
    /// Set while this thread runs a pool task (nested calls run inline).
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

/// The persistent pool: `threads - 1` workers plus the calling thread.
pub struct Pool {
    shared: Arc<Shared>,
    threads: usize,
    busy: Mutex<()>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

/// Spin time of a new pool (the profile can set another).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(2000);

/// The process-wide pool, as many participants as rayon's pool has threads
/// (`RAYON_NUM_THREADS`, else the available parallelism).
///
/// Its first call also waits until every thread of rayon's global pool has
/// started: a rayon worker allocates its own job queue when it starts, and on a
/// loaded machine that start can come late enough to land inside a decode step
/// (the `zero_alloc` test saw two such allocations on a CI machine).
pub fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::broadcast(|_| ());
        Pool::new(rayon::current_num_threads())
    })
}

impl Pool {
    /// A pool of `threads` participants (at least 1; `threads - 1` workers).
    pub fn new(threads: usize) -> Pool {
        let threads = threads.clamp(1, MAX_THREADS);
        let shared = Arc::new(Shared {
            claim: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            guided: AtomicBool::new(false),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            spin_ns: AtomicU64::new(DEFAULT_SPIN.as_nanos() as u64),
            sleepers: AtomicUsize::new(0),
            active: AtomicUsize::new(threads),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            started: AtomicUsize::new(0),
        });
        let workers = (1..threads)
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new().name(format!("ktune-pool-{i}")).spawn(move || worker(&s, i)).expect("spawning a pool worker")
            })
            .collect();
        // Every worker is running before the pool is used: a thread's own start-up
        // (std records its name) never lands inside a caller's first passes.
        while shared.started.load(Acquire) + 1 < threads {
            std::thread::yield_now();
        }
        Pool { shared, threads, busy: Mutex::new(()), workers }
    }

    /// Participants that take tasks (workers + the caller).
    pub fn threads(&self) -> usize {
        self.shared.active.load(Relaxed)
    }

    /// Threads the pool was built with (the most [`Pool::set_threads`] allows).
    pub fn capacity(&self) -> usize {
        self.threads
    }

    /// Lets only `n` participants (the caller and `n - 1` workers) take tasks;
    /// the profile's `execution.cpuThreads`. Clamped to `1..=capacity`.
    pub fn set_threads(&self, n: usize) {
        self.shared.active.store(n.clamp(1, self.threads), Relaxed);
    }

    /// How long idle workers spin before parking.
    pub fn set_spin(&self, d: Duration) {
        self.shared.spin_ns.store(d.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
    }

    pub fn spin(&self) -> Duration {
        Duration::from_nanos(self.shared.spin_ns.load(Relaxed))
    }

    /// Runs `f(0..tasks)`, each index once, spread over the pool; returns when all
    /// have finished. Inline on the calling thread when there is one task, one
    /// thread, a task of this pool calls it, or another caller holds the pool.
    pub fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        self.run_with(tasks, f, false)
    }

    /// [`Pool::run`] in runs of consecutive indices: a claim takes a
    /// participant's share of the tasks left (at least one), so the runs
    /// shrink as the job ends. One claim a task costs a contended cache line a
    /// task; fixed runs (four a participant, as this pool handed out before)
    /// leave one thread waiting for the other's last run. A two-thread
    /// 8-sequence pass of SmolLM2 (jobs of a few dozen microseconds) spent 17%
    /// of its samples claiming and waiting with fixed runs, 16% with claims of
    /// a quarter of what was left, 13% with these (docs/serve.md).
    pub fn run_runs(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        self.run_with(tasks, f, true)
    }

    fn run_with(&self, tasks: usize, f: &(dyn Fn(usize) + Sync), guided: bool) {
        if tasks == 0 {
            return;
        }
        let inline = tasks == 1 || tasks > MAX_TASKS || self.threads() == 1 || IN_TASK.with(Cell::get);
        let guard = if inline { None } else { self.busy.try_lock().ok() };
        let Some(_guard) = guard else {
            for i in 0..tasks {
                f(i);
            }
            return;
        };
        let s = &*self.shared;
        // SAFETY: only the holder of `busy` writes `job`; no worker reads it until
        // the claim below publishes the new epoch, and the previous job's readers
        // all finished (the previous call waited for `done == tasks`). The
        // lifetime is erased: this function returns only after every task of
        // this job is done, so no worker touches `f` after it ends.
        unsafe {
            let erased: *const Task<'static> = std::mem::transmute::<*const Task<'_>, *const Task<'static>>(f as *const Task<'_>);
            *s.job.get() = Some(erased);
        }
        s.done.store(0, Relaxed);
        s.guided.store(guided, Relaxed);
        s.panicked.store(false, Relaxed);
        let epoch = (s.claim.load(Relaxed) >> EPOCH_SHIFT).wrapping_add(1) & FIELD_EPOCH;
        s.claim.store(pack(epoch, tasks, 0), SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        // The caller takes tasks too, then waits for the workers' last ones.
        let mine = work(s, epoch);
        let mut spins = 0u32;
        while s.done.load(Acquire) + mine < tasks && mine < tasks {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        if s.panicked.load(Acquire) {
            resume_unwind(Box::new("a pool task panicked"));
        }
    }
}

/// Claims and runs tasks of job `epoch` until none is left; returns how many this
/// thread ran (a worker adds them to `done`, the caller counts its own).
fn work(s: &Shared, epoch: u64) -> usize {
    let mut ran = 0;
    loop {
        let c = s.claim.load(Acquire);
        let (tasks, i) = (((c >> TASK_SHIFT) & FIELD) as usize, (c & FIELD) as usize);
        if c >> EPOCH_SHIFT != epoch || i >= tasks {
            return ran;
        }
        // `guided` is the job's (written before the claim store that published
        // it, read after an Acquire load of that claim word).
        let take = if s.guided.load(Relaxed) { ((tasks - i) / s.active.load(Relaxed).max(1)).max(1) } else { 1 };
        if s.claim.compare_exchange_weak(c, c + take as u64, AcqRel, Relaxed).is_err() {
            continue;
        }
        // SAFETY: tasks `i..i + take` of this job are claimed and not yet done,
        // so the caller is still inside `run` and `job` holds its live body
        // (see `Shared`).
        let f = unsafe { (*s.job.get()).map(|p| &*p) };
        if let Some(f) = f {
            let was = IN_TASK.with(|t| t.replace(true));
            if catch_unwind(AssertUnwindSafe(|| (i..i + take).for_each(f))).is_err() {
                s.panicked.store(true, Release);
            }
            IN_TASK.with(|t| t.set(was));
        }
        ran += take;
    }
}

fn worker(s: &Shared, index: usize) {
    s.started.fetch_add(1, Release);
    let mut seen = s.claim.load(Acquire) >> EPOCH_SHIFT;
    loop {
        // Wait for a new job: spin, then park.
        let start = Instant::now();
        let mut spins = 0u32;
        let epoch = loop {
            if s.shutdown.load(Relaxed) {
                return;
            }
            let e = s.claim.load(Acquire) >> EPOCH_SHIFT;
            if e != seen {
                break e;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && start.elapsed().as_nanos() as u64 >= s.spin_ns.load(Relaxed) {
                let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleepers.fetch_add(1, SeqCst);
                while s.claim.load(SeqCst) >> EPOCH_SHIFT == seen && !s.shutdown.load(SeqCst) {
                    g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                s.sleepers.fetch_sub(1, SeqCst);
                drop(g);
                spins = 0;
            } else {
                std::hint::spin_loop();
            }
        };
        seen = epoch;
        if index >= s.active.load(Relaxed) {
            continue;
        }
        let ran = work(s, epoch);
        if ran > 0 {
            s.done.fetch_add(ran, Release);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Runs `f(i)` for `i in 0..tasks` on the process pool.
pub fn for_each(tasks: usize, f: impl Fn(usize) + Sync) {
    pool().run(tasks, &f);
}

/// [`for_each`] in runs of consecutive indices ([`Pool::run_runs`]; every
/// chunked loop here hands out its chunks so): a thread runs `i`, then
/// `i + 1`, so what task `i + 1` reads can be fetched while task `i` computes
/// (a kept GEMM panel's next).
pub fn for_each_run(tasks: usize, f: impl Fn(usize) + Sync) {
    if tasks <= MAX_TASKS {
        return pool().run_runs(tasks, &f);
    }
    // More than a claim word counts: runs of `per` first.
    let per = tasks.div_ceil(MAX_TASKS);
    pool().run_runs(tasks.div_ceil(per), &|r| (r * per..((r + 1) * per).min(tasks)).for_each(&f));
}

/// Splits `y` into chunks of `grain` elements and runs `f(chunk index, chunk)` on
/// each, over the process pool.
pub fn for_chunks_mut<T: Send>(y: &mut [T], grain: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let grain = grain.max(1);
    let (len, ptr) = (y.len(), SendPtr(y.as_mut_ptr()));
    for_each_run(len.div_ceil(grain), |i| {
        let start = i * grain;
        let n = grain.min(len - start);
        // SAFETY: chunk i is elements start..start+n, disjoint from every other
        // chunk, inside `y`, which is exclusively borrowed for this call.
        let chunk = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(start), n) };
        f(i, chunk)
    });
}

/// [`for_chunks_mut`] over two slices split alike (`a` by `grain_a`, `b` by
/// `grain_b`, the same number of chunks).
pub fn for_chunks_mut2<A: Send, B: Send>(
    a: &mut [A],
    grain_a: usize,
    b: &mut [B],
    grain_b: usize,
    f: impl Fn(usize, &mut [A], &mut [B]) + Sync,
) {
    let (ga, gb) = (grain_a.max(1), grain_b.max(1));
    let tasks = a.len().div_ceil(ga).min(b.len().div_ceil(gb));
    let (la, pa, lb, pb) = (a.len(), SendPtr(a.as_mut_ptr()), b.len(), SendPtr(b.as_mut_ptr()));
    for_each_run(tasks, |i| {
        let (sa, sb) = (i * ga, i * gb);
        // SAFETY: as in `for_chunks_mut`, for each slice.
        let (ca, cb) = unsafe {
            (
                std::slice::from_raw_parts_mut(pa.get().add(sa), ga.min(la - sa)),
                std::slice::from_raw_parts_mut(pb.get().add(sb), gb.min(lb - sb)),
            )
        };
        f(i, ca, cb)
    });
}

/// [`for_chunks_mut`] over the chunks of several slices in one pass:
/// `f(slice index, chunk index within it, chunk)`.
pub fn for_chunks_mut3<T: Send>(parts: [&mut [T]; 3], grain: usize, f: impl Fn(usize, usize, &mut [T]) + Sync) {
    let grain = grain.max(1);
    let counts = parts.each_ref().map(|p| p.len().div_ceil(grain));
    let lens = parts.each_ref().map(|p| p.len());
    let ptrs = parts.map(|p| SendPtr(p.as_mut_ptr()));
    let total: usize = counts.iter().sum();
    for_each_run(total, |t| {
        let (mut part, mut i) = (0, t);
        while i >= counts[part] {
            i -= counts[part];
            part += 1;
        }
        let start = i * grain;
        // SAFETY: chunk i of slice `part` is this chunk's alone (as in `for_chunks_mut`).
        let chunk = unsafe { std::slice::from_raw_parts_mut(ptrs[part].get().add(start), grain.min(lens[part] - start)) };
        f(part, i, chunk)
    });
}

/// `y` as rows of `row_len` elements, each split into chunks of `grain` (the
/// last of a row may be shorter): `f(row, chunk index within the row, chunk)`,
/// every chunk of every row over the pool.
pub fn for_row_chunks_mut<T: Send>(y: &mut [T], row_len: usize, grain: usize, f: impl Fn(usize, usize, &mut [T]) + Sync) {
    let (row_len, grain) = (row_len.max(1), grain.max(1));
    let rows = y.len() / row_len;
    let per_row = row_len.div_ceil(grain);
    let ptr = SendPtr(y.as_mut_ptr());
    let total = rows * per_row;
    for_each_run(total, |t| {
        let (row, c) = (t / per_row, t % per_row);
        let start = c * grain;
        // SAFETY: chunk c of row `row` is elements row*row_len+start.. of `y`,
        // disjoint from every other (row, chunk), inside the exclusive borrow.
        let chunk = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(row * row_len + start), grain.min(row_len - start)) };
        f(row, c, chunk)
    });
}

/// The sum of `f(chunk)` over the chunks of `grain` elements of `x`, in chunk
/// order (the same result whichever thread ran which chunk).
pub fn sum_chunks(x: &[f32], grain: usize, f: impl Fn(&[f32]) -> f32 + Sync) -> f32 {
    map_reduce(x, grain, 0.0, f, |a, b| a + b)
}

/// `reduce` over `map(chunk)` of the chunks of `grain` elements of `x`, combined
/// in chunk order: each participant maps a contiguous run of chunks.
pub fn map_reduce<T: Copy + Send + Sync>(
    x: &[f32],
    grain: usize,
    identity: T,
    map: impl Fn(&[f32]) -> T + Sync,
    reduce: impl Fn(T, T) -> T + Sync,
) -> T {
    let grain = grain.max(1);
    let chunks = x.len().div_ceil(grain);
    let parts = chunks.min(pool().threads()).clamp(1, 64);
    let per = chunks.div_ceil(parts);
    let slots: [Mutex<Option<T>>; 64] = std::array::from_fn(|_| Mutex::new(None));
    pool().run(parts, &|p| {
        let acc = (p * per..((p + 1) * per).min(chunks)).fold(identity, |acc, c| {
            let s = c * grain;
            reduce(acc, map(&x[s..(s + grain).min(x.len())]))
        });
        if let Ok(mut slot) = slots[p].lock() {
            *slot = Some(acc);
        }
    });
    slots[..parts].iter().filter_map(|m| m.lock().ok().and_then(|v| *v)).fold(identity, &reduce)
}

struct SendPtr<T>(*mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: used only to hand disjoint sub-slices of one exclusively borrowed slice
// to the pool's tasks.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    fn get(self) -> *mut T {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_on_pools_of_every_size() {
        for threads in [1, 2, 3, 8] {
            let p = Pool::new(threads);
            for tasks in [0, 1, 2, 7, 100, 1000] {
                for runs in [false, true] {
                    let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                    let f = |i: usize| {
                        hits[i].fetch_add(1, Relaxed);
                    };
                    for _ in 0..5 {
                        if runs { p.run_runs(tasks, &f) } else { p.run(tasks, &f) }
                    }
                    assert!(hits.iter().all(|h| h.load(Relaxed) == 5), "threads {threads} tasks {tasks} runs {runs}");
                }
            }
        }
    }

    /// A claim of [`Pool::run_runs`] is a run of consecutive tasks, shorter as
    /// the job ends: a thread that ran `i` ran `i + 1` next unless another
    /// thread claimed it, and the claims (runs begun) are far fewer than the tasks.
    #[test]
    fn runs_are_consecutive_and_shrink() {
        let p = Pool::new(2);
        let tasks = 1000;
        let by: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(usize::MAX)).collect();
        let id = || std::thread::current().id();
        let caller = id();
        p.run_runs(tasks, &|i| by[i].store(usize::from(id() != caller), Relaxed));
        let owner: Vec<usize> = by.iter().map(|b| b.load(Relaxed)).collect();
        assert!(owner.iter().all(|&o| o < 2), "every task ran");
        let changes = owner.windows(2).filter(|w| w[0] != w[1]).count();
        // Halving claims over 1000 tasks: about 2 log2(1000) runs at most.
        assert!(changes <= 40, "{changes} changes of thread over 1000 tasks");
    }

    /// Back-to-back jobs of a few tasks each (as `rms_norm_split` alternates a
    /// reduction and a chunked write per row): no task of a job runs after its
    /// `run` returned. A task checks the job it belongs to is still the caller's
    /// current one.
    #[test]
    fn no_task_outlives_its_job() {
        for threads in [2, 3] {
            let p = Pool::new(threads);
            p.set_spin(Duration::from_millis(5));
            let current = AtomicUsize::new(0);
            let stale = AtomicUsize::new(0);
            for job in 1..300_000usize {
                current.store(job, SeqCst);
                // Small and large jobs in turn: a worker that paired a finished
                // small job's epoch with the next large job's count claimed past
                // the small job's end.
                let tasks = if job % 2 == 0 { 2 } else { 9 };
                let f = |i: usize| {
                    std::hint::black_box(i);
                    if current.load(SeqCst) != job || i >= tasks {
                        stale.fetch_add(1, Relaxed);
                    }
                };
                // Jobs of single claims and of runs in turn.
                if job % 3 == 0 { p.run_runs(tasks, &f) } else { p.run(tasks, &f) }
            }
            assert_eq!(stale.load(Relaxed), 0, "{threads} threads: tasks ran after their job returned");
        }
    }

    /// The shape of `rms_norm_split`: per row a reduction over chunks, then a
    /// chunked write that depends on it, back to back on the process pool.
    #[test]
    fn reductions_and_chunked_writes_alternate_safely() {
        let x: Vec<f32> = (0..576).map(|i| (i % 13) as f32 * 0.1).collect();
        let mut y = vec![0f32; 576];
        let want: f32 = x.iter().map(|v| v * v).sum();
        for round in 0..100_000 {
            let chunk = 32 + 32 * (round % 4);
            let ss = sum_chunks(&x, chunk, |c| c.iter().map(|v| v * v).sum());
            assert!((ss - want).abs() < 1e-3 * want, "round {round}");
            for_chunks_mut(&mut y, chunk, |i, yc| {
                for (j, o) in yc.iter_mut().enumerate() {
                    *o = x[i * chunk + j] * ss;
                }
            });
        }
    }

    #[test]
    fn parked_workers_wake_for_the_next_job() {
        let p = Pool::new(3);
        p.set_spin(Duration::ZERO);
        for round in 0..20 {
            std::thread::sleep(Duration::from_micros(200));
            let n = AtomicUsize::new(0);
            p.run(64, &|_| {
                n.fetch_add(1, Relaxed);
            });
            assert_eq!(n.load(Relaxed), 64, "round {round}");
        }
    }

    #[test]
    fn nested_calls_and_concurrent_callers_run_inline() {
        let p = Arc::new(Pool::new(2));
        let total = AtomicUsize::new(0);
        p.run(4, &|_| {
            p.run(3, &|_| {
                total.fetch_add(1, Relaxed);
            })
        });
        assert_eq!(total.load(Relaxed), 12);
        let callers: Vec<_> = (0..4)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || {
                    let n = AtomicUsize::new(0);
                    for _ in 0..50 {
                        p.run(16, &|_| {
                            n.fetch_add(1, Relaxed);
                        });
                    }
                    n.load(Relaxed)
                })
            })
            .collect();
        for c in callers {
            assert_eq!(c.join().unwrap(), 800);
        }
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_and_the_pool_goes_on() {
        let p = Pool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| p.run(8, &|i| assert!(i != 5, "task 5"))));
        assert!(r.is_err());
        let n = AtomicUsize::new(0);
        p.run(8, &|_| {
            n.fetch_add(1, Relaxed);
        });
        assert_eq!(n.load(Relaxed), 8);
    }

    #[test]
    fn chunk_helpers_cover_the_slices_and_reduce_in_order() {
        let mut y = vec![0usize; 1001];
        for_chunks_mut(&mut y, 64, |c, chunk| chunk.iter_mut().enumerate().for_each(|(j, v)| *v = c * 64 + j));
        assert!(y.iter().enumerate().all(|(i, &v)| v == i));
        let (mut a, mut b) = (vec![0f32; 30], vec![0f32; 10]);
        for_chunks_mut2(&mut a, 3, &mut b, 1, |i, ca, cb| {
            ca.fill(i as f32);
            cb[0] = i as f32;
        });
        assert!((0..10).all(|i| b[i] == i as f32 && a[3 * i..3 * i + 3].iter().all(|&v| v == i as f32)));
        // Rows of 10 in chunks of 4: 4, 4, 2 per row, never across a row.
        let mut z = vec![(0usize, 0usize); 50];
        for_row_chunks_mut(&mut z, 10, 4, |row, c, chunk| chunk.fill((row, c)));
        assert!(z.iter().enumerate().all(|(i, &v)| v == (i / 10, (i % 10) / 4)), "{z:?}");
        let x: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        assert_eq!(sum_chunks(&x, 7, |c| c.iter().sum()), 499_500.0);
        let m = map_reduce(&x, 10, f32::MIN, |c| c.iter().fold(f32::MIN, |m, &v| m.max(v)), f32::max);
        assert_eq!(m, 999.0);
    }
}
