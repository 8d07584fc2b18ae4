//! What packed rows need of the other settings, and how their rows are formed: composed by attention
//! (`form/compose.rs`) or filled best fit (`form/pack.rs`), and capped in samples.

use super::{Batching, Config, Mode};
use crate::error::{ErrorKind, Result};

impl Config {
    /// Whether shuffled epochs compose their rows (`form/compose.rs`): unbucketed packed rows under
    /// a token capacity, priced with an attention term, or priced by tokens in epochs small enough to
    /// be `arranged` (`form/mod.rs`). Rows are composed the same under either price (only rank balance
    /// reads it). Past that size, rows priced by tokens are packed best fit as they stream
    /// (`form/pack.rs`): composing 100M samples took 4.0 against 1.5 s an epoch and 1.16 against
    /// 0.90 GiB (2 threads, measured), where best fit keeps the 1 GiB and 2 s a 100M epoch promises.
    pub(crate) fn composes_rows(&self, arranged: bool) -> bool {
        matches!(self.mode, Mode::Packed { bucketed: false })
            && matches!(self.batching, Batching::Tokens(_))
            && (self.cost.quadratic > 0.0 || arranged)
    }

    /// The most samples a packed row may hold (`max_docs_per_row`; `u32::MAX`: no cap).
    pub(crate) fn docs_per_row(&self) -> u32 {
        self.max_docs_per_row.unwrap_or(u32::MAX)
    }

    /// Packed rows need a token capacity that fits a row's counters; context parallelism and a cap
    /// on samples per row need packed rows.
    pub(super) fn validate_packed(&self) -> Result<()> {
        if self.max_docs_per_row == Some(0) {
            return Err(ErrorKind::InvalidSetting {
                name: "max_docs_per_row",
                value: 0,
                expected: "≥ 1 (the most samples a packed row holds), or None for no cap",
            }
            .into());
        }
        let Mode::Packed { .. } = self.mode else {
            if self.context_parallel != 1 {
                return Err(ErrorKind::ContextParallelSetting {
                    problem:
                        "splits packed rows over ranks; pass mode='packed' (with max_tokens a \
                              multiple of 2·context_parallel), or leave it 1 for padded batches",
                    context_parallel: self.context_parallel,
                }
                .into());
            }
            if let Some(cap) = self.max_docs_per_row {
                return Err(ErrorKind::InvalidSetting {
                    name: "max_docs_per_row",
                    value: i128::from(cap),
                    expected:
                        "None for padded batches (it caps the samples of a packed row): pass \
                               mode='packed', or batch_size / max_tokens to bound a padded batch",
                }
                .into());
            }
            return Ok(());
        };
        let capacity = match self.batching {
            Batching::Rows(_) => {
                return Err(ErrorKind::PackedSetting {
                    problem: "needs max_tokens (the row capacity), not batch_size",
                }
                .into())
            }
            Batching::Tokens(capacity) => capacity,
        };
        // A packed row is one tensor of max_tokens tokens, and the packer counts its room in u32: a
        // larger capacity was clipped there, so stats disagreed with the rows.
        if capacity > u64::from(u32::MAX) {
            return Err(ErrorKind::InvalidSetting {
                name: "max_tokens",
                value: i128::from(capacity),
                expected: "≤ 4294967295 (2^32 - 1) in packed mode: a row is one tensor of \
                           max_tokens tokens",
            }
            .into());
        }
        self.validate_pieces(capacity)
    }
}
