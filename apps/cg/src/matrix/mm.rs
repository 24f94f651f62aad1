//! Matrix Market coordinate files (`.mtx`).
//!
//! Written here rather than taken from a crate: `sprs::io::read_matrix_market` mirrors symmetric
//! and skew-symmetric files correctly, but reads a `pattern` file only into its own pattern
//! type, refuses `integer` files for `f64`, and reports every problem as "Bad matrix market
//! file." with no line; this project promises the line and the field (matrix rule 4).
//!
//! Rules:
//!
//! 1. The first line is `%%MatrixMarket matrix coordinate FIELD SYMMETRY`, case-insensitive,
//!    FIELD one of `real`, `double`, `integer`, `pattern`, SYMMETRY one of `general`,
//!    `symmetric`, `skew-symmetric`. `complex`, `hermitian` and the dense `array` layout are
//!    refused as unsupported.
//! 2. Then comment lines (`%`) and blank lines, then the size line `M N L`, then L entry lines
//!    `i j [value]` (1-based), blank lines allowed between them, nothing after the last.
//! 3. Symmetric and skew-symmetric files are expanded per matrix rule 2; a repeated entry is an
//!    error (matrix rule 3).

use super::{FileMatrix, MatrixError, Symmetry, Triplets, MAX_DIM};

/// Parses the text of a Matrix Market file named `file`.
pub fn parse(file: &str, text: &str) -> Result<FileMatrix, MatrixError> {
    let field_err = |line: usize, field: &str, message: String| MatrixError::Field {
        file: file.to_string(),
        line,
        field: field.to_string(),
        message,
    };
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
    let (_, header) = lines
        .next()
        .ok_or_else(|| field_err(1, "header", "empty file".to_string()))?;
    let words: Vec<String> = header
        .split_whitespace()
        .map(str::to_ascii_lowercase)
        .collect();
    if words.len() != 5 || words[0] != "%%matrixmarket" || words[1] != "matrix" {
        return Err(field_err(
            1,
            "header",
            "expected '%%MatrixMarket matrix coordinate FIELD SYMMETRY'".to_string(),
        ));
    }
    let unsupported = |m: String| MatrixError::Unsupported {
        file: file.to_string(),
        message: m,
    };
    match words[2].as_str() {
        "coordinate" => {}
        "array" => return Err(unsupported("the dense 'array' layout".to_string())),
        other => return Err(field_err(1, "format", format!("{other:?} is not a layout"))),
    }
    let pattern = match words[3].as_str() {
        "real" | "double" | "integer" => false,
        "pattern" => true,
        "complex" => return Err(unsupported("complex values".to_string())),
        other => {
            return Err(field_err(
                1,
                "field",
                format!("{other:?} is not a value type"),
            ))
        }
    };
    let symmetry = match words[4].as_str() {
        "general" => Symmetry::General,
        "symmetric" => Symmetry::Symmetric,
        "skew-symmetric" => Symmetry::SkewSymmetric,
        "hermitian" => return Err(unsupported("hermitian matrices".to_string())),
        other => {
            return Err(field_err(
                1,
                "symmetry",
                format!("{other:?} is not a symmetry"),
            ))
        }
    };
    if pattern && symmetry == Symmetry::SkewSymmetric {
        return Err(field_err(
            1,
            "symmetry",
            "a pattern matrix cannot be skew-symmetric".to_string(),
        ));
    }

    // The size line.
    let mut last = 1;
    let (size_no, size) = loop {
        match lines.next() {
            Some((n, l)) if l.trim().is_empty() || l.trim_start().starts_with('%') => last = n,
            Some(x) => break x,
            None => return Err(field_err(last + 1, "size line", "missing".to_string())),
        }
    };
    let dims: Vec<&str> = size.split_whitespace().collect();
    if dims.len() != 3 {
        return Err(field_err(
            size_no,
            "size line",
            format!("expected 'rows columns entries', got {} fields", dims.len()),
        ));
    }
    let names = ["rows", "columns", "entries"];
    let mut nums = [0usize; 3];
    for k in 0..3 {
        nums[k] = dims[k]
            .parse::<usize>()
            .ok()
            .filter(|&v| v <= MAX_DIM)
            .ok_or_else(|| {
                field_err(
                    size_no,
                    &format!("field {} ({})", k + 1, names[k]),
                    format!("{:?} is not a count up to {MAX_DIM}", dims[k]),
                )
            })?;
    }
    let [n_rows, n_cols, count] = nums;
    let limit = super::dim_limit(text.len());
    for (k, n) in [(0, n_rows), (1, n_cols)] {
        if n > limit {
            return Err(field_err(
                size_no,
                &format!("field {} ({})", k + 1, names[k]),
                format!(
                    "{n} is more than a file of {} bytes can describe (at most {limit})",
                    text.len()
                ),
            ));
        }
    }
    if n_rows
        .checked_mul(n_cols)
        .is_some_and(|cells| count > cells)
    {
        return Err(field_err(
            size_no,
            "field 3 (entries)",
            format!("{count} entries do not fit in {n_rows} x {n_cols}"),
        ));
    }
    // Do not trust the count for the allocation (matrix rule 4): a line is at least 4 bytes.
    let mut t = Triplets::new(file, n_rows, n_cols, count.min(text.len() / 4 + 1));
    let want = if pattern { 2 } else { 3 };
    let mut last_line = size_no;
    for (no, line) in lines {
        last_line = no;
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        if t.entries.len() == count {
            return Err(field_err(
                no,
                "entry",
                format!("more entries than the {count} of the size line (line {size_no})"),
            ));
        }
        if f.len() != want {
            return Err(field_err(
                no,
                "entry",
                format!(
                    "expected {want} fields ({}), got {}",
                    if pattern {
                        "row column"
                    } else {
                        "row column value"
                    },
                    f.len()
                ),
            ));
        }
        let index = |k: usize, what: &str, n: usize| -> Result<u32, MatrixError> {
            f[k].parse::<usize>()
                .ok()
                .filter(|&i| (1..=n).contains(&i))
                .map(|i| (i - 1) as u32) // i <= n <= MAX_DIM
                .ok_or_else(|| {
                    field_err(
                        no,
                        &format!("field {} ({what})", k + 1),
                        format!("{:?} is not an index from 1 to {n}", f[k]),
                    )
                })
        };
        let i = index(0, "row", n_rows)?;
        let j = index(1, "column", n_cols)?;
        let v = if pattern {
            1.0
        } else {
            f[2].parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| {
                    field_err(
                        no,
                        "field 3 (value)",
                        format!("{:?} is not a finite number", f[2]),
                    )
                })?
        };
        t.entries
            .push((i, j, v, u32::try_from(no).unwrap_or(u32::MAX)));
    }
    if t.entries.len() < count {
        return Err(field_err(
            last_line + 1,
            "entry",
            format!(
                "the file ends after {} of the {count} entries of the size line",
                t.entries.len()
            ),
        ));
    }
    t.expand(symmetry)?;
    Ok(FileMatrix {
        matrix: t.into_csr()?,
        symmetry,
        rhs: Vec::new(),
        guesses: Vec::new(),
        exact: Vec::new(),
        title: header.trim().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<FileMatrix, MatrixError> {
        parse("t.mtx", text)
    }

    #[test]
    fn symmetric_skew_and_pattern_are_expanded() {
        let m = p("%%MatrixMarket matrix coordinate real symmetric\n% c\n\n3 3 3\n1 1 4\n2 1 -1\n3 2 -2.5e0\n")
            .unwrap()
            .matrix;
        assert_eq!(m.get(0, 1), Some(-1.0));
        assert_eq!(m.get(1, 0), Some(-1.0));
        assert_eq!(m.get(1, 2), Some(-2.5));
        assert!(m.is_symmetric());
        let m = p("%%MatrixMarket matrix coordinate real skew-symmetric\n3 3 2\n2 1 5\n3 1 -1\n")
            .unwrap()
            .matrix;
        assert_eq!(m.get(1, 0), Some(5.0));
        assert_eq!(m.get(0, 1), Some(-5.0));
        assert_eq!(m.get(0, 2), Some(1.0));
        assert_eq!(m.nnz(), 4);
        let m = p("%%MatrixMarket matrix coordinate pattern general\n2 3 2\n1 3\n2 1\n")
            .unwrap()
            .matrix;
        assert_eq!((m.n_rows, m.n_cols), (2, 3));
        assert_eq!(m.get(0, 2), Some(1.0));
        let m = p("%%MatrixMarket matrix coordinate integer general\n1 1 1\n1 1 7\n")
            .unwrap()
            .matrix;
        assert_eq!(m.get(0, 0), Some(7.0));
    }

    #[test]
    fn errors_name_line_and_field() {
        let cases = [
            (
                "%%MatrixMarket matrix coordinate real general\n2 2 1\n1 x 3\n",
                "line 3, field 2 (column)",
            ),
            (
                "%%MatrixMarket matrix coordinate real general\n2 2 1\n1 3 3\n",
                "line 3, field 2 (column)",
            ),
            (
                "%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1 zz\n",
                "line 3, field 3 (value)",
            ),
            (
                "%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 1\n",
                "line 4, entry: the file ends after 1 of the 2",
            ),
            (
                "%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1 1\n2 2 2\n",
                "line 4, entry: more entries",
            ),
            (
                "%%MatrixMarket matrix coordinate real general\n2 2\n",
                "line 2, size line",
            ),
            (
                "%%MatrixMarket matrix coordinate real general\n2 2 5\n",
                "5 entries do not fit",
            ),
            (
                "%%MatrixMarket matrix coordinate real general\n4000000000 1 0\n",
                "line 2, field 1 (rows): 4000000000 is more than",
            ),
            (
                "%%MatrixMarket matrix coordinate real general\n",
                "line 2, size line: missing",
            ),
            (
                "%%MatrixMarket matrix coordinate real skew-symmetric\n2 2 1\n1 1 1\n",
                "line 3, entry (1, 1)",
            ),
            (
                "%%MatrixMarket matrix coordinate real symmetric\n2 2 2\n2 1 1\n1 2 1\n",
                "given twice",
            ),
            (
                "%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1\n",
                "line 3, entry: expected 3 fields",
            ),
            (
                "%%MatrixMarket matrix coordinate real wobbly\n2 2 1\n1 1\n",
                "line 1, symmetry",
            ),
            (
                "%%MatrixMarket matrix array real general\n2 2\n",
                "not supported",
            ),
            (
                "%%MatrixMarket matrix coordinate complex general\n2 2\n",
                "not supported",
            ),
        ];
        for (text, want) in cases {
            let e = p(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e} should contain {want:?}");
        }
    }
}
