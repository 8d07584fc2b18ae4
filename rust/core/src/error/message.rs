//! What each [`Error`] says: a lowercase sentence that names the value and the fix, read unchanged by
//! a Python user who never sees this code. The kinds themselves are in [`crate::error`].

use std::fmt;

use crate::error::{Error, ErrorKind};

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ErrorKind as K;
        match self.kind() {
            K::EmptyLengths => write!(f, "lengths is empty; pass at least one sample length"),
            K::NonPositiveLength { row, value } => write!(
                f,
                "length {value} at row {row} is not positive; every sample needs at least one token \
                 (filter empty samples out of the dataset first)"
            ),
            K::LengthTooLarge { row, value } => write!(
                f,
                "length {value} at row {row} exceeds the largest supported length {}; check the column",
                u32::MAX
            ),
            K::TooManySamples { count } => write!(
                f,
                "{count} samples exceed the supported maximum of {}; split the dataset",
                u32::MAX
            ),
            K::BatchSpec { both: true } => write!(
                f,
                "both batch_size and max_tokens were given; pass exactly one of them"
            ),
            K::BatchSpec { both: false } => write!(
                f,
                "neither batch_size nor max_tokens was given; pass exactly one of them \
                 (e.g. max_tokens=16384 or batch_size=8)"
            ),
            K::InvalidSetting { name, value, expected } => {
                write!(f, "{name}={value} is invalid; {name} must be {expected}")
            }
            K::RankOutOfRange { rank, world_size } => write!(
                f,
                "rank {rank} is not one of this plan's {world_size} ranks; pass 0 ≤ rank < {world_size}"
            ),
            K::BadBatching { problem } => write!(f, "the batches are not a CSR batching: {problem}"),
            K::InvalidRatio { name, value, expected } => {
                write!(f, "{name}={value} is invalid; pass {expected}")
            }
            K::InvalidCost { setting, given } => write!(
                f,
                "{setting}={given} is invalid; pass {}(a, b) with a and b each 0 or between 1e-12 and 1e12, \
                 a + b > 0 (a row of padded length L costs a·L + b·L²)",
                if *setting == "cost" { "cost=\"tokens\" or " } else { "None or " }
            ),
            K::CostOverflow { given, length, rows } => write!(
                f,
                "cost={given} prices a batch of {rows} row(s) of {length} tokens beyond 3.4e38, past what rank \
                 balance compares (f32); scale a and b down together (only their ratio shapes the plan)"
            ),
            K::PackedRowTooLong { tokens, capacity } => write!(
                f,
                "the samples hold {tokens} tokens, more than the packed row's capacity {capacity}; \
                 pass the capacity of the plan (its max_tokens) or plan with mode='packed'"
            ),
            K::BadWindow { problem } => write!(
                f,
                "{problem}; pass the starts and lengths that sampler.pieces(batch) returns for the batch"
            ),
            K::MixtureSetting { problem, .. } => write!(f, "{problem}"),
            K::EmptySource { source } => write!(
                f,
                "source '{source}' of the mixture has no rows; give it data, or leave it out of the mixture"
            ),
            K::MixtureWeight { source, weight } => write!(
                f,
                "source '{source}' has weight {weight}; weights must be finite and ≥ 0 (0 leaves a source \
                 out of every epoch)"
            ),
            K::MixtureWeights { sum } => write!(
                f,
                "the mixture's weights sum to {sum}, not 1; pass each source's share of an epoch (e.g. 0.6 \
                 and 0.4)"
            ),
            K::SourceTooSmall { source, weight, total, share, tokens, max_repeat } => {
                let unit = if *tokens { "tokens" } else { "samples" };
                // Counts stay far below 2^53; the ratio is for the message.
                #[allow(clippy::cast_precision_loss)]
                let repeats = *share as f64 / (*total).max(1) as f64;
                write!(
                    f,
                    "source '{source}' holds {total} {unit}, but its weight {weight} asks for {share} {unit} \
                     an epoch ({repeats:.2} times its data), more than max_repeat={max_repeat}; raise \
                     max_repeat, lower its weight, add data to it, or shorten the epoch (epoch_size)"
                )
            }
            K::SourcesDiffer { source, problem } => write!(f, "source '{source}' {problem}"),
            K::PackedSetting { problem } => write!(f, "mode='packed' {problem}"),
            K::ContextParallelSetting {
                problem,
                context_parallel,
            } => write!(f, "context_parallel={context_parallel} {problem}"),
            K::PieceMultiple {
                capacity,
                multiple,
                pad_to_multiple_of,
                context_parallel,
            } => {
                let below = capacity / multiple * multiple;
                let above = below + multiple;
                write!(
                    f,
                    "max_tokens {capacity} is not a multiple of {multiple}, which every packed piece \
                     is padded to (pad_to_multiple_of={pad_to_multiple_of}"
                )?;
                if *context_parallel > 1 {
                    write!(f, ", 2·context_parallel={}", 2 * u64::from(*context_parallel))?;
                }
                write!(f, "); use max_tokens={above}")?;
                if below > 0 {
                    write!(f, " or {below}")?;
                }
                Ok(())
            }
            K::TrimSetting { problem } => write!(f, "trim_steps=True {problem}"),
            K::TruncateSetting { problem } => write!(f, "oversize='truncate' {problem}"),
            K::TooFewEdges { count } => write!(
                f,
                "boundaries has {count} edge(s); give at least two, e.g. [0, 8192] for one bucket"
            ),
            K::EdgesNotIncreasing { position, previous, value } => write!(
                f,
                "boundaries must be strictly increasing, but edge {position} ({value}) is not above \
                 edge {} ({previous}); sort the edges and remove duplicates",
                position - 1
            ),
            K::EdgesDoNotCover { row, length, low, high } => {
                if length <= low {
                    write!(
                        f,
                        "length {length} at row {row} is not above the first edge {low}; lower the first \
                         edge (buckets hold lengths in (edge[i], edge[i+1]])"
                    )
                } else {
                    write!(
                        f,
                        "length {length} at row {row} exceeds the last edge {high}; append an edge \
                         ≥ {length} (buckets hold lengths in (edge[i], edge[i+1]])"
                    )
                }
            }
            K::MaxTokensBelowShortest {
                max_tokens,
                shortest,
                length,
                row,
                priced: Some((model, price)),
            } => write!(
                f,
                "cost={model} prices one row of the shortest sample ({length} tokens at row {row}, \
                 {shortest} padded) at {price}, above max_tokens {max_tokens} (the budget in the \
                 cost's units), so no batch can be formed; raise max_tokens or lower the cost's \
                 coefficients"
            ),
            K::MaxTokensBelowShortest {
                max_tokens,
                shortest,
                length,
                row,
                priced: None,
            } if u64::from(*length) != *shortest => write!(
                f,
                "max_tokens {max_tokens} is smaller than the shortest sample padded to \
                 pad_to_multiple_of ({length} tokens at row {row}, {shortest} padded), so no batch \
                 can be formed; raise max_tokens or lower pad_to_multiple_of"
            ),
            K::MaxTokensBelowShortest {
                max_tokens,
                shortest,
                row,
                ..
            } => write!(
                f,
                "max_tokens {max_tokens} is smaller than the shortest sample ({shortest} tokens at row \
                 {row}), so no batch can be formed; raise max_tokens"
            ),
            K::Oversize {
                row,
                length,
                max_tokens,
                longest,
            } => write!(
                f,
                "length {length} at row {row} exceeds max_tokens {max_tokens} (the longest row that \
                 fits is {longest} tokens); raise max_tokens or pass oversize='skip'"
            ),
            K::StepTooSmall {
                sequences,
                world_size,
                formed,
                needed,
            } => write!(
                f,
                "{sequences} sequence(s) cannot give each of {world_size} ranks the same number of \
                 micro-batches within max_tokens: they form {formed}, equal counts need {needed}, and a \
                 micro-batch holds at least one sequence; use fewer ranks, a larger max_tokens, or \
                 mode='packed'"
            ),
            K::SequenceOverBudget {
                row,
                length,
                max_tokens,
            } => write!(
                f,
                "sequence {row} has {length} tokens, more than max_tokens {max_tokens}: a sequence is never \
                 split across micro-batches; raise max_tokens to at least {length}, or truncate it first"
            ),
            K::TooFewSamplesForRanks {
                samples,
                world_size,
                drop_last: false,
                batches,
                needed,
            } => {
                write!(
                    f,
                    "{samples} sample(s) cannot give each of world_size {world_size} ranks a batch \
                     without repeating samples: they formed {batches} batch(es) within the budget, the \
                     plan needs {needed} (every rank runs the same steps), and a batch cannot be split \
                     below one sample; use fewer ranks or a smaller max_tokens"
                )?;
                if batches >= &(*world_size as usize) {
                    write!(
                        f,
                        ", or pass drop_last=True (it leaves out the samples of {} batch(es))",
                        batches % *world_size as usize
                    )?;
                }
                Ok(())
            }
            K::TooFewSamplesForRanks {
                samples,
                world_size,
                drop_last: true,
                ..
            } => write!(
                f,
                "{samples} sample(s) cannot give each of world_size {world_size} ranks a batch: fewer \
                 batches than ranks, and drop_last=True dropped them all; use fewer ranks or smaller \
                 batches"
            ),
            K::OutOfMemory { what, bytes } => write!(
                f,
                "{what} needs {:.1} MiB, which cannot be allocated (this process's address space limit, \
                 `ulimit -v`, or the machine's memory is exhausted); free memory, raise the limit or use \
                 fewer samples",
                *bytes as f64 / f64::from(1u32 << 20)
            ),
            K::ResumeStepOutOfRange {
                step,
                steps,
                epoch,
                world_size,
            } => write!(
                f,
                "step {step} is outside epoch {epoch}, which had {steps} steps on world_size \
                 {world_size}; resume from a checkpoint this run wrote, unedited"
            ),
            K::TooManyPieces {
                samples,
                pieces,
                capacity,
            } => write!(
                f,
                "oversize='truncate' would cut {} long sample(s) into {} more pieces of at most \
                 max_tokens={capacity} tokens, past the {} entries a plan holds; raise max_tokens or \
                 pass oversize='skip'",
                thousands(*samples),
                thousands(*pieces),
                thousands(u64::from(u32::MAX))
            ),
            K::EntryOutOfRange { entry, entries } => write!(
                f,
                "entry {entry} is not one of this sampler's plans: a batch must be a 1-D array of \
                 entries of this sampler's plans (0 ≤ entry < {entries})"
            ),
            K::StepOutOfRange { step, steps } => write!(
                f,
                "step {step} is past the end of the epoch ({steps} steps); resume from a step < {steps}"
            ),
            K::Read { path, problem } => write!(f, "{path} {problem}"),
            K::BufferTooSmall { name, needed, got } => write!(
                f,
                "buffer {name} holds {got} elements but the batch needs {needed} ({}rows × padded \
                 length); pass larger buffers or let the function allocate them",
                // A slot holds the four arrays back to back.
                if *name == "slot" { "4 arrays × " } else { "" }
            ),
            K::TokenOutOfRange { value, dtype } => write!(
                f,
                "token id {value} does not fit in {dtype}; collate with dtype=int64"
            ),
            K::TokenNotInteger { value, dtype } => write!(
                f,
                "token {value} of a float token file is not a whole number that {dtype} holds; \
                 float token files must hold integral ids (rewrite them with an integer dtype)"
            ),
            K::MaskLength { row: Some(row), tokens, mask } => write!(
                f,
                "row {row} has {tokens} tokens but {mask} loss-mask values; the mask column must hold one \
                 value per token of every row (tokenize the tokens and the mask together)"
            ),
            K::MaskLength { row: None, tokens, mask } => write!(
                f,
                "the loss-mask column has {mask} rows but the token column has {tokens}; both must come \
                 from the same rows"
            ),
            K::MaskValue { row: Some(row), position, found } => write!(
                f,
                "the 0/1 loss mask holds {found} at row {row}, position {position}; a 0/1 mask holds only 0 \
                 and 1 (bools or integers): fix the column, or name a labels column (-100 = ignored) with \
                 mask=..."
            ),
            K::MaskValue { row: None, found, .. } => write!(
                f,
                "the loss mask holds {found} values; a loss mask holds 0/1 values (bools or integers) or \
                 integer labels (-100 = ignored): store it as integers or bools"
            ),
            K::SharedPlan { path, problem: crate::error::SharedProblem::Io { action, message, .. } } => write!(
                f,
                "cannot {action} {path}: {message}; name a plan_dir every local rank can write (or \
                 plan_dir=None to plan on every rank)"
            ),
            K::SharedPlan { path, problem: crate::error::SharedProblem::Refused { why } } => write!(
                f,
                "{path} is not this run's plan: {why}; a plan file is only ever published whole, so \
                 another run, another version or another writer made it: delete it, or name another \
                 plan_dir"
            ),
            K::RowOutOfRange { row, rows } => write!(
                f,
                "row {row} is out of range for a dataset of {rows} rows; valid rows are 0..{rows}"
            ),
        }
    }
}

/// `n` with a comma between groups of three digits, as Python's `{:,}` writes it.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::error::{Error, ErrorKind};

    #[test]
    fn messages_are_lowercase_and_name_the_value() {
        let e: Error = ErrorKind::Oversize {
            row: 17,
            length: 9000,
            max_tokens: 8192,
            longest: 8192,
        }
        .into();
        assert_eq!(
            e.to_string(),
            "length 9000 at row 17 exceeds max_tokens 8192 (the longest row that fits is 8192 tokens); \
             raise max_tokens or pass oversize='skip'"
        );
        let e: Error = ErrorKind::EdgesDoNotCover {
            row: 3,
            length: 5,
            low: 10,
            high: 20,
        }
        .into();
        assert!(e
            .to_string()
            .starts_with("length 5 at row 3 is not above the first edge 10"));
    }
}
