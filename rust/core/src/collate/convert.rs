//! Writing stored token types as the output type: a plain copy or a vectorized widening where every
//! value fits, a range check first where some may not (`uint32` or `int64` ids into `int32`), and a
//! whole-number check for Megatron's float token codes.

use crate::collate::OutputToken;
use crate::error::{ErrorKind, Result};

/// Writing stored tokens of type `S` as `Self`: a plain copy or widening where every value fits
/// (vectorized by the compiler), a range check first where some may not.
pub trait Convert<S>: Sized {
    /// Writes `tokens` into the front of `out` (which is at least as long).
    fn convert(tokens: &[S], out: &mut [Self]) -> Result<()>;
}

impl Convert<i32> for i32 {
    fn convert(tokens: &[i32], out: &mut [i32]) -> Result<()> {
        out[..tokens.len()].copy_from_slice(tokens);
        Ok(())
    }
}

impl Convert<i64> for i64 {
    fn convert(tokens: &[i64], out: &mut [i64]) -> Result<()> {
        out[..tokens.len()].copy_from_slice(tokens);
        Ok(())
    }
}

/// Widening conversions: every value fits, so the loop is a plain vectorized widen.
macro_rules! widen {
    ($($s:ty => $($o:ty),+);*) => {$($(
        impl Convert<$s> for $o {
            fn convert(tokens: &[$s], out: &mut [$o]) -> Result<()> {
                out.iter_mut()
                    .zip(tokens)
                    .for_each(|(o, &t)| *o = <$o>::from(t));
                Ok(())
            }
        }
    )+)*};
}

widen!(i32 => i64; u32 => i64; u16 => i32, i64; i16 => i32, i64; u8 => i32, i64; i8 => i32, i64);

/// Float token ids (Megatron's float32/float64 codes) must be whole numbers the output can hold.
macro_rules! from_float {
    ($($s:ty),*) => {$(
        impl<T: OutputToken> Convert<$s> for T {
            fn convert(tokens: &[$s], out: &mut [T]) -> Result<()> {
                for (o, &t) in out.iter_mut().zip(tokens) {
                    let whole = f64::from(t);
                    // The range check makes the cast exact: whole numbers below 2^63 in magnitude.
                    #[allow(clippy::cast_possible_truncation)]
                    let id = (whole.fract() == 0.0 && whole.abs() < 2f64.powi(63))
                        .then(|| whole as i64)
                        .and_then(|id| T::try_from(id).ok());
                    *o = id.ok_or_else(|| ErrorKind::TokenNotInteger {
                        value: t.to_string(),
                        dtype: T::NAME,
                    })?;
                }
                Ok(())
            }
        }
    )*};
}

from_float!(f32, f64);

impl Convert<u32> for i32 {
    fn convert(tokens: &[u32], out: &mut [i32]) -> Result<()> {
        if let Some(&bad) = tokens.iter().find(|&&t| i32::try_from(t).is_err()) {
            return Err(out_of_range(i64::from(bad)));
        }
        // Every value was checked to fit.
        #[allow(clippy::cast_possible_wrap)]
        out.iter_mut().zip(tokens).for_each(|(o, &t)| *o = t as i32);
        Ok(())
    }
}

impl Convert<i64> for i32 {
    fn convert(tokens: &[i64], out: &mut [i32]) -> Result<()> {
        if let Some(&bad) = tokens.iter().find(|&&t| i32::try_from(t).is_err()) {
            return Err(out_of_range(bad));
        }
        // Every value was checked to fit.
        #[allow(clippy::cast_possible_truncation)]
        out.iter_mut().zip(tokens).for_each(|(o, &t)| *o = t as i32);
        Ok(())
    }
}

fn out_of_range(value: i64) -> crate::error::Error {
    ErrorKind::TokenOutOfRange {
        value,
        dtype: "int32",
    }
    .into()
}
