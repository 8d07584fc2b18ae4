//! Sample lengths: checked conversion from caller integers, and compact storage.
//!
//! Bindings receive lengths as numpy or Arrow arrays of whatever integer type the dataset used. They
//! are checked in one pass — naming the first bad row, instead of a silent `as` cast that would turn
//! `-1` into 4294967295 tokens — and then stored in the narrowest type that holds them all: `u16` when
//! every sample is shorter than 65,536 tokens (every LLM dataset up to 64K context), else `u32`.
//! Half-width storage halves the planner's largest permanent allocation (200 MB instead of 400 MB at
//! 100M samples) and keeps the random length lookups of planning in cache longer. The plan never
//! depends on the storage width.

use crate::error::{ErrorKind, Result};

/// A stored sample length: `u16` or `u32`.
pub trait Length: Copy + Send + Sync + Ord + Into<u32> + 'static {
    /// Narrows `value`; callers guarantee it fits (checked when the storage was chosen).
    fn narrow(value: u32) -> Self;
}

impl Length for u16 {
    #[inline]
    fn narrow(value: u32) -> Self {
        u16::try_from(value).unwrap_or(u16::MAX)
    }
}

impl Length for u32 {
    #[inline]
    fn narrow(value: u32) -> Self {
        value
    }
}

/// Every sample's length, in the narrowest storage that holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lengths {
    /// Every length is below 65,536.
    U16(Values<u16>),
    /// Some length needs 32 bits.
    U32(Values<u32>),
}

/// Lengths a caller keeps in a read-only mapping the planner may borrow instead of copying: on a
/// machine whose ranks each plan from the same file, the page cache holds them once (2 bytes a
/// sample at `u16`: 2 GB at a billion samples, which eight private copies would make 16).
pub trait Borrowed<T>: Send + Sync + std::fmt::Debug {
    /// The lengths, valid as long as `self` lives.
    fn values(&self) -> &[T];
    /// Whether the lengths are still the ones borrowed (a mapped file not truncated or rewritten):
    /// called before every read of a planning call, and an error names what changed.
    ///
    /// # Errors
    /// Whatever the owner reports, typically [`ErrorKind::Read`] with a changed-file problem.
    fn check(&self) -> Result<()>;
}

/// One width of lengths: a vector the planner owns, or a caller's read-only mapping it borrows.
#[derive(Debug, Clone)]
pub enum Values<T: 'static> {
    /// Copied in (and checked) when the planner was made.
    Owned(Vec<T>),
    /// Borrowed from the caller (checked when borrowed, and for changes before each use).
    Borrowed(std::sync::Arc<dyn Borrowed<T>>),
}

impl<T: 'static> std::ops::Deref for Values<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        match self {
            Values::Owned(values) => values,
            Values::Borrowed(source) => source.values(),
        }
    }
}

impl<T: PartialEq + 'static> PartialEq for Values<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Eq + 'static> Eq for Values<T> {}

impl<T: 'static> From<Vec<T>> for Values<T> {
    fn from(values: Vec<T>) -> Self {
        Values::Owned(values)
    }
}

/// Runs `$body` with `$v` bound to the lengths as a typed slice (`&[u16]` or `&[u32]`), so generic
/// code is compiled once per width and never branches per sample.
macro_rules! with_lengths {
    ($lengths:expr, $v:ident => $body:expr) => {
        match $lengths {
            $crate::lengths::Lengths::U16(values) => {
                let $v: &[u16] = values;
                $body
            }
            $crate::lengths::Lengths::U32(values) => {
                let $v: &[u32] = values;
                $body
            }
        }
    };
}
pub(crate) use with_lengths;

impl Lengths {
    /// Number of samples.
    pub fn len(&self) -> usize {
        with_lengths!(self, v => v.len())
    }

    /// True when there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lengths borrowed from `source` (checked here: positive, as [`scan`] checks a copy).
    ///
    /// # Errors
    /// [`ErrorKind::NonPositiveLength`] naming the first bad row.
    pub fn borrow_u16(source: std::sync::Arc<dyn Borrowed<u16>>) -> Result<Self> {
        scan(source.values(), 0)?;
        Ok(Lengths::U16(Values::Borrowed(source)))
    }

    /// [`Lengths::borrow_u16`] for 32-bit lengths (kept at that width: narrowing would copy them).
    ///
    /// # Errors
    /// [`ErrorKind::NonPositiveLength`] or [`ErrorKind::LengthTooLarge`] naming the first bad row.
    pub fn borrow_u32(source: std::sync::Arc<dyn Borrowed<u32>>) -> Result<Self> {
        scan(source.values(), 0)?;
        Ok(Lengths::U32(Values::Borrowed(source)))
    }

    /// Whether the lengths are borrowed (not copied).
    pub fn is_borrowed(&self) -> bool {
        matches!(
            self,
            Lengths::U16(Values::Borrowed(_)) | Lengths::U32(Values::Borrowed(_))
        )
    }

    /// Borrowed lengths still the ones borrowed (see [`Borrowed::check`]); owned ones always are.
    ///
    /// # Errors
    /// What the owner reports: the mapped file changed.
    pub fn check(&self) -> Result<()> {
        match self {
            Lengths::U16(Values::Borrowed(source)) => source.check(),
            Lengths::U32(Values::Borrowed(source)) => source.check(),
            _ => Ok(()),
        }
    }

    /// The lengths widened to `u32` (a copy).
    pub fn to_u32_vec(&self) -> crate::error::Result<Vec<u32>> {
        self.check()?;
        fn widen<L: Length>(values: &[L]) -> crate::error::Result<Vec<u32>> {
            let mut out = crate::memory::vec_with_capacity("copying the lengths", values.len())?;
            out.extend(values.iter().map(|&l| Into::<u32>::into(l)));
            Ok(out)
        }
        with_lengths!(self, v => widen(v))
    }

    /// Checks every chunk (rows numbered across chunks), then copies them into the narrowest storage.
    pub fn from_chunks<T: Copy + Into<i128>>(chunks: &[&[T]]) -> Result<Self> {
        let mut longest = 0;
        let mut row = 0;
        for chunk in chunks {
            longest = longest.max(scan(chunk, row)?);
            row += chunk.len();
        }
        let mut builder = Builder::new(longest, row);
        for chunk in chunks {
            builder.extend(chunk);
        }
        Ok(builder.finish())
    }
}

impl From<Vec<u32>> for Lengths {
    fn from(values: Vec<u32>) -> Self {
        if values.iter().all(|&l| l <= u32::from(u16::MAX)) {
            Lengths::U16(Values::Owned(values.into_iter().map(u16::narrow).collect()))
        } else {
            Lengths::U32(Values::Owned(values))
        }
    }
}

impl From<Vec<u16>> for Lengths {
    fn from(values: Vec<u16>) -> Self {
        Lengths::U16(Values::Owned(values))
    }
}

/// Checks `values` and returns the longest; `first_row` numbers `values[0]` for messages.
pub fn scan<T: Copy + Into<i128>>(values: &[T], first_row: usize) -> Result<u32> {
    let mut longest = 0;
    for (i, &v) in values.iter().enumerate() {
        let value: i128 = v.into();
        match u32::try_from(value) {
            Ok(l) if l > 0 => longest = longest.max(l),
            _ if value <= 0 => {
                return Err(ErrorKind::NonPositiveLength {
                    row: first_row + i,
                    value,
                }
                .into())
            }
            _ => {
                return Err(ErrorKind::LengthTooLarge {
                    row: first_row + i,
                    value,
                }
                .into())
            }
        }
    }
    Ok(longest)
}

/// Fills the narrowest storage for lengths already checked by [`scan`].
#[derive(Debug)]
pub struct Builder {
    storage: Storage,
}

/// The vector a [`Builder`] fills.
#[derive(Debug)]
enum Storage {
    U16(Vec<u16>),
    U32(Vec<u32>),
}

impl Builder {
    /// Storage for `count` lengths, none longer than `longest`.
    pub fn new(longest: u32, count: usize) -> Self {
        let storage = if longest <= u32::from(u16::MAX) {
            Storage::U16(Vec::with_capacity(count))
        } else {
            Storage::U32(Vec::with_capacity(count))
        };
        Self { storage }
    }

    /// [`Builder::new`], its storage reserved fallibly: [`ErrorKind::OutOfMemory`] where it does not fit.
    pub fn try_new(longest: u32, count: usize) -> crate::error::Result<Self> {
        const WHAT: &str = "copying the lengths";
        let storage = if longest <= u32::from(u16::MAX) {
            Storage::U16(crate::memory::vec_with_capacity(WHAT, count)?)
        } else {
            Storage::U32(crate::memory::vec_with_capacity(WHAT, count)?)
        };
        Ok(Self { storage })
    }

    /// Appends `values` (checked by [`scan`]: positive and at most the `longest` given to `new`).
    pub fn extend<T: Copy + Into<i128>>(&mut self, values: &[T]) {
        let widen = |v: T| u32::try_from(v.into()).unwrap_or(u32::MAX);
        match &mut self.storage {
            Storage::U16(out) => out.extend(values.iter().map(|&v| u16::narrow(widen(v)))),
            Storage::U32(out) => out.extend(values.iter().map(|&v| widen(v))),
        }
    }

    /// The filled storage.
    pub fn finish(self) -> Lengths {
        match self.storage {
            Storage::U16(values) => Lengths::U16(Values::Owned(values)),
            Storage::U32(values) => Lengths::U32(Values::Owned(values)),
        }
    }
}

/// Offsets index a `Vec` in memory, so they always fit in `usize`.
pub(crate) fn to_usize(v: impl Into<u64>) -> usize {
    usize::try_from(v.into()).unwrap_or(usize::MAX)
}

/// The lengths of `rows`, widened.
pub(crate) fn lengths_of<L: Length>(lengths: &[L], rows: &[u32]) -> Vec<u32> {
    rows.iter().map(|&r| lengths[r as usize].into()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_names_bad_rows() {
        assert_eq!(scan(&[1i64, 2, 3], 1).unwrap(), 3);
        let err = scan(&[4i8, -1], 10).unwrap_err();
        assert_eq!(
            err.kind(),
            &ErrorKind::NonPositiveLength { row: 11, value: -1 }
        );
        let err = scan(&[0u16], 0).unwrap_err();
        assert_eq!(
            err.kind(),
            &ErrorKind::NonPositiveLength { row: 0, value: 0 }
        );
        let err = scan(&[1u64 << 40], 5).unwrap_err();
        assert_eq!(
            err.kind(),
            &ErrorKind::LengthTooLarge {
                row: 5,
                value: 1 << 40
            }
        );
    }

    #[test]
    fn storage_is_the_narrowest_that_fits() {
        let small = Lengths::from_chunks(&[&[3i64, 65_535][..], &[7][..]]).unwrap();
        assert_eq!(small, Lengths::from(vec![3u16, 65_535, 7]));
        let large = Lengths::from_chunks(&[&[3u32][..], &[65_536][..]]).unwrap();
        assert_eq!(large, Lengths::U32(vec![3, 65_536].into()));
        assert_eq!(large.to_u32_vec().unwrap(), [3, 65_536]);
        assert_eq!(
            Lengths::from(vec![5u32, 9]),
            Lengths::U16(vec![5, 9].into())
        );
        let err = Lengths::from_chunks(&[&[3i32][..], &[2, -4][..]]).unwrap_err();
        assert_eq!(
            err.kind(),
            &ErrorKind::NonPositiveLength { row: 2, value: -4 }
        );
    }
}
