//! The blocks of a paged KV cache ([`Engine::enable_paged`](super::Engine::enable_paged)):
//! which of the pool's blocks are free and how many sequences hold each. A
//! sequence's table names its blocks in position order; a prefix shared between
//! sequences is the same blocks in both tables (each holder counted), and a
//! sequence about to write into a block another also holds gets a copy first
//! (copy on write: the engine copies the rows). Tables hand their blocks back
//! when their sequence is released or dropped.

use std::sync::{Arc, Mutex, MutexGuard};

use super::RuntimeError;

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

/// One sequence's part in [`claim`]: its table, the positions its cache holds
/// (`pos`), the most it was written up to (`written`: a longer answer's blocks
/// are still held) and the position its writes may reach (`end`: its prompt and
/// max_tokens; `pos` for one that writes no more).
#[derive(Clone, Copy)]
pub struct Claim<'a> {
    pub table: &'a [u32],
    pub pos: usize,
    pub written: usize,
    pub end: usize,
}

/// What `seqs` (every table of a pool, as they would be) hold and may still
/// take: (positions, blocks). A block several tables hold counts once, its
/// fullest holder's positions; a sequence's writes from `pos` to `end` take a
/// fresh block past its table's end and a copy of a block another of `seqs`
/// also holds (copy on write: [`PassTables::page_in`]), each counted with the
/// positions the writes fill. So a system prompt many sequences share counts
/// once, and the blocks are what the pool must still hand out.
pub fn claim(page: usize, seqs: &[Claim]) -> (usize, usize) {
    let mut holders: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
    for s in seqs {
        for &id in s.table {
            *holders.entry(id).or_default() += 1;
        }
    }
    let filled = |reach: usize, i: usize| reach.saturating_sub(i * page).min(page);
    let mut fill: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
    let mut fresh = (0, 0);
    for s in seqs {
        let writes = if s.end > s.pos { s.pos / page..s.end.div_ceil(page) } else { 0..0 };
        for (i, &id) in s.table.iter().enumerate() {
            let written = writes.contains(&i);
            if written && holders[&id] > 1 {
                continue; // copied before the write: counted below
            }
            let reach = if written { s.end } else { s.written.max(s.pos) };
            let f = fill.entry(id).or_default();
            *f = (*f).max(filled(reach, i));
        }
        for i in writes {
            if s.table.get(i).is_none_or(|id| holders[id] > 1) {
                fresh.0 += filled(s.end, i);
                fresh.1 += 1;
            }
        }
    }
    (fill.values().sum::<usize>() + fresh.0, fill.len() + fresh.1)
}

/// The tables of a pass over paged sequences: where its rows' keys and values go
/// and where its attention reads them. `page`: positions a block; `blocks`:
/// the pool's; `max_blocks`: a table row's block entries (the context's).
/// `pages`: a row of `2 + max_blocks` f32 for each of the pass's sequences
/// ([`PassTables::seqs`]), its tokens in the pass, its length after them and its blocks
/// (`blocks` past its last), [`Problem::AttentionPaged`](crate::kernels::Problem::AttentionPaged)'s
/// table. `copies`: the blocks to copy (`from`, `to`) before the pass writes,
/// each one another table still holds, copied for the one about to write into it.
pub struct PassTables {
    pub page: usize,
    pub blocks: usize,
    pub max_blocks: usize,
    pub pages: Vec<f32>,
    pub copies: Vec<(u32, u32)>,
}

impl PassTables {
    pub fn new(page: usize, blocks: usize, max_blocks: usize) -> PassTables {
        PassTables { page, blocks, max_blocks, pages: Vec::new(), copies: Vec::new() }
    }

    /// Readies a pass over `seqs` (each its table, its position and the tokens
    /// the pass feeds it): every block a new position falls in is held by that
    /// table alone (a fresh one from `pool` past the table's end; a fresh one
    /// for a block another table also holds, its copy listed in `copies`), and
    /// `pages` holds the pass's table rows.
    pub fn page_in(&mut self, pool: &KvPool, seqs: &mut [(&mut Vec<u32>, usize, usize)]) -> Result<(), RuntimeError> {
        let (page, w) = (self.page, 2 + self.max_blocks);
        self.pages.clear();
        self.pages.resize(seqs.len() * w, self.blocks as f32);
        self.copies.clear();
        let full = || RuntimeError::KvFull { blocks: pool.blocks() };
        for (s, (table, pos, n)) in seqs.iter_mut().enumerate() {
            let end = *pos + *n;
            if end.div_ceil(page) > self.max_blocks {
                return Err(RuntimeError::ContextFull { pos: end, context: self.max_blocks * page });
            }
            for b in *pos / page..end.div_ceil(page) {
                if b >= table.len() {
                    table.push(pool.alloc().ok_or_else(full)?);
                } else if pool.shared(table[b]) {
                    let fresh = pool.alloc().ok_or_else(full)?;
                    self.copies.push((table[b], fresh));
                    pool.release(&[table[b]]);
                    table[b] = fresh;
                }
            }
            let row = &mut self.pages[s * w..(s + 1) * w];
            row[0] = *n as f32;
            row[1] = end as f32;
            for (slot, &b) in row[2..].iter_mut().zip(table.iter()) {
                *slot = b as f32;
            }
        }
        Ok(())
    }

    /// The paged call of a planned attention step (its heads, window and scale)
    /// over this pass's sequences; None for another step. A bidirectional block
    /// (an image's tokens) has no paged form.
    pub fn problem(&self, p: &crate::kernels::Problem) -> Result<Option<crate::kernels::Problem>, RuntimeError> {
        use crate::kernels::Problem;
        let (heads, kv_heads, head_dim, window, scale) = match *p {
            Problem::AttentionPrefill { bidi_start, bidi_end, .. } if bidi_start < bidi_end => {
                return Err(RuntimeError::Internal(
                    "an image's tokens attend to each other, which the paged KV cache does not serve: serve images with --parallel 1"
                        .into(),
                ));
            }
            Problem::AttentionPrefill { heads, kv_heads, head_dim, window, scale, .. }
            | Problem::AttentionDecode { heads, kv_heads, head_dim, window, scale, .. } => (heads, kv_heads, head_dim, window, scale),
            Problem::QkvRopeCache { .. } => {
                return Err(RuntimeError::Internal("the fused KV write has no paged form (the plan fuses qkv_rope_cache)".into()));
            }
            _ => return Ok(None),
        };
        let tokens = self.rows().count();
        Ok(Some(Problem::AttentionPaged {
            seqs: self.seqs(),
            tokens,
            heads,
            kv_heads,
            head_dim,
            page: self.page,
            blocks: self.blocks,
            max_blocks: self.max_blocks,
            window,
            scale,
        }))
    }

    /// The pass's sequences (its table rows).
    pub fn seqs(&self) -> usize {
        self.pages.len() / (2 + self.max_blocks)
    }

    /// Sequence `s`'s blocks, as the table row holds them.
    pub fn table(&self, s: usize) -> &[f32] {
        &self.pages[s * (2 + self.max_blocks) + 2..][..self.max_blocks]
    }

    /// The pass's rows in order: each row's position and the pool block it lies
    /// in (a sequence's rows from its length before the pass).
    pub fn rows(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let w = 2 + self.max_blocks;
        (0..self.seqs()).flat_map(move |s| {
            let (n, end) = (self.pages[s * w] as usize, self.pages[s * w + 1] as usize);
            (end - n..end).map(move |p| (p, self.table(s)[p / self.page] as usize))
        })
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

    #[test]
    fn a_shared_prefix_is_claimed_once_and_its_written_block_copied() {
        let seq = |table: &'static [u32], pos, end| Claim { table, pos, written: pos, end };
        // Alone: 100 positions in 2 blocks of 64, writing to 150 takes a third.
        assert_eq!(claim(64, &[seq(&[0, 1], 100, 150)]), (150, 3));
        // Two sequences share a prompt of 100 positions (blocks 0 and 1): block 0
        // counts once; each writer copies block 1 (it fills to its end), and the
        // original stays held until both have copied (one copy is its last holder).
        assert_eq!(claim(64, &[seq(&[0, 1], 100, 110), seq(&[0, 1], 100, 120)]), (64 + 46 + 56, 3));
        // One of them idle: block 1 stays its, 36 positions; the writer's copy is
        // 56 positions, and its next block 0 more.
        assert_eq!(claim(64, &[seq(&[0, 1], 100, 100), seq(&[0, 1], 100, 120)]), (64 + 36 + 56, 3));
        // A prefix of whole blocks: nothing copied, the writer's next block fresh.
        assert_eq!(claim(64, &[seq(&[0], 64, 64), seq(&[0], 64, 80)]), (64 + 16, 2));
        // A longer answer's blocks are held past where the cache now ends.
        let reused = Claim { table: &[0, 1, 2], pos: 10, written: 140, end: 20 };
        assert_eq!(claim(64, &[reused]), (20 + 64 + 12, 3));
        // Nothing written and nothing to come.
        assert_eq!(claim(64, &[seq(&[], 0, 0)]), (0, 0));
    }
}
