//! How long-running work reports how far it is, without printing: the library
//! calls a [`Progress`]; `output` implements it with progress bars on stderr; tests
//! and quiet callers pass [`Silent`].

/// What the caller sees of long work as it goes.
pub trait Progress {
    /// A new phase of `len` steps (ends the previous one).
    fn phase(&self, _msg: &str, _len: u64) {}
    /// What the current step works on.
    fn step(&self, _what: &str) {}
    /// One step done.
    fn tick(&self) {}
    /// `n` more units of the phase done (bytes of a download).
    fn advance(&self, _n: u64) {}
    /// The phase is `pos` units along (a resumed download).
    fn advance_to(&self, _pos: u64) {}
    /// A line worth telling the user.
    fn note(&self, _msg: &str) {}
    /// The last phase is over.
    fn done(&self) {}
}

/// Reports nothing.
pub struct Silent;
impl Progress for Silent {}
