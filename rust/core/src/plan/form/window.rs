//! The open rows of one packing window, indexed by free room (see [`Window`]): what makes a best-fit
//! placement cost the same for any window, tens of instructions.

use crate::plan::form::classes::{Bitmap, CLASSES};

/// Open rows per bucket (one less than a byte's values: see [`Slot`]). Rows are indexed by their
/// free room, so a placement costs the same for any window (tens of instructions); the window only
/// trades fill for the rows left open at the
/// end of the epoch. Rows left open when a forming group ends are packed again together at the end
/// of the epoch (`leftovers`), so 16 groups do not leave 16 windows of half-full rows.
pub(crate) const WINDOW: usize = 255;

/// A slot of the window. Slots are bytes and the per-slot arrays have 256 entries, so indexing
/// them needs no bounds check; 255 is no slot.
pub(crate) type Slot = u8;

/// Entries of the per-slot arrays: every slot, and `NONE`.
const SLOTS: usize = 256;

/// Samples a row has room for when its window is made (rows of the seed workload hold ~15).
const ROW_SAMPLES: usize = 32;

/// One open row.
#[derive(Debug, Default)]
pub(crate) struct Row {
    pub(crate) samples: Vec<u32>,
    pub(crate) used: u32,
    pub(crate) squares: f64,
}

/// Room classes: a row with `room` free tokens is in class `room >> shift`, at most [`CLASSES`] (for
/// rows of up to 16,384 tokens, classes of 4 tokens). A class of 2^shift tokens keeps the bitmap at
/// two levels; its price is that a sample takes a row of the lowest class whose *every* row fits,
/// so it may pass over a row of its own class with up to 2^shift − 1 tokens less room.
/// No slot (end of a class's stack, or an empty class).
const NONE: Slot = Slot::MAX;

/// The class of a slot in no stack.
const NO_CLASS: u16 = u16::MAX;

// Every slot is below `NONE`; classes fit u16.
const _: () = assert!(WINDOW == NONE as usize && CLASSES < NO_CLASS as usize);

/// A bucket's open rows in fixed slots, indexed by free room: each class is a stack of the slots
/// whose room is in `[c << shift, (c + 1) << shift)` (a singly linked list in fixed arrays, no
/// allocation per sample), and a bitmap marks the classes that hold any.
///
/// A row only ever leaves its class from the top of the stack — the best fit and the fullest row
/// are both the top of a class — so no list needs unlinking from the middle. Doubly linked lists
/// with a walk of the own class cost about 170 instructions a placement, stacks about 125 (callgrind,
/// seed workload; utilization 0.9938 either way).
pub(crate) struct Window {
    pub(crate) rows: [Row; SLOTS],
    head: [Slot; CLASSES],
    next: [Slot; SLOTS],
    /// The class of each slot in a stack; `NO_CLASS` for a free slot (or the one being filled).
    class_of: [u16; SLOTS],
    nonempty: Bitmap,
    pub(crate) free: Vec<Slot>,
    shift: u32,
    /// `(1 << shift) - 1`: a length rounded up by it to a class fits every row of that class.
    round: u32,
}

impl Window {
    pub(crate) fn new(capacity: u32) -> Self {
        // The smallest shift that maps every room (below `capacity`: a row is indexed after it
        // takes a sample) below CLASSES.
        let shift = (0..32)
            .find(|&s| ((capacity.saturating_sub(1) >> s) as usize) < CLASSES)
            .unwrap_or(31);
        Self {
            // Room for a typical row's samples up front: growing 255 rows' buffers one doubling at
            // a time took ~8K reallocations an epoch (callgrind).
            rows: std::array::from_fn(|_| Row {
                samples: Vec::with_capacity(ROW_SAMPLES),
                ..Row::default()
            }),
            head: [NONE; CLASSES],
            next: [NONE; SLOTS],
            class_of: [NO_CLASS; SLOTS],
            nonempty: Bitmap::EMPTY,
            // The lowest slot is taken first.
            free: (0..NONE).rev().collect(),
            shift,
            round: (1 << shift) - 1,
        }
    }

    /// The first nonempty class at or above `from`.
    #[inline]
    fn next_class(&self, from: usize) -> Option<usize> {
        self.nonempty.next(from)
    }

    /// The best fit to within a class: the class of the rows with the least room of those whose
    /// every row fits `length` (`length` rounded up to a class).
    #[inline]
    pub(crate) fn best_fit(&self, length: u32) -> Option<usize> {
        // In u64: a length near u32::MAX rounded up must not wrap into a low class.
        let class = (u64::from(length) + u64::from(self.round)) >> self.shift;
        // Past the last class `next_class` finds none; the cast only loses that on 16-bit targets.
        #[allow(clippy::cast_possible_truncation)]
        self.next_class(class as usize)
    }

    /// The class of the open rows with the least room.
    pub(crate) fn fullest(&self) -> Option<usize> {
        self.next_class(0)
    }

    /// Whether `slot` holds an open row.
    pub(crate) fn is_open(&self, slot: usize) -> bool {
        self.class_of[slot] != NO_CLASS
    }

    /// Takes the top slot of the nonempty class `class` off its stack.
    #[inline]
    pub(crate) fn pop(&mut self, class: usize) -> Slot {
        // Classes are below CLASSES (a power of two): the mask only spares the bounds checks.
        let class = class & (CLASSES - 1);
        let slot = self.head[class];
        let rest = self.next[usize::from(slot)];
        self.head[class] = rest;
        if rest == NONE {
            self.nonempty.clear(class);
        }
        self.class_of[usize::from(slot)] = NO_CLASS;
        slot
    }

    /// Puts `slot`, with `room` free tokens, on top of its class's stack.
    #[inline]
    pub(crate) fn push(&mut self, slot: Slot, room: u32) {
        // Rooms are below the capacity, so classes below CLASSES: the mask only spares the
        // bounds checks.
        let class = (room >> self.shift) as usize & (CLASSES - 1);
        self.next[usize::from(slot)] = self.head[class];
        self.head[class] = slot;
        // Classes fit u16 (asserted).
        #[allow(clippy::cast_possible_truncation)]
        {
            self.class_of[usize::from(slot)] = class as u16;
        }
        self.nonempty.set(class);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Pcg64, Stream};

    /// Random stack operations: a free slot is pushed with a room in `[low, low + spread)`, or the
    /// top of a random nonempty class is popped. `rooms` mirrors each open slot's room.
    fn churn(
        window: &mut Window,
        rooms: &mut [Option<u32>],
        rng: &mut Pcg64,
        low: u32,
        spread: u32,
    ) {
        if rng.below(2) == 0 {
            if let Some(slot) = window.free.pop() {
                // Rooms fit u32 (below the capacity).
                #[allow(clippy::cast_possible_truncation)]
                let room = low + rng.below(u64::from(spread)) as u32;
                window.push(slot, room);
                rooms[usize::from(slot)] = Some(room);
                return;
            }
        }
        // Classes fit usize.
        #[allow(clippy::cast_possible_truncation)]
        let from = rng.below(CLASSES as u64) as usize;
        if let Some(class) = window.next_class(from).or_else(|| window.fullest()) {
            let slot = window.pop(class);
            let at = usize::from(slot);
            assert_eq!(rooms[at].map(|r| (r >> window.shift) as usize), Some(class));
            rooms[at] = None;
            window.free.push(slot);
        }
    }

    /// The two-level bitmap finds the same class as scanning every class would, for rooms spread
    /// over all classes and crowded into a few words.
    #[test]
    fn next_class_is_the_first_nonempty_class_at_or_above() {
        for (low, spread) in [(0, 16_384), (4_000, 300), (0, 70), (16_200, 184)] {
            let mut window = Window::new(16_384);
            assert_eq!(window.shift, 2);
            let mut rooms = vec![None; WINDOW];
            let mut rng = Pcg64::new(1, u64::from(low), Stream::Workload);
            for _ in 0..3_000 {
                churn(&mut window, &mut rooms, &mut rng, low, spread);
                let naive = |from: usize| (from..CLASSES).find(|&c| window.head[c] != NONE);
                for from in [0, 1, 63, 64, 65, 300, 1_000, 4_031, 4_032, 4_095, 4_096] {
                    assert_eq!(window.next_class(from), naive(from), "from {from}");
                }
            }
        }
    }

    /// The best fit's class holds only rows that fit, and no lower class does; exact when a class
    /// is one token wide.
    #[test]
    fn best_fit_is_the_lowest_class_whose_rows_all_fit() {
        for capacity in [16_384, 4_000, 100_000, u32::MAX] {
            let mut window = Window::new(capacity);
            let mut rooms = vec![None; WINDOW];
            let mut rng = Pcg64::new(3, u64::from(capacity), Stream::Workload);
            for _ in 0..3_000 {
                churn(&mut window, &mut rooms, &mut rng, 1, capacity - 1);
                // Lengths fit u32 (at most the capacity).
                #[allow(clippy::cast_possible_truncation)]
                let length = 1 + rng.below(u64::from(capacity)) as u32;
                let shift = window.shift;
                let whole = |room: u32| ((room >> shift) << shift) >= length;
                let expected = rooms
                    .iter()
                    .flatten()
                    .filter(|&&r| whole(r))
                    .map(|&r| (r >> shift) as usize)
                    .min();
                let found = window.best_fit(length);
                assert_eq!(found, expected, "capacity {capacity}, length {length}");
                if let Some(class) = found {
                    let fits = rooms
                        .iter()
                        .flatten()
                        .filter(|&&r| (r >> shift) as usize == class);
                    assert!(fits.clone().count() > 0 && fits.into_iter().all(|&r| r >= length));
                }
                if shift == 0 {
                    let tightest = rooms.iter().flatten().filter(|&&r| r >= length).min();
                    assert_eq!(found, tightest.map(|&r| r as usize));
                }
            }
        }
    }
}
