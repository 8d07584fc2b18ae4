//! **Select** the rows one draw of an epoch plans — every admitted row (by bucket, or streamed in a
//! uniformly random order), a mixture's selection (`mixture/`), or every row in length order — and
//! **form** them with the draw's key (`form/`): batches cut by the batching rule, each forming group
//! put in training order and balanced while its rows are in cache. What a pass hands on: the rows in
//! batch order and the [`Epoch`] that cuts them.

use crate::lengths::Length;
use crate::plan::form::{ByBucket, Epoch, Former};
use crate::plan::mixture::{form_selection, Mix};

/// Which rows an epoch plans, and how they reach forming.
pub(crate) enum Population<'a> {
    /// A mixture's selection of its sources' rows, keyed by the epoch (`mixture/select.rs`).
    Mixture(&'a Mix),
    /// Every admitted row, grouped by bucket: shuffled padded epochs up to `ARRANGE_MAX_SAMPLES`
    /// samples (`form/by_bucket.rs`).
    ByBucket(&'a ByBucket),
    /// Every row in a uniformly random order, streamed through the open batches (`form/stream.rs`).
    Streamed,
    /// Every row in length order (`shuffle=False`: evaluation).
    Sorted,
}

/// The read-only state every draw of an epoch borrows from the planner.
pub(crate) struct Draws<'a, L> {
    pub(crate) former: Former<'a, L>,
    pub(crate) population: Population<'a>,
    pub(crate) pool: Option<&'a rayon::ThreadPool>,
}

impl<L: Length> Draws<'_, L> {
    /// One forming pass of the draws keyed `key`, over a mixture's selection keyed `select`: the
    /// rows, truncated to those formed, and the epoch they form.
    pub(crate) fn form(&self, (select, key): (u64, u64)) -> (Vec<u32>, Epoch) {
        let (mut order, formed) = match self.population {
            Population::Mixture(mix) => form_selection(&self.former, mix, (select, key), self.pool),
            Population::ByBucket(rows) => self.former.form_by_bucket(rows, key, self.pool),
            Population::Streamed => self.former.form_shuffled(None, key, self.pool),
            Population::Sorted => self.former.form_sorted(),
        };
        order.truncate(formed.written);
        (order, formed)
    }

    /// The epochs a mixture's schedule names (where its weights change), or none.
    pub(crate) fn schedule_epochs(&self) -> Vec<u64> {
        match self.population {
            Population::Mixture(mix) => mix
                .spec
                .schedule
                .as_ref()
                .map_or_else(Vec::new, |s| s.points.iter().map(|p| p.epoch).collect()),
            _ => Vec::new(),
        }
    }

    /// Whether the draws select a mixture's rows (whose count varies from one selection to the next).
    pub(crate) fn is_mixture(&self) -> bool {
        matches!(self.population, Population::Mixture(_))
    }
}
