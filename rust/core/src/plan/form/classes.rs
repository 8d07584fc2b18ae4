//! Classes of open rows: a two-level bitmap of the nonempty classes ([`Bitmap`]), and doubly linked
//! lists of row numbers per class ([`Lists`]). Finding the lowest nonempty class at or above any class
//! takes two bit scans, so a placement costs the same however many rows are open. `window.rs` indexes
//! a packing window's 255 rows by free room with the bitmap; `compose.rs` keeps a group's rows in
//! lists by attention and by room.

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

/// No row (end of a list, or an empty class).
const NONE: u32 = u32::MAX;

/// Row numbers in a doubly linked list per class, with the bitmap of the nonempty classes: a row
/// joins a class first and can leave it from anywhere ([`Lists::remove`]), at 10 bytes a row. `compose.rs` indexes a group's rows by free room with it, and takes a row it
/// closes out of the attention index wherever the row stands there.
pub(crate) struct Lists {
    head: Vec<u32>,
    next: Vec<u32>,
    prev: Vec<u32>,
    /// Each row's class, [`OUT`] when it is in none.
    class: Vec<u16>,
    bits: Bitmap,
}

/// The class of a row in no list.
const OUT: u16 = u16::MAX;

// Classes fit in u16 below OUT.
const _: () = assert!(CLASSES < OUT as usize);

impl Lists {
    /// Empty lists for rows numbered below `rows` (more are made room for as they come).
    pub(crate) fn new(rows: usize) -> Self {
        Self {
            head: vec![NONE; CLASSES],
            next: vec![NONE; rows],
            prev: vec![NONE; rows],
            class: vec![OUT; rows],
            bits: Bitmap::EMPTY,
        }
    }

    /// Puts `row` (in no list) first in `class` (below [`CLASSES`]).
    #[inline]
    pub(crate) fn push(&mut self, row: u32, class: usize) {
        let class = class & (CLASSES - 1);
        let at = row as usize;
        if at >= self.next.len() {
            self.next.resize(at + 1, NONE);
            self.prev.resize(at + 1, NONE);
            self.class.resize(at + 1, OUT);
        }
        debug_assert_eq!(self.class[at], OUT, "row {row} is in a list already");
        let first = self.head[class];
        self.next[at] = first;
        self.prev[at] = NONE;
        if first != NONE {
            self.prev[first as usize] = row;
        }
        self.head[class] = row;
        // Below CLASSES < OUT (asserted above).
        #[allow(clippy::cast_possible_truncation)]
        let short = class as u16;
        self.class[at] = short;
        self.bits.set(class);
    }

    /// Takes `row` out of its class; `false` when it is in none.
    #[inline]
    pub(crate) fn remove(&mut self, row: u32) -> bool {
        let at = row as usize;
        let Some(&class) = self.class.get(at).filter(|&&c| c != OUT) else {
            return false;
        };
        let (before, after) = (self.prev[at], self.next[at]);
        if before == NONE {
            self.head[usize::from(class)] = after;
            if after == NONE {
                self.bits.clear(usize::from(class));
            }
        } else {
            self.next[before as usize] = after;
        }
        if after != NONE {
            self.prev[after as usize] = before;
        }
        self.class[at] = OUT;
        true
    }

    /// The first row of `class`, left in place; `None` if it is empty.
    #[inline]
    pub(crate) fn first(&self, class: usize) -> Option<u32> {
        let row = self.head[class & (CLASSES - 1)];
        (row != NONE).then_some(row)
    }

    /// Takes the first row of `class`, `None` if it is empty.
    #[inline]
    pub(crate) fn pop(&mut self, class: usize) -> Option<u32> {
        let row = self.first(class)?;
        self.remove(row);
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

    /// Random pushes, pops and removals anywhere against a plain model: a pop returns the class's
    /// last push still in it, a removal says whether the row was in a list, and the lowest nonempty
    /// class at or above any class is the model's.
    #[test]
    fn lists_match_a_model() {
        let mut lists = Lists::new(2);
        let mut model: Vec<Vec<u32>> = vec![Vec::new(); CLASSES];
        let mut rng = Pcg64::new(6, 0, Stream::Workload);
        let rows = 300u32;
        for _ in 0..30_000 {
            // Sized by the model's classes: a small modulus, far below 2^32.
            #[allow(clippy::cast_possible_truncation)]
            let row = rng.below(u64::from(rows)) as u32;
            #[allow(clippy::cast_possible_truncation)]
            let class = if rng.below(3) == 0 {
                rng.below(CLASSES as u64) as usize
            } else {
                2_000 + rng.below(100) as usize
            };
            let inside = model.iter().position(|c| c.contains(&row));
            match rng.below(3) {
                0 if inside.is_none() => {
                    lists.push(row, class);
                    model[class].push(row);
                }
                1 => {
                    assert_eq!(lists.pop(class), model[class].pop());
                }
                _ => {
                    assert_eq!(lists.remove(row), inside.is_some());
                    if let Some(c) = inside {
                        model[c].retain(|&r| r != row);
                    }
                }
            }
            assert_eq!(lists.first(class), model[class].last().copied());
            for from in [0, 63, 64, 1_999, 2_000, 2_050, 4_095, 4_096] {
                let naive = (from..CLASSES).find(|&c| !model[c].is_empty());
                assert_eq!(lists.lowest_from(from), naive, "from {from}");
            }
        }
    }
}
