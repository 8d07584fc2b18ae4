//! Classes of open rows: a two-level bitmap of the nonempty classes ([`Bitmap`]), and stacks of row
//! numbers per class ([`Stacks`]). Finding the lowest nonempty class at or above any class takes two
//! bit scans, so a placement costs the same however many rows are open. `window.rs` indexes a packing
//! window's 255 rows by free room with the bitmap; `compose.rs` keeps a group's rows in stacks by
//! attention and by room.

/// Classes a bitmap covers (two levels of 64-bit words).
pub(crate) const CLASSES: usize = 4096;

/// Words of the class bitmap.
const WORDS: usize = CLASSES / 64;

// `Bitmap::summary` has a bit per word.
const _: () = assert!(WORDS <= 64);

/// The nonempty classes among [`CLASSES`].
#[derive(Clone)]
pub(crate) struct Bitmap {
    words: [u64; WORDS],
    /// Bit `w` set when word `w` is: finding the next class takes two bit scans, where walking the
    /// words was a quarter of a packing placement (measured).
    summary: u64,
}

impl Bitmap {
    pub(crate) const EMPTY: Self = Self {
        words: [0; WORDS],
        summary: 0,
    };

    /// Marks `class` (below [`CLASSES`]) nonempty.
    #[inline]
    pub(crate) fn set(&mut self, class: usize) {
        let word = (class / 64) & (WORDS - 1);
        self.words[word] |= 1 << (class % 64);
        self.summary |= 1 << word;
    }

    /// Marks `class` (below [`CLASSES`]) empty.
    #[inline]
    pub(crate) fn clear(&mut self, class: usize) {
        let word = (class / 64) & (WORDS - 1);
        self.words[word] &= !(1 << (class % 64));
        if self.words[word] == 0 {
            self.summary &= !(1 << word);
        }
    }

    /// The first nonempty class at or above `from`.
    #[inline]
    pub(crate) fn next(&self, from: usize) -> Option<usize> {
        let word = from / 64;
        let bits = self.words.get(word)? & (u64::MAX << (from % 64));
        if bits != 0 {
            return Some(word * 64 + bits.trailing_zeros() as usize);
        }
        // Words above `word` that hold a class (`word` < WORDS ≤ 64, so both shifts are in range).
        let later = self.summary & ((u64::MAX << word) << 1);
        if later == 0 {
            return None;
        }
        let word = later.trailing_zeros() as usize;
        Some(word * 64 + self.words[word].trailing_zeros() as usize)
    }
}

/// No row (end of a stack, or an empty class).
const NONE: u32 = u32::MAX;

/// Row numbers in a stack per class (singly linked through `next`, no allocation per push), with
/// the bitmap of the nonempty classes. A row leaves a class only from the top, so no list is ever
/// unlinked from the middle.
pub(crate) struct Stacks {
    head: Vec<u32>,
    next: Vec<u32>,
    bits: Bitmap,
}

impl Stacks {
    /// Empty stacks for rows numbered below `rows` (more are made room for as they come).
    pub(crate) fn new(rows: usize) -> Self {
        Self {
            head: vec![NONE; CLASSES],
            next: vec![NONE; rows],
            bits: Bitmap::EMPTY,
        }
    }

    /// Puts `row` on top of `class` (below [`CLASSES`]).
    #[inline]
    pub(crate) fn push(&mut self, row: u32, class: usize) {
        let class = class & (CLASSES - 1);
        let at = row as usize;
        if at >= self.next.len() {
            self.next.resize(at + 1, NONE);
        }
        self.next[at] = self.head[class];
        self.head[class] = row;
        self.bits.set(class);
    }

    /// Takes the top row of `class`, `None` if it is empty.
    #[inline]
    pub(crate) fn pop(&mut self, class: usize) -> Option<u32> {
        let class = class & (CLASSES - 1);
        let row = self.head[class];
        if row == NONE {
            return None;
        }
        let rest = self.next[row as usize];
        self.head[class] = rest;
        if rest == NONE {
            self.bits.clear(class);
        }
        Some(row)
    }

    /// The lowest nonempty class at or above `from`.
    #[inline]
    pub(crate) fn lowest_from(&self, from: usize) -> Option<usize> {
        self.bits.next(from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Pcg64, Stream};

    /// Random pushes and pops against a plain model: every pop returns the class's last push, and
    /// the lowest nonempty class at or above any class is the model's.
    #[test]
    fn stacks_match_a_model() {
        let mut stacks = Stacks::new(4);
        let mut model: Vec<Vec<u32>> = vec![Vec::new(); CLASSES];
        let mut rng = Pcg64::new(5, 0, Stream::Workload);
        let mut next_row = 0u32;
        for _ in 0..20_000 {
            // Crowd a few words, and sometimes anywhere.
            #[allow(clippy::cast_possible_truncation)]
            let class = if rng.below(4) == 0 {
                rng.below(CLASSES as u64) as usize
            } else {
                1_000 + rng.below(150) as usize
            };
            if rng.below(2) == 0 {
                stacks.push(next_row, class);
                model[class].push(next_row);
                next_row += 1;
            } else {
                assert_eq!(stacks.pop(class), model[class].pop());
            }
            for from in [0, 63, 64, 999, 1_000, 1_100, 4_095, 4_096] {
                let naive = (from..CLASSES).find(|&c| !model[c].is_empty());
                assert_eq!(stacks.lowest_from(from), naive, "from {from}");
            }
        }
    }
}
