//! The blocks of a paged KV cache ([`Engine::enable_paged`](super::Engine::enable_paged)):
//! which of the pool's blocks are free and how many sequences hold each. A
//! sequence's table names its blocks in position order; a prefix shared between
//! sequences is the same blocks in both tables (each holder counted), and a
//! sequence about to write into a block another also holds gets a copy first
//! (copy on write: the engine copies the rows). Tables hand their blocks back
//! when their sequence is released or dropped.

use std::sync::{Arc, Mutex, MutexGuard};

/// The pool's bookkeeping, shared by the engine and every sequence of it.
#[derive(Clone)]
pub struct KvPool(Arc<Mutex<Blocks>>);

struct Blocks {
    /// Holders of each block (0: free).
    refs: Vec<u32>,
    /// Free blocks, the next to hand out last.
    free: Vec<u32>,
}

impl KvPool {
    /// A pool of `blocks` free blocks.
    pub fn new(blocks: usize) -> KvPool {
        KvPool(Arc::new(Mutex::new(Blocks { refs: vec![0; blocks], free: (0..blocks as u32).rev().collect() })))
    }

    fn lock(&self) -> MutexGuard<'_, Blocks> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A free block, now held once; None when every block is held.
    pub fn alloc(&self) -> Option<u32> {
        let mut b = self.lock();
        let id = b.free.pop()?;
        b.refs[id as usize] = 1;
        Some(id)
    }

    /// `ids` held once more each (a prefix shared by another table).
    pub fn retain(&self, ids: &[u32]) {
        let mut b = self.lock();
        for &id in ids {
            b.refs[id as usize] += 1;
        }
    }

    /// `ids` held once less each; a block nobody holds is free again.
    pub fn release(&self, ids: &[u32]) {
        let mut b = self.lock();
        for &id in ids {
            let r = &mut b.refs[id as usize];
            *r = r.saturating_sub(1);
            if *r == 0 {
                b.free.push(id);
            }
        }
    }

    /// Whether another table also holds block `id` (a write needs a copy first).
    pub fn shared(&self, id: u32) -> bool {
        self.lock().refs[id as usize] > 1
    }

    /// Blocks held by some table.
    pub fn used(&self) -> usize {
        let b = self.lock();
        b.refs.len() - b.free.len()
    }

    /// Blocks in the pool.
    pub fn blocks(&self) -> usize {
        self.lock().refs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_free_again_when_their_last_holder_lets_go() {
        let p = KvPool::new(3);
        let (a, b) = (p.alloc().expect("free"), p.alloc().expect("free"));
        assert_eq!(p.used(), 2);
        p.retain(&[a]);
        assert!(p.shared(a) && !p.shared(b));
        p.release(&[a, b]);
        assert_eq!(p.used(), 1, "a is still held once");
        assert!(!p.shared(a));
        let c = p.alloc().expect("free");
        assert!(p.alloc().is_some() && p.alloc().is_none(), "three blocks in all");
        p.release(&[a, c]);
        assert_eq!(p.used(), 1);
    }
}
