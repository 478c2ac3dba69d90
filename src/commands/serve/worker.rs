//! The engine's thread: the one [`Generator`] of `serve` lives here and serves
//! the jobs the HTTP side sends, one at a time, in order, sending each request's
//! events back over that request's channel. A job whose events channel is closed
//! (its client gone, its connection dropped) is cancelled at the next token. Once
//! the server is shutting down, jobs still queued get 503.

use std::sync::atomic::Ordering;
use std::sync::mpsc;

use tokio::sync::mpsc::UnboundedSender;

use super::State;
use crate::generate::{Completion, Generator, Limits, Output};
use crate::kernels::sample::SamplerParams;
use crate::report::StopReason;

/// What the worker is asked to generate from.
pub(super) enum Input {
    Messages(Vec<(String, String)>),
    Text(String),
}

pub(super) struct Job {
    pub input: Input,
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

/// The worker: one job at a time, in order; jobs left when shutting down get 503.
/// Returns when every sender of `jobs` is gone.
pub(super) fn work(mut g: Generator, jobs: mpsc::Receiver<Job>, state: &State) {
    for job in jobs {
        if state.shutdown.load(Ordering::SeqCst) {
            let _ = job.events.send(Event::Failed(503, "the server is shutting down".into()));
        } else {
            serve_job(&mut g, job, state);
        }
        if let Ok(mut p) = state.pending.lock() {
            *p = p.saturating_sub(1);
        }
    }
}

fn serve_job(g: &mut Generator, job: Job, state: &State) {
    let prompt = match &job.input {
        Input::Messages(m) => {
            let turns: Vec<(&str, &str)> = m.iter().map(|(r, c)| (r.as_str(), c.as_str())).collect();
            g.render(&turns).map_err(|e| e.to_string())
        }
        Input::Text(t) => g.encode(t, false).map_err(|e| e.to_string()),
    };
    let prompt = match prompt {
        Ok(p) if p.is_empty() => Err("the prompt encodes to no tokens".to_string()),
        Ok(p) if p.len() >= g.context => {
            Err(format!("the prompt is {} tokens and the context holds {}: shorten it (the server's --context)", p.len(), g.context))
        }
        other => other,
    };
    let prompt = match prompt {
        Ok(p) => p,
        Err(msg) => {
            let _ = job.events.send(Event::Failed(400, msg));
            return;
        }
    };
    if job.events.send(Event::Started).is_err() {
        return;
    }
    let events = &job.events;
    let mut stream = |t: &str| events.send(Event::Text(t.to_string())).is_ok();
    match g.complete(&prompt, job.params, Output { limits: &job.limits, cancel: None, stream: &mut stream }) {
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
            let _ = events.send(Event::Done(Box::new(c)));
        }
        Err(e) => {
            let _ = events.send(Event::Failed(500, e.to_string()));
        }
    }
}
