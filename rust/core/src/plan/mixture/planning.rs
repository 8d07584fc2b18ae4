//! A mixture's part of the pipeline: admitting its sources (the reference selection the edges are
//! optimized for), and forming an epoch of the rows it selects (the rest of the pipeline is every
//! planner's, over those rows).

use crate::error::{ErrorKind, Result};
use crate::lengths::{lengths_of, with_lengths, Length, Lengths};
use crate::memory;
use crate::plan::config::{Config, Mode, Oversize};
use crate::plan::form::{Epoch, Former};
use crate::plan::keys::REFERENCE_KEY;
use crate::plan::mixture::{Mix, Mixture};
use crate::plan::prepare::{admitted_max, prepare_with, Prepared};
use crate::pool::PrivatePool;

/// The admit stage of a planner of `mixture`'s sources, whose lengths are `lengths` concatenated in
/// the mixture's order: each epoch selects every source's share (`select.rs`) and forming chooses
/// each group's batches for the sources (`form/choose.rs`). Bucket edges are optimized for the
/// reference selection drawn before buckets exist (each source's share, from one group per source),
/// and cover every admitted row. Returns what the planner is assembled from.
pub(crate) fn prepare_mixture(
    lengths: &Lengths,
    config: &Config,
    mixture: Mixture,
) -> Result<(Prepared, Mix)> {
    config.validate()?;
    refuse_settings(config)?;
    memory::reserve(
        "preparing the planner",
        memory::PLAN_FIXED_BYTES
            + lengths.len() as u64
                * (memory::PREPARE_BYTES_PER_SAMPLE + memory::MIXTURE_GROUP_BYTES),
    )?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let pool = PrivatePool::new(threads);
    let (mut mix, reference) = with_lengths!(lengths, v => reference(v, config, mixture, &pool))?;
    let epoch = with_lengths!(lengths, v => lengths_of(v, &reference));
    drop(reference);
    let mut prepared = with_lengths!(lengths, v => prepare_with(v, config, Some(&epoch)))?;
    let rules = &prepared.rules;
    // Every admitted row fits a bucket: the rules admit what `admitted_max` admits.
    mix.regroup(prepared.buckets.count(), |l| {
        rules.get(l).map_or(0, |(b, _)| b)
    });
    let selection = mix.select(REFERENCE_KEY);
    prepared.admitted = selection.samples as u64;
    prepared.admitted_tokens = selection.tokens;
    Ok((prepared, mix))
}

/// Forms the epoch of draws `key` of a mixture over its selection keyed `select` (`select.rs`):
/// each bucket filled with its rows and cut as a planner's own rows are (padded epochs up to
/// `ARRANGE_MAX_SAMPLES`), else streamed.
pub(crate) fn form_selection<L: Length>(
    former: &Former<'_, L>,
    mix: &Mix,
    (select, key): (u64, u64),
    pool: Option<&rayon::ThreadPool>,
) -> (Vec<u32>, Epoch) {
    let selection = mix.select(select);
    let groups = &mix.groups;
    let (order, mut formed) = if former.arranged && former.config.mode == Mode::Padded {
        let starts = groups.bucket_starts(&selection);
        let mut buffer = groups.take_buffer(selection.samples);
        let formed = former.form_buckets(&starts, &mut buffer, key, pool, |b, rng, rows| {
            groups.fill_bucket(&selection, b, rng, rows);
        });
        groups.give_back(buffer);
        formed
    } else {
        former.form_shuffled(Some(groups.runs(&selection)), key, pool)
    };
    formed.tokens = Some(selection.tokens);
    (order, formed)
}

/// Settings a mixture does not take.
fn refuse_settings(config: &Config) -> Result<()> {
    let refuse = |setting, problem: &str| {
        Err(ErrorKind::MixtureSetting {
            setting,
            problem: problem.to_string(),
        }
        .into())
    };
    if config.oversize == Oversize::Truncate {
        return refuse(
            "oversize",
            "oversize='truncate' does not combine with a mixture (a source's share would count pieces \
             of samples); pass oversize='error' or 'skip', or cut long samples when tokenizing",
        );
    }
    if !config.shuffle {
        return refuse(
            "shuffle",
            "shuffle=False plans rows in length order for evaluation, but a mixture selects and mixes \
             its sources afresh every epoch; evaluate each source with a sampler of its own",
        );
    }
    Ok(())
}

/// The mixture checked against `lengths`, and the reference selection's rows (what the edges are
/// optimized for; the step count every epoch shares is set from epoch 0's draws once the rows are
/// grouped by bucket).
fn reference<L: Length>(
    lengths: &[L],
    config: &Config,
    mixture: Mixture,
    pool: &PrivatePool,
) -> Result<(Mix, Vec<u32>)> {
    let admit_max = admitted_max(lengths, config)?;
    let pool = pool.get();
    let mix = Mix::new(
        mixture,
        lengths,
        |l| l <= admit_max,
        config.seed,
        pool.as_deref(),
    )?;
    // Counted before a row is listed: an epoch_size past what a u32 index addresses (or memory holds)
    // is an error, not an allocation failure that aborts the process.
    // A schedule's points select other shares (a linear one's epochs between them, shares between).
    let points = mix.spec.schedule.iter().flat_map(|s| &s.points);
    let samples = std::iter::once(REFERENCE_KEY)
        .chain(points.map(|p| p.epoch))
        .map(|key| mix.select(key).samples)
        .max()
        .unwrap_or(0);
    if u32::try_from(samples).is_err() {
        return Err(ErrorKind::TooManySamples { count: samples }.into());
    }
    memory::reserve(
        "the mixture's reference selection",
        (samples as u64).saturating_mul(memory::PREPARE_BYTES_PER_SAMPLE),
    )?;
    let reference = mix.population(REFERENCE_KEY);
    if reference.is_empty() {
        return Err(ErrorKind::MixtureSetting {
            setting: "weights",
            problem: "the mixture selects no sample for an epoch (every source with weight holds only \
                      samples that fit no batch); give weight to a source whose samples fit max_tokens"
                .to_string(),
        }
        .into());
    }
    Ok((mix, reference))
}

#[cfg(test)]
mod tests;
