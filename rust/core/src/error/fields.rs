//! What a binding tells a program about an error besides its message: a stable name for its kind,
//! and the row, setting or file it concerns, where the error knows one.

use crate::error::ErrorKind;

impl ErrorKind {
    /// The kind's name in snake case (`non_positive_length`, `read`, `out_of_memory`, ...): stable,
    /// for programs to branch on instead of parsing messages.
    pub fn name(&self) -> String {
        let debug = format!("{self:?}");
        let variant = debug
            .split(|c: char| !c.is_ascii_alphanumeric())
            .next()
            .unwrap_or_default();
        let mut name = String::with_capacity(variant.len() + 4);
        for (i, c) in variant.chars().enumerate() {
            if c.is_ascii_uppercase() {
                if i > 0 {
                    name.push('_');
                }
                name.push(c.to_ascii_lowercase());
            } else {
                name.push(c);
            }
        }
        name
    }

    /// The row (of the lengths, the dataset or the mask) the error is about, where it names one.
    pub fn row(&self) -> Option<i128> {
        match self {
            Self::NonPositiveLength { row, .. }
            | Self::LengthTooLarge { row, .. }
            | Self::EdgesDoNotCover { row, .. }
            | Self::MaxTokensBelowShortest { row, .. }
            | Self::Oversize { row, .. } => i128::try_from(*row).ok(),
            Self::MaskLength { row, .. } | Self::MaskValue { row, .. } => row.map(i128::from),
            Self::RowOutOfRange { row, .. } => Some(*row),
            _ => None,
        }
    }

    /// The setting the error is about, where it names one.
    pub fn setting(&self) -> Option<&'static str> {
        match self {
            Self::InvalidSetting { name, .. } | Self::InvalidRatio { name, .. } => Some(name),
            Self::TrimSetting { .. } => Some("trim_steps"),
            Self::TruncateSetting { .. } => Some("oversize"),
            Self::PackedSetting { .. } => Some("mode"),
            _ => None,
        }
    }

    /// The file the error is about (a read error's).
    pub fn path(&self) -> Option<&str> {
        match self {
            Self::Read { path, .. } => Some(path),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::error::ErrorKind;

    #[test]
    fn names_are_snake_case_variants_and_fields_are_found() {
        let kind = ErrorKind::NonPositiveLength { row: 3, value: -1 };
        assert_eq!(kind.name(), "non_positive_length");
        assert_eq!(kind.row(), Some(3));
        assert_eq!(ErrorKind::EmptyLengths.name(), "empty_lengths");
        assert_eq!(ErrorKind::EmptyLengths.row(), None);
        let read = ErrorKind::Read {
            path: "x.arrow".into(),
            problem: crate::ReadProblem::Empty,
        };
        assert_eq!(
            (read.name().as_str(), read.path()),
            ("read", Some("x.arrow"))
        );
    }
}
