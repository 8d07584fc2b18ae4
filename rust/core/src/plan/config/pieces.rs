//! How a packed row pads its pieces: every sample (or piece of one under `Oversize::Truncate`)
//! takes its length rounded up to [`Config::piece_multiple`] — `pad_to_multiple_of` and, under
//! context parallelism, `2 · context_parallel` — so each splits into `2 · cp` equal zigzag chunks and
//! the kernels' own multiple (FP8, sequence parallelism) holds. The multiple divides the row.

use super::{Config, Mode};
use crate::error::{ErrorKind, Result};

impl Config {
    /// What every piece of a packed row is padded to a multiple of: the least common multiple of
    /// `pad_to_multiple_of` and, under context parallelism, `2 · context_parallel`. 1 for padded
    /// batches. In u64: the product may pass u32 (such a multiple fits no row, which
    /// [`Config::validate`] refuses).
    pub fn piece_multiple(&self) -> u64 {
        if !matches!(self.mode, Mode::Packed { .. }) {
            return 1;
        }
        let cp = if self.context_parallel > 1 {
            2 * u64::from(self.context_parallel)
        } else {
            1
        };
        let pad = u64::from(self.pad_to_multiple_of.max(1));
        pad / gcd(pad, cp) * cp
    }

    /// The tokens a packed row gives a piece of `length` tokens (see [`padded_piece`]). Loops
    /// take [`Config::piece_multiple`] once and call [`padded_piece`].
    pub fn piece(&self, length: u32) -> u32 {
        padded_piece(length, self.piece_multiple())
    }

    /// The piece multiple divides the row capacity, so the padded pieces of a row fill it exactly
    /// and a row splits into `2 · context_parallel` equal chunks.
    pub(super) fn validate_pieces(&self, capacity: u64) -> Result<()> {
        let multiple = self.piece_multiple();
        if !capacity.is_multiple_of(multiple) {
            return Err(ErrorKind::PieceMultiple {
                capacity,
                multiple,
                pad_to_multiple_of: self.pad_to_multiple_of,
                context_parallel: self.context_parallel,
            }
            .into());
        }
        Ok(())
    }
}

/// `length` rounded up to `multiple` (≥ 1). At most the row's capacity when `length` is (the
/// multiple divides it) — callers pad only admitted lengths; saturates rather than wraps otherwise.
#[inline]
pub(crate) fn padded_piece(length: u32, multiple: u64) -> u32 {
    if multiple == 1 {
        return length;
    }
    u32::try_from(u64::from(length).div_ceil(multiple) * multiple).unwrap_or(u32::MAX)
}

/// Greatest common divisor (Euclid).
fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
