//! The keys of an epoch's random draws. Every random stream of a plan is derived from `(seed, key)`
//! (`rng.rs`); an epoch's key is its number, unless the shared step count sends it to other draws of
//! the same epoch (`steps.rs`), and the draws that set that count are epoch 0's.

/// The draws that set every epoch's batch count: epoch 0's.
pub(crate) const REFERENCE_KEY: u64 = 0;

/// Other draws of an epoch tried when its own form more batches than the target (each does with a
/// probability well under a half: the margin is set for that), before the reference draws.
pub(crate) const REFORM_ATTEMPTS: u64 = 16;

/// The key of the `attempt`-th other draw of `epoch` (attempt 0 is the epoch's own).
pub(crate) fn reform_key(epoch: u64, attempt: u64) -> u64 {
    epoch.wrapping_add(attempt.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// Other draws formed once, besides epoch 0's, to measure how much the count scatters (epochs up to
/// `ARRANGE_MAX_SAMPLES` samples; each costs one forming pass, once per planner).
pub(crate) const CALIBRATION_DRAWS: u64 = 3;

/// The key of the `i`-th calibration draw (none is an epoch's own or retry draw in practice).
pub(crate) fn calibration_key(i: u64) -> u64 {
    reform_key(REFERENCE_KEY, REFORM_ATTEMPTS + i)
}
