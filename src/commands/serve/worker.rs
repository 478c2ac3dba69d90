//! The engine's thread: the one [`Generator`] of `serve` lives here and serves
//! the jobs the HTTP side sends, one at a time, in order, sending each request's
//! events back over that request's channel. A job whose events channel is closed
//! (its client gone, its connection dropped) is cancelled at the next token. Once
//! the server is shutting down, jobs still queued get 503.

use std::sync::atomic::Ordering;
use std::sync::mpsc;

use tokio::sync::mpsc::UnboundedSender;

use super::State;
use crate::generate::{Completion, Generator, Limits, Output, Running, Slot};
use crate::kernels::sample::SamplerParams;
use crate::report::StopReason;
use crate::runtime::kv_pool;

pub(super) struct Job {
    /// The prompt's tokens (the request's handler tokenized it: [`super::api`]).
    pub prompt: Vec<u32>,
    pub params: SamplerParams,
    pub limits: Limits,
    pub events: UnboundedSender<Event>,
}

/// What the worker tells a request's handler.
pub(super) enum Event {
    /// The prompt is accepted (its tokens counted): generation starts.
    Started,
    Text(String),
    Done(Box<Completion>),
    /// HTTP status and message.
    Failed(u16, String),
}

/// The worker: one job at a time, in order (with `state.parallel` above 1, as
/// many sequences at once, [`work_parallel`]); jobs left when shutting down get
/// 503. Returns when every sender of `jobs` is gone.
pub(super) fn work(mut g: Generator, jobs: mpsc::Receiver<Job>, state: &State) {
    if state.parallel > 1 {
        return work_parallel(g, jobs, state);
    }
    for job in jobs {
        if state.shutdown.load(Ordering::SeqCst) {
            end_job(state, &job, Event::Failed(503, "the server is shutting down".into()));
        } else {
            serve_job(&mut g, job, state);
        }
    }
}

/// Sends `job` its `Started`; false when its client is gone (the job ended).
fn accept(job: &Job, state: &State) -> bool {
    if job.events.send(Event::Started).is_err() {
        done_one(state);
        return false;
    }
    true
}

/// A job's end: its counters into /metrics, its completion or error to its
/// client ([`end_job`]).
fn report(job: &Job, done: crate::Result<Completion>, state: &State) {
    match done {
        Ok(c) => {
            if let Ok(mut m) = state.metrics.lock() {
                m.prompt_tokens += c.prompt_tokens as u64;
                m.prefilled_tokens += c.prefilled as u64;
                m.prefill_seconds += c.prefill_seconds;
                m.generated_tokens += c.decoded.generated.len() as u64;
                m.decode_tokens += c.decoded.decode_tokens as u64;
                m.decode_seconds += c.decoded.decode_seconds;
                if c.decoded.stop_reason == StopReason::Cancelled {
                    m.cancelled += 1;
                    eprintln!("ktune serve: a generation cancelled after {} tokens (client gone)", c.decoded.generated.len());
                }
            }
            end_job(state, job, Event::Done(Box::new(c)));
        }
        Err(e) => end_job(state, job, Event::Failed(500, e.to_string())),
    }
}

fn serve_job(g: &mut Generator, job: Job, state: &State) {
    if !accept(&job, state) {
        return;
    }
    let events = &job.events;
    let mut stream = |t: &str| events.send(Event::Text(t.to_string())).is_ok();
    let done = g.complete(&job.prompt, job.params, Output { limits: &job.limits, cancel: None, stream: &mut stream });
    report(&job, done, state);
}

/// Tokens a prompt must share with one being prefilled to wait for it rather
/// than prefill them itself.
const SHARE_AT_LEAST: usize = 32;

/// A job being generated in a slot of [`work_parallel`].
struct Active {
    job: Job,
    slot: usize,
    run: Running,
    /// KV positions it may write (its prompt and max_tokens).
    reserved: usize,
    /// Its admission's order (prompts are prefilled in it).
    seq: u64,
}

/// `state.parallel` sequences at once, each in a slot of its own (its KV cache,
/// kept after its request for the next one that shares its prefix): every step
/// admits the jobs waiting while a slot is free (each prefilled and its first
/// id sampled), then advances every running sequence by one token, so a client
/// that comes waits for one step of the others, not for their whole answers,
/// and one that leaves frees its slot at the next step. Each sequence computes
/// exactly what it would alone: its step is the one-sequence decode step with
/// its own cache swapped in.
fn work_parallel(mut g: Generator, jobs: mpsc::Receiver<Job>, state: &State) {
    let mut slots: Vec<Slot> = Vec::with_capacity(state.parallel);
    for _ in 0..state.parallel {
        match g.new_slot() {
            Ok(s) => slots.push(s),
            Err(e) => {
                eprintln!("ktune serve: cannot make a sequence slot ({e}); serving one request at a time");
                break;
            }
        }
    }
    if slots.is_empty() {
        for job in jobs {
            serve_job(&mut g, job, state);
        }
        return;
    }
    let mut active: Vec<Active> = Vec::new();
    // Prompt chunks run in the decode batch's pass (a paged KV cache).
    let mixes = g.engine.kv_blocks().is_some();
    // Jobs that wait for KV memory, oldest first (their prompts checked).
    let mut deferred: std::collections::VecDeque<Job> = std::collections::VecDeque::new();
    let limit = if state.kv_tokens == 0 { usize::MAX } else { state.kv_tokens };
    // A paged KV cache's blocks (a prefix its sequences share held once).
    let paged = g.engine.kv_blocks().map(|(_, blocks)| blocks);
    // When each slot was last used (the least recent one is reused first).
    let mut used = vec![0u64; slots.len()];
    let mut clock = 0u64;
    let mut open = true;
    while open || !active.is_empty() || !deferred.is_empty() {
        // Admit while a slot is free: wait for a job only when nothing runs.
        while active.len() < slots.len() {
            let job = match deferred.pop_front() {
                Some(d) => d,
                None if !open => break,
                None => {
                    let job = if active.is_empty() {
                        match jobs.recv() {
                            Ok(j) => j,
                            Err(_) => {
                                open = false;
                                break;
                            }
                        }
                    } else {
                        match jobs.try_recv() {
                            Ok(j) => j,
                            Err(mpsc::TryRecvError::Empty) => break,
                            Err(mpsc::TryRecvError::Disconnected) => {
                                open = false;
                                break;
                            }
                        }
                    };
                    if state.shutdown.load(Ordering::SeqCst) {
                        end_job(state, &job, Event::Failed(503, "the server is shutting down".into()));
                        continue;
                    }
                    job
                }
            };
            let prompt = &job.prompt;
            // A prompt that shares more with one being prefilled than any cache
            // holds yet waits for that prefill and then copies it (a system
            // prompt sent by many clients at once is computed once).
            let held = (0..slots.len()).map(|i| Generator::reusable(&slots[i], prompt)).max().unwrap_or(0);
            let pending = active
                .iter()
                .filter(|a| a.run.prefilling())
                .map(|a| a.run.prompt().iter().zip(prompt).take_while(|(x, y)| x == y).count())
                .max()
                .unwrap_or(0);
            if pending >= held + SHARE_AT_LEAST {
                deferred.push_front(job);
                break;
            }
            // The KV positions it may write: its prompt and every token it may generate.
            let need = (prompt.len() + job.limits.max_tokens).min(g.context);
            if need > limit {
                let msg = format!(
                    "the request needs {need} KV positions (its prompt and max_tokens) and the server holds {limit} for all requests (--kv-tokens): shorten it or ask fewer tokens"
                );
                end_job(state, &job, Event::Failed(400, msg));
                continue;
            }
            // The free slot whose cache shares most of the prompt, else the least recently used.
            let busy: Vec<usize> = active.iter().map(|a| a.slot).collect();
            let Some(slot) = (0..slots.len()).filter(|i| !busy.contains(i)).max_by_key(|&i| {
                let common = slots[i].cached().iter().zip(prompt).take_while(|(a, b)| a == b).count();
                (common, u64::MAX - used[i])
            }) else {
                deferred.push_front(job);
                break;
            };
            // Another slot holding more of the prompt (a system prompt, an earlier
            // turn) shares it: copied, not prefilled again.
            let own = Generator::reusable(&slots[slot], prompt);
            let share = (0..slots.len())
                .filter(|&i| i != slot)
                .map(|i| (i, Generator::reusable(&slots[i], prompt)))
                .max_by_key(|&(_, n)| n)
                .filter(|&(_, n)| n > own && n >= 2);
            let mut claim = Claim { slot, need, own, share };
            if !make_room(&mut slots, &active, &used, &mut claim, paged, limit) {
                deferred.push_front(job);
                break;
            }
            if !accept(&job, state) {
                continue;
            }
            clock += 1;
            used[slot] = clock;
            if let Some((from, n)) = claim.share {
                let (a, b) = (slot.min(from), slot.max(from));
                let (lo, hi) = slots.split_at_mut(b);
                let (dst, src) = if slot < from { (&mut lo[a], &hi[0]) } else { (&mut hi[0], &lo[a]) };
                if let Err(e) = g.share_prefix(dst, src, n) {
                    eprintln!("ktune serve: a shared prefix was not copied ({e}); prefilling it");
                    dst.release();
                }
            }
            let events = job.events.clone();
            let mut stream = |t: &str| events.send(Event::Text(t.to_string())).is_ok();
            // With others decoding, its first chunk joins their next pass.
            let later = mixes && active.iter().any(|a| !a.run.prefilling());
            let started = in_slot(&mut g, &mut slots[slot], |g| {
                if later {
                    g.start_later(prompt, job.params, &job.limits, state.step_tokens)
                } else {
                    g.start(prompt, job.params, &job.limits, state.step_tokens, &mut stream)
                }
            });
            match started {
                Ok(run) if run.going() => active.push(Active { job, slot, run, reserved: need, seq: clock }),
                Ok(run) => {
                    let done = in_slot(&mut g, &mut slots[slot], |g| g.end(run, &mut stream));
                    report(&job, done, state);
                }
                Err(e) => {
                    report(&job, Err(e), state);
                }
            }
        }
        if let Ok(mut m) = state.metrics.lock() {
            let last = m.batch_steps.len().saturating_sub(1);
            if let Some(n) = m.batch_steps.get_mut(active.len().min(last)) {
                *n += 1;
            }
            m.kv_positions = held(&slots, &[], None, paged).0;
            m.kv_blocks = g.engine.kv_blocks().unwrap_or_default();
            m.processing = active.len();
        }
        // One token for every running sequence: two or more in one decode batch
        // (each weight read once for all), one alone as `complete` decodes it.
        // Groups of at most the engine's batch rows; the sequences whose prompts
        // are still prefilled after them, the earliest admitted first. With a
        // paged KV cache those join the last group's pass while it has room
        // (`advance_batch`: their chunks within --step-tokens a pass); else, or
        // when none could, one chunk of the earliest a step in a pass of its own.
        active.sort_by_key(|a| if a.run.prefilling() { (1, a.seq as usize) } else { (0, a.slot) });
        let decoding = active.iter().take_while(|a| !a.run.prefilling()).count();
        let most = g.batch_rows().max(1);
        let room = if mixes && decoding >= 1 { most - (decoding - 1) % most - 1 } else { 0 };
        let batched = decoding + room.min(active.len() - decoding);
        let before: Vec<(usize, bool)> = active[decoding..].iter().map(|a| (a.run.computed(), a.run.prefilling())).collect();
        let mut step = Ok(());
        {
            let mut all: Vec<Option<&mut Slot>> = slots.iter_mut().map(Some).collect();
            for group in active[..batched].chunks_mut(most) {
                let mut mine: Vec<&mut Slot> = group.iter().filter_map(|a| all[a.slot].take()).collect();
                let events: Vec<_> = group.iter().map(|a| a.job.events.clone()).collect();
                let mut send = |i: usize, t: &str| events[i].send(Event::Text(t.to_string())).is_ok();
                step = match (group, mine.as_mut_slice()) {
                    ([a], [slot]) => in_slot(&mut g, slot, |g| g.advance(&mut a.run, &mut |t| send(0, t))).map(|_| ()),
                    (group, mine) if group.len() == mine.len() => {
                        let mut runs: Vec<&mut Running> = group.iter_mut().map(|a| &mut a.run).collect();
                        g.advance_batch(mine, &mut runs, &mut send)
                    }
                    _ => Err(crate::Error::Usage("a running request lost its slot".into())),
                };
                if step.is_err() {
                    break;
                }
            }
        }
        if let Ok(mut m) = state.metrics.lock() {
            m.batched_chunks = g.engine.mixed_passes().1;
        }
        let progressed = active[decoding..].iter().zip(&before).any(|(a, b)| (a.run.computed(), a.run.prefilling()) != *b);
        if step.is_ok()
            && !progressed
            && let Some(a) = active[decoding..].iter_mut().min_by_key(|a| a.seq)
        {
            let events = a.job.events.clone();
            let mut stream = |t: &str| events.send(Event::Text(t.to_string())).is_ok();
            step = in_slot(&mut g, &mut slots[a.slot], |g| g.advance(&mut a.run, &mut stream)).map(|_| ());
        }
        if let Err(e) = step {
            // The engine failed: every running request gets its error.
            let msg = e.to_string();
            for a in active.drain(..) {
                report(&a.job, Err(crate::Error::Usage(msg.clone())), state);
            }
            continue;
        }
        // The sequences that ended (or whose client left) give their answers.
        let mut i = 0;
        while i < active.len() {
            if active[i].run.going() && !active[i].job.events.is_closed() {
                i += 1;
                continue;
            }
            let a = active.swap_remove(i);
            let events = a.job.events.clone();
            let mut stream = |t: &str| events.send(Event::Text(t.to_string())).is_ok();
            let done = in_slot(&mut g, &mut slots[a.slot], |g| g.end(a.run, &mut stream));
            report(&a.job, done, state);
        }
    }
}

/// A job about to run in `slot`, its prompt and max_tokens `need` positions:
/// `own` of them its slot's cache holds, or `share` another slot's (which, and
/// how many) are copied into it.
struct Claim {
    slot: usize,
    need: usize,
    own: usize,
    share: Option<(usize, usize)>,
}

/// What the slots hold of the KV memory and may still take, with `job` in its
/// slot: (positions, a paged cache's blocks). Each running sequence may write its
/// prompt and max_tokens; with a paged KV cache a block several sequences share
/// counts once ([`kv_pool::claim`]), so a system prompt many requests share is
/// held once; else each slot its own positions.
fn held(slots: &[Slot], active: &[Active], job: Option<&Claim>, paged: Option<usize>) -> (usize, usize) {
    let end = |i: usize| active.iter().find(|a| a.slot == i).map_or(0, |a| a.reserved);
    if paged.is_none() {
        let mut sum: usize = (0..slots.len()).map(|i| slots[i].kv_written().max(end(i))).sum();
        if let Some(c) = job {
            sum = sum - slots[c.slot].kv_written().max(end(c.slot)) + c.need.max(slots[c.slot].kv_written());
        }
        return (sum, 0);
    }
    let claims: Vec<kv_pool::Claim> = (0..slots.len())
        .map(|i| match job {
            Some(c) if c.slot == i => match c.share {
                Some((from, n)) => slots[from].kv().prefix_claim(n, c.need),
                None => slots[i].kv().claim(c.own, c.need),
            },
            _ => slots[i].kv().claim(usize::MAX, end(i)),
        })
        .collect();
    kv_pool::claim(crate::runtime::KV_PAGE, &claims)
}

/// Makes room in the KV memory for `job` (`limit` positions, a paged cache's
/// `paged` blocks): idle slots' kept caches give theirs back, least recently
/// used first, its own slot's where it holds more than it needs, and last the
/// one it would share a prefix from (the share then dropped) and its own slot's
/// prefix; false when it must wait for a running one to end.
fn make_room(slots: &mut [Slot], active: &[Active], used: &[u64], job: &mut Claim, paged: Option<usize>, limit: usize) -> bool {
    let fits = |slots: &[Slot], job: &Claim| {
        let (positions, blocks) = held(slots, active, Some(job), paged);
        positions <= limit && paged.is_none_or(|p| blocks <= p)
    };
    let running = |i: usize| active.iter().any(|a| a.slot == i);
    let source = job.share.map(|(from, _)| from);
    let mut idle: Vec<usize> = (0..slots.len()).filter(|&i| i != job.slot && Some(i) != source && !running(i)).collect();
    idle.sort_by_key(|&i| used[i]);
    if !fits(slots, job) && job.share.is_none() && slots[job.slot].kv_written() > job.need {
        slots[job.slot].release();
    }
    for i in idle {
        if fits(slots, job) {
            return true;
        }
        slots[i].release();
    }
    if !fits(slots, job)
        && let Some(from) = source
        && !running(from)
    {
        slots[from].release();
        job.share = None;
    }
    if !fits(slots, job) {
        slots[job.slot].release();
        job.own = 0;
    }
    fits(slots, job)
}

/// Runs `f` with `slot`'s sequence swapped into the generator, swapped back after.
fn in_slot<T>(g: &mut Generator, slot: &mut Slot, f: impl FnOnce(&mut Generator) -> crate::Result<T>) -> crate::Result<T> {
    g.swap_slot(slot)?;
    let out = f(g);
    g.swap_slot(slot)?;
    out
}

/// A job's last event to its client, once the job no longer counts as pending:
/// a client that sends its next request on the answer finds the room it freed.
fn end_job(state: &State, job: &Job, last: Event) {
    done_one(state);
    let _ = job.events.send(last);
}

/// One request sent to the worker is finished.
fn done_one(state: &State) {
    if let Ok(mut p) = state.pending.lock() {
        *p = p.saturating_sub(1);
    }
}
