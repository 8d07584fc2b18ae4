//! Where each epoch's slice of a source's cycle lies (`select.rs` reads it), under fixed weights or a
//! schedule (`schedule.rs`).
//!
//! A source's slices follow each other through its cycle: an epoch takes its `rest` (samples or
//! tokens) from where the epoch before stopped, in the same cycle while the slice fits, else from
//! the start of the next cycle. So within a cycle no row is taken twice, whatever the slices' sizes,
//! and a change of weights neither restarts the cycle nor skips what is left of it — only a stretch
//! at the cycle's end shorter than the next slice waits for the next cycle, as with fixed weights.
//! Under fixed weights `rest` never changes and epoch `k` takes slice `k mod m` of cycle `⌊k / m⌋`
//! (`m = ⌊total / rest⌋`) — the walk's closed form, and the selection of every planner before
//! schedules.
//!
//! With a schedule, the weights change at most up to the last point (its *span*); the walk is taken
//! epoch by epoch once, up to the span, keeping every source's place at every [`STRIDE`]-th epoch, so
//! an epoch's slice costs at most `STRIDE` epochs' quotas; past the span the closed form runs from
//! the span's place.

use crate::error::Result;

/// Epochs between two kept places of the walk.
const STRIDE: u64 = 256;

/// One source's quota of an epoch: whole copies of its admitted rows plus `rest` (samples or tokens)
/// from its cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Quota {
    pub(crate) copies: u64,
    pub(crate) rest: u64,
}

/// A source's part of one epoch: whole copies of its rows, and `rest` (samples or tokens) of cycle
/// `cycle` from position `from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slice {
    pub(crate) copies: u64,
    pub(crate) rest: u64,
    pub(crate) cycle: u64,
    pub(crate) from: u64,
}

/// Where a source's last slice ended: a cycle and a position in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Place {
    cycle: u64,
    at: u64,
}

impl Place {
    /// Where a slice of `rest` taken from here starts: here if it fits in the cycle's `total`, else
    /// the next cycle's start.
    fn start(self, rest: u64, total: u64) -> Place {
        if self.at + rest > total {
            Place {
                cycle: self.cycle + 1,
                at: 0,
            }
        } else {
            self
        }
    }

    /// The place after a slice of `rest` taken from here.
    fn after(self, rest: u64, total: u64) -> Place {
        if rest == 0 {
            return self;
        }
        let start = self.start(rest, total);
        Place {
            at: start.at + rest,
            ..start
        }
    }

    /// The place after `n` slices of `rest` each, in closed form (see the module docs).
    fn after_many(self, rest: u64, total: u64, n: u64) -> Place {
        if rest == 0 || n == 0 {
            return self;
        }
        // A rest is below its source's total (`quotas.rs`): at least one slice fits a cycle.
        let per_cycle = (total / rest).max(1);
        let fit = total.saturating_sub(self.at) / rest;
        if n <= fit {
            return Place {
                at: self.at + n * rest,
                ..self
            };
        }
        let last = n - fit - 1;
        Place {
            cycle: self.cycle + 1 + last / per_cycle,
            at: (last % per_cycle + 1) * rest,
        }
    }
}

/// The walk of a schedule's slices (see the module docs).
#[derive(Debug)]
pub(crate) struct Walk {
    /// Every source's place at the start of epochs `0, STRIDE, 2·STRIDE, …` up to the span:
    /// `places[k · sources + s]`.
    places: Vec<Place>,
    /// The last point's epoch, every source's place at its start, and the quotas from it on.
    span: u64,
    at_span: Vec<Place>,
    last: Vec<Quota>,
}

impl Walk {
    /// Walks epochs `0..=span` of sources of `totals` (samples or tokens), `quotas(epoch)` giving each
    /// epoch's quotas or refusing them.
    pub(crate) fn new(
        span: u64,
        totals: &[u64],
        mut quotas: impl FnMut(u64) -> Result<Vec<Quota>>,
    ) -> Result<Self> {
        let mut place = vec![Place::default(); totals.len()];
        let mut places = Vec::new();
        for epoch in 0..span {
            if epoch.is_multiple_of(STRIDE) {
                places.extend_from_slice(&place);
            }
            let now = quotas(epoch)?;
            for ((p, quota), &total) in place.iter_mut().zip(&now).zip(totals) {
                *p = p.after(quota.rest, total);
            }
        }
        let last = quotas(span)?;
        if span.is_multiple_of(STRIDE) {
            places.extend_from_slice(&place);
        }
        Ok(Self {
            places,
            span,
            at_span: place,
            last,
        })
    }

    /// Every source's slice of the epoch keyed `key`, `quotas(epoch)` giving each epoch's quotas.
    pub(crate) fn slices(
        &self,
        key: u64,
        totals: &[u64],
        quotas: impl Fn(u64) -> Vec<Quota>,
    ) -> Vec<Slice> {
        if key >= self.span {
            return slices_from(&self.last, &self.at_span, totals, key - self.span);
        }
        let sources = totals.len();
        let kept = key / STRIDE;
        let from = usize::try_from(kept).unwrap_or(usize::MAX) * sources;
        let mut place = self.places[from..from + sources].to_vec();
        for epoch in kept * STRIDE..key {
            for ((p, quota), &total) in place.iter_mut().zip(quotas(epoch)).zip(totals) {
                *p = p.after(quota.rest, total);
            }
        }
        slices_from(&quotas(key), &place, totals, 0)
    }
}

/// Every source's slice of epoch `key` under fixed `quotas`: the walk's closed form from the start.
pub(crate) fn fixed_slices(quotas: &[Quota], totals: &[u64], key: u64) -> Vec<Slice> {
    slices_from(quotas, &vec![Place::default(); quotas.len()], totals, key)
}

/// The slices of the epoch `n` epochs of `quotas` after every source's `place`.
fn slices_from(quotas: &[Quota], place: &[Place], totals: &[u64], n: u64) -> Vec<Slice> {
    quotas
        .iter()
        .zip(place)
        .zip(totals)
        .map(|((quota, place), &total)| {
            let start = place
                .after_many(quota.rest, total, n)
                .start(quota.rest, total);
            Slice {
                copies: quota.copies,
                rest: quota.rest,
                cycle: start.cycle,
                from: start.at,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The closed form is the walk taken one slice at a time, and from the cycle's start it is
        /// slice `k mod m` of cycle `⌊k / m⌋`.
        #[test]
        fn the_closed_form_is_the_walk(
            total in 1u64..200, rest_part in 0u64..200, at_part in 0u64..=200, n in 0u64..60,
        ) {
            let rest = rest_part % total;
            let start = Place { cycle: 3, at: at_part % (total + 1) };
            let mut walked = start;
            for _ in 0..n {
                walked = walked.after(rest, total);
            }
            prop_assert_eq!(start.after_many(rest, total, n), walked);
            if let Some(per_cycle) = total.checked_div(rest) {
                let first = Place::default().after_many(rest, total, n).start(rest, total);
                prop_assert_eq!(first, Place { cycle: n / per_cycle, at: n % per_cycle * rest });
            }
        }

        /// Slices never overlap within a cycle and follow each other, whatever their sizes.
        #[test]
        fn slices_of_any_sizes_tile_each_cycle(
            total in 1u64..100, rests in proptest::collection::vec(0u64..100, 1..40),
        ) {
            let mut place = Place::default();
            let mut taken: Vec<(u64, u64, u64)> = Vec::new();
            for rest in rests.iter().map(|r| r % total) {
                if rest == 0 {
                    continue;
                }
                let start = place.start(rest, total);
                prop_assert!(start.at + rest <= total);
                if let Some(&(cycle, _, end)) = taken.last() {
                    if cycle == start.cycle {
                        prop_assert_eq!(end, start.at, "a slice starts where the one before ended");
                    } else {
                        prop_assert!(end + rest > total, "a cycle is left only when the slice does not fit");
                        prop_assert_eq!(start.at, 0);
                    }
                }
                taken.push((start.cycle, start.at, start.at + rest));
                place = place.after(rest, total);
            }
        }
    }
}
