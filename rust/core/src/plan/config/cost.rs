//! The price of a row: what a token budget counts and what rank balance compares.

use crate::error::{ErrorKind, Result};

/// The range of a nonzero cost coefficient (see [`CostModel::check`]).
pub const COST_RANGE: (f64, f64) = (1e-12, 1e12);

/// The compute cost of one row of padded length `L`: `linear·L + quadratic·L²` (attention makes long
/// rows cost more than their tokens). With a token budget, a batch's cost `rows × cost(L)` must stay
/// within the budget, and rank balance compares these costs. The default, `(1, 0)`, is padded tokens.
/// Compared bit for bit, so a configuration stays `Eq` and fingerprints are exact.
#[derive(Debug, Clone, Copy)]
pub struct CostModel {
    /// Cost per token.
    pub linear: f64,
    /// Cost per token squared (attention).
    pub quadratic: f64,
}

impl CostModel {
    /// Padded tokens: `rows × L`.
    pub const TOKENS: Self = Self {
        linear: 1.0,
        quadratic: 0.0,
    };

    /// The cost of one row of padded length `padded`. Plain IEEE arithmetic (no `mul_add`, no
    /// transcendental functions), so it is bit-identical on every machine.
    #[inline]
    pub fn row(&self, padded: u64) -> f64 {
        // Lengths stay far below 2^53.
        #[allow(clippy::cast_precision_loss)]
        let l = padded as f64;
        self.linear * l + self.quadratic * l * l
    }

    /// Whether this is the default token cost, which keeps integer arithmetic everywhere.
    pub fn is_tokens(&self) -> bool {
        *self == Self::TOKENS
    }
}

impl PartialEq for CostModel {
    fn eq(&self, other: &Self) -> bool {
        self.linear.to_bits() == other.linear.to_bits()
            && self.quadratic.to_bits() == other.quadratic.to_bits()
    }
}

impl Eq for CostModel {}

impl CostModel {
    /// Two finite, non-negative numbers with a positive sum, else an error naming `setting`.
    pub(crate) fn check(&self, setting: &'static str) -> Result<()> {
        let Self { linear, quadratic } = *self;
        // Each coefficient is 0 or a normal-sized number: 5e-324 per token would make any budget hold
        // every sample in one batch (a budget in units no batch ever reaches).
        let valid = |c: f64| c == 0.0 || (COST_RANGE.0..=COST_RANGE.1).contains(&c);
        if !valid(linear) || !valid(quadratic) || linear + quadratic <= 0.0 {
            let given = format!("({linear}, {quadratic})");
            return Err(ErrorKind::InvalidCost { setting, given }.into());
        }
        Ok(())
    }
}
