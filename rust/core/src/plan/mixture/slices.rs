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
use crate::plan::mixture::quotas::Quota;
use crate::plan::mixture::Mix;

/// Epochs between two kept places of the walk.
const STRIDE: u64 = 256;

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
    /// Walks `mix`'s schedule up to its span, refusing the first epoch whose weights ask a source for
    /// more than the cap.
    pub(super) fn new(mix: &Mix) -> Result<Self> {
        let span = mix.spec.schedule.as_ref().map_or(0, |s| s.span());
        let mut place = vec![Place::default(); mix.len()];
        let mut places = Vec::new();
        let (mut weights, mut quotas) = (mix.spec.weights_at(0), mix.quotas.clone());
        for epoch in 0..span {
            if epoch.is_multiple_of(STRIDE) {
                places.extend_from_slice(&place);
            }
            let now = mix.spec.weights_at(epoch);
            if now != weights {
                mix.check(&now, Some(epoch))?;
                quotas = mix.apportion(&now);
                weights = now;
            }
            for (s, p) in place.iter_mut().enumerate() {
                *p = p.after(quotas[s].rest, mix.totals[s]);
            }
        }
        let last_weights = mix.spec.weights_at(span);
        mix.check(&last_weights, Some(span))?;
        if span.is_multiple_of(STRIDE) {
            places.extend_from_slice(&place);
        }
        Ok(Self {
            places,
            span,
            at_span: place,
            last: mix.apportion(&last_weights),
        })
    }
}

impl Mix {
    /// Every source's slice of the epoch keyed `key` (see the module docs).
    pub(crate) fn slices(&self, key: u64) -> Vec<Slice> {
        let Some(walk) = &self.walk else {
            return self.slices_from(&self.quotas, &vec![Place::default(); self.len()], key);
        };
        if key >= walk.span {
            return self.slices_from(&walk.last, &walk.at_span, key - walk.span);
        }
        let sources = self.len();
        let kept = key / STRIDE;
        let from = usize::try_from(kept).unwrap_or(usize::MAX) * sources;
        let mut place = walk.places[from..from + sources].to_vec();
        for epoch in kept * STRIDE..key {
            let quotas = self.apportion(&self.spec.weights_at(epoch));
            for (s, p) in place.iter_mut().enumerate() {
                *p = p.after(quotas[s].rest, self.totals[s]);
            }
        }
        self.slices_from(&self.apportion(&self.spec.weights_at(key)), &place, 0)
    }

    /// The slices of the epoch `n` epochs of `quotas` after every source's `place`.
    fn slices_from(&self, quotas: &[Quota], place: &[Place], n: u64) -> Vec<Slice> {
        quotas
            .iter()
            .zip(place)
            .zip(&self.totals)
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::mixture::{Interpolation, Mixture, Point, Schedule, Unit};
    use proptest::prelude::*;

    /// Past the first kept place and past the span, every epoch's slices are those of the walk taken
    /// one epoch at a time from epoch 0 (a long linear schedule: every epoch's rests differ).
    #[test]
    fn kept_places_and_the_closed_form_agree_with_the_walk() {
        let sources = [("a", 997u32, 0.05), ("b", 1500, 0.55), ("c", 503, 0.4)];
        let points = vec![
            Point {
                epoch: 700,
                weights: vec![0.3, 0.3, 0.4],
            },
            Point {
                epoch: 1100,
                weights: vec![0.1, 0.6, 0.3],
            },
        ];
        let m = Mixture {
            schedule: Some(Schedule {
                points,
                interpolation: Interpolation::Linear,
            }),
            max_repeat: 10.0,
            ..Mixture::new(
                sources.map(|(n, r, w)| (n.to_string(), r, w)),
                Unit::Samples,
            )
        };
        let lengths = vec![2u32; 3000];
        let mix = Mix::new(m, &lengths, |_| true, 1, None).unwrap();
        let mut place = [Place::default(); 3];
        for epoch in 0..1400u64 {
            let quotas = mix.apportion(&mix.spec.weights_at(epoch));
            let want: Vec<Slice> = (0..3)
                .map(|s| {
                    let start = place[s].start(quotas[s].rest, mix.totals[s]);
                    Slice {
                        copies: quotas[s].copies,
                        rest: quotas[s].rest,
                        cycle: start.cycle,
                        from: start.at,
                    }
                })
                .collect();
            if epoch.is_multiple_of(7)
                || (250..260).contains(&epoch)
                || (1095..1105).contains(&epoch)
            {
                assert_eq!(mix.slices(epoch), want, "epoch {epoch}");
            }
            for (s, p) in place.iter_mut().enumerate() {
                *p = p.after(quotas[s].rest, mix.totals[s]);
            }
        }
    }

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
