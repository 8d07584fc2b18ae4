//! One store over several: a mixture's sources read as one row space, the first source's rows, then
//! the second's, and so on. Nothing is copied but the row lengths (and row mappings): the record
//! batches, their offsets and the mapped files are shared with the parts, and every read checks its
//! files as the parts' own reads would.

use crate::error::{ErrorKind, Result};
use crate::read::tokens::{Mask, TokenStore};

impl TokenStore {
    /// The stores `parts`, named for messages, as one: rows of the first, then of the second, ….
    /// They must hold one token type, and the same kind of loss mask in one type (or none); else
    /// [`ErrorKind::SourcesDiffer`] names the first part that differs from the first.
    pub fn concat(parts: &[(&str, &TokenStore)]) -> Result<TokenStore> {
        let Some(&(first_name, first)) = parts.first() else {
            return Ok(TokenStore::empty());
        };
        let mut out = first.clone();
        out.mask = None;
        let mapped = parts.iter().any(|(_, p)| p.rows.is_some());
        if mapped && out.rows.is_none() {
            out.rows = Some((0..first.file_rows()).collect());
        }
        for &(name, part) in &parts[1..] {
            out.append(name, part, (first_name, first.dtype()))?;
        }
        let masks: Vec<Option<&Mask>> = parts.iter().map(|(_, p)| p.mask.as_deref()).collect();
        out.mask = match masks[0] {
            None => {
                if let Some(i) = masks.iter().position(Option::is_some) {
                    return Err(differ(
                        parts[i].0,
                        "applies a loss mask",
                        first_name,
                        "none",
                    ));
                }
                None
            }
            Some(mask) => Some(Box::new(concat_masks(parts, mask)?)),
        };
        Ok(out)
    }

    /// Appends `part`'s rows (named `name`; `first` names the first part and its token type).
    fn append(&mut self, name: &str, part: &TokenStore, first: (&str, &str)) -> Result<()> {
        if !self.values.extend(&part.values) {
            let theirs = format!("{} tokens", part.dtype());
            return Err(differ(name, &theirs, first.0, first.1));
        }
        let (rows_before, files_before) = (self.file_rows(), self.files.len());
        self.offsets.extend(part.offsets.iter().cloned());
        self.starts
            .extend(part.starts[1..].iter().map(|s| s + rows_before));
        self.lengths.extend_from_slice(&part.lengths);
        if let Some(rows) = &mut self.rows {
            match &part.rows {
                Some(theirs) => rows.extend(theirs.iter().map(|r| r + rows_before)),
                None => rows.extend(rows_before..rows_before + part.file_rows()),
            }
        }
        self.files.extend(part.files.iter().cloned());
        // Files are far fewer than 2^32.
        #[allow(clippy::cast_possible_truncation)]
        let shift = files_before as u32;
        self.batch_files
            .extend(part.batch_files.iter().map(|f| f + shift));
        Ok(())
    }
}

/// The parts' masks (the first is `first`) as one.
fn concat_masks(parts: &[(&str, &TokenStore)], first: &Mask) -> Result<Mask> {
    let kind = |m: &Mask| match m.kind {
        crate::read::tokens::MaskKind::Labels => "a labels mask",
        crate::read::tokens::MaskKind::Binary => "a 0/1 mask",
    };
    let mut columns = Vec::with_capacity(parts.len());
    let (mut runs, mut run_starts) = (Vec::new(), vec![0usize]);
    for &(name, part) in parts {
        let Some(mask) = part.mask.as_deref() else {
            return Err(differ(
                name,
                "applies no loss mask",
                parts[0].0,
                kind(first),
            ));
        };
        if mask.kind != first.kind {
            return Err(differ(name, kind(mask), parts[0].0, kind(first)));
        }
        columns.push((name, &mask.column));
        let base = runs.len();
        runs.extend_from_slice(&mask.runs);
        run_starts.extend(mask.run_starts.iter().skip(1).map(|s| s + base));
    }
    if first.kind == crate::read::tokens::MaskKind::Labels {
        run_starts.clear(); // a labels mask has no runs
    }
    let column = TokenStore::concat(&columns).map_err(|error| match error.kind() {
        ErrorKind::SourcesDiffer { source, problem } => ErrorKind::SourcesDiffer {
            source: source.clone(),
            problem: problem.replace("tokens", "loss-mask values"),
        }
        .into(),
        _ => error,
    })?;
    Ok(Mask {
        column,
        kind: first.kind,
        runs,
        run_starts,
    })
}

/// `source` has `theirs` where the first source, `first`, has `mine`.
fn differ(source: &str, theirs: &str, first: &str, mine: &str) -> crate::error::Error {
    ErrorKind::SourcesDiffer {
        source: source.to_string(),
        problem: format!(
            "{theirs}, where source '{first}' has {mine}: a mixture's stores are read as one; build every \
             source's store with the same token type and the same loss mask (mask=None for none)"
        ),
    }
    .into()
}
