//! Harwell-Boeing files (`.rsa`, `.rua`, `.psa`, `.rza`, ...), after Duff, Grimes and Lewis,
//! *User's Guide for the Harwell-Boeing Sparse Matrix Collection* (1992), paper 002's ref. [14].
//! No maintained Rust reader exists; this one follows the guide's sample Fortran reader.
//!
//! Rules:
//!
//! 1. **Header**, fixed columns (Fortran `A72,A8 / 5I14 / A3,11X,4I14 / 2A16,2A20 /
//!    A3,11X,2I14`):
//!    - line 1: title (cols 1-72), key (73-80);
//!    - line 2: TOTCRD, PTRCRD, INDCRD, VALCRD, RHSCRD (cols 1-14, 15-28, 29-42, 43-56,
//!      57-70), the lines of each section; a blank RHSCRD is 0;
//!    - line 3: MXTYPE (cols 1-3), NROW, NCOL, NNZERO, NELTVL (15-28, 29-42, 43-56, 57-70);
//!    - line 4: PTRFMT (1-16), INDFMT (17-32), VALFMT (33-52), RHSFMT (53-72);
//!    - line 5, only when RHSCRD > 0: RHSTYP (1-3), NRHS (15-28), NRHSIX (29-42).
//! 2. **MXTYPE**: 1st letter `R` real or `P` pattern (no values, entries are 1.0); 2nd `U`
//!    unsymmetric, `R` rectangular, `S` symmetric, `Z` skew-symmetric; 3rd `A` assembled.
//!    Complex (`C`), Hermitian (`H`) and elemental (`E`) files are refused as unsupported.
//! 3. **Body**, each section read as one Fortran `READ` with its format (the rules of
//!    [`super::fortran`]: fixed-width fields that may touch, `D` exponents, `kP`): NCOL+1
//!    column pointers (PTRFMT), NNZERO row indices (INDFMT), NNZERO values (VALFMT, absent for
//!    pattern files), then the right-hand-side block. A section's line count on line 2 must be
//!    the lines its values take; TOTCRD is their sum.
//! 4. **Right-hand sides** (RHSCRD > 0, real files): RHSTYP `F` (full storage): NRHS vectors of
//!    NROW values in one read; then, if RHSTYP(2) = `G`, NRHS starting guesses in a second read;
//!    then, if RHSTYP(3) = `X`, NRHS exact solutions in a third. Each read starts on a new line.
//!    RHSTYP `M` (right-hand sides stored like the matrix) is refused as unsupported.
//! 5. **Structure**: column pointers start at 1, never decrease, and end at NNZERO+1; row
//!    indices are within 1..=NROW. Symmetric files store one triangle; it is mirrored, and a
//!    repeated entry is an error (matrix rules 2-3).
//! 6. Every error names the line and the field (with its columns); the reader never panics.
//!
//! Example header (utm300.rua: unsymmetric, one full right-hand side):
//!
//! ```text
//! UTM300                                                                  UTM300
//!           1290            16           122          1052           100
//! RUA                      300           300          3155             1
//! (20I4)          (26I3)          (3D21.15)           (3D21.15)
//! FNN              1
//! ```

use super::fortran::{self, Edit, Format};
use super::{FileMatrix, MatrixError, Symmetry, Triplets, MAX_DIM};

/// The lines of the file and its name, for messages.
struct Lines<'a> {
    file: &'a str,
    lines: Vec<&'a str>,
}

impl<'a> Lines<'a> {
    fn err(
        &self,
        line: usize,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> MatrixError {
        MatrixError::Field {
            file: self.file.to_string(),
            line,
            field: field.into(),
            message: message.into(),
        }
    }

    /// Line `no` (1-based), or an error naming what was expected there.
    fn line(&self, no: usize, what: &str) -> Result<&'a str, MatrixError> {
        self.lines
            .get(no - 1)
            .copied()
            .ok_or_else(|| self.err(no, what, "the file ends before this line"))
    }

    /// Columns `from..=to` (1-based) of line `no`, blank-padded (Fortran pads short records).
    fn cols(&self, no: usize, from: usize, to: usize, what: &str) -> Result<&'a str, MatrixError> {
        let line = self.line(no, what)?;
        if !line.is_ascii() {
            return Err(self.err(no, what, "the line has non-ASCII characters"));
        }
        let end = to.min(line.len());
        Ok(if from > end { "" } else { &line[from - 1..end] })
    }

    /// An I14 header field: a count (blank allowed when `optional`, reading 0).
    fn count(
        &self,
        no: usize,
        index: usize,
        name: &str,
        optional: bool,
    ) -> Result<usize, MatrixError> {
        // index 0 starts at column 1 on line 2; lines 3 and 5 start their counts at column 15.
        let from = 1 + 14 * index;
        let field = self.cols(no, from, from + 13, name)?;
        let what = format!("{name} (columns {from}-{})", from + 13);
        if field.trim().is_empty() {
            return if optional {
                Ok(0)
            } else {
                Err(self.err(
                    no,
                    what,
                    "blank (the header's counts are in fixed 14-column fields)",
                ))
            };
        }
        let v = fortran::read_int(field).map_err(|m| self.err(no, what.clone(), m))?;
        usize::try_from(v)
            .ok()
            .filter(|&v| v <= MAX_DIM)
            .ok_or_else(|| self.err(no, what, format!("{v} is not a count from 0 to {MAX_DIM}")))
    }

    /// Reads `count` values of a section that starts on line `first` (rule 3).
    fn section<T>(
        &self,
        first: usize,
        fmt: &Format,
        count: usize,
        name: &str,
        read: impl Fn(&str) -> Result<T, String>,
    ) -> Result<Vec<T>, MatrixError> {
        // Every value takes at least one character: do not allocate past the file's size.
        let mut out = Vec::with_capacity(count.min(self.lines.len() * fmt.per_line));
        for k in 0..count {
            let no = first + k / fmt.per_line;
            let f = k % fmt.per_line;
            let line = self.line(no, name)?;
            let (a, b) = fmt.columns(f);
            let what = || format!("{name}, field {} (columns {a}-{b})", f + 1);
            if !line.is_ascii() {
                return Err(self.err(no, what(), "the line has non-ASCII characters"));
            }
            let text = fmt.field(line, f).ok_or_else(|| {
                self.err(
                    no,
                    what(),
                    format!(
                        "the line ends at column {} (value {} of {count}; format {})",
                        line.len(),
                        k + 1,
                        fmt.text
                    ),
                )
            })?;
            out.push(
                read(text)
                    .map_err(|m| self.err(no, what(), format!("{m} (format {})", fmt.text)))?,
            );
        }
        Ok(out)
    }
}

/// Parses the text of a Harwell-Boeing file named `file`.
pub fn parse(file: &str, text: &str) -> Result<FileMatrix, MatrixError> {
    let l = Lines {
        file,
        lines: text.lines().collect(),
    };
    let title = l.line(1, "title")?.trim_end().to_string();

    // Line 2: the line counts (rule 1).
    let totcrd = l.count(2, 0, "TOTCRD", false)?;
    let ptrcrd = l.count(2, 1, "PTRCRD", false)?;
    let indcrd = l.count(2, 2, "INDCRD", false)?;
    let valcrd = l.count(2, 3, "VALCRD", false)?;
    let rhscrd = l.count(2, 4, "RHSCRD", true)?;

    // Line 3: type and sizes (rules 1-2).
    let mxtype = l.cols(3, 1, 3, "MXTYPE")?.to_ascii_uppercase();
    let t: Vec<char> = mxtype.chars().collect();
    let unsupported = |m: String| MatrixError::Unsupported {
        file: file.to_string(),
        message: m,
    };
    if t.len() != 3 {
        return Err(l.err(
            3,
            "MXTYPE (columns 1-3)",
            format!("{mxtype:?} is not a type like RSA"),
        ));
    }
    let pattern = match t[0] {
        'R' => false,
        'P' => true,
        'C' => return Err(unsupported(format!("complex matrices (MXTYPE {mxtype})"))),
        _ => {
            return Err(l.err(
                3,
                "MXTYPE (columns 1-3)",
                format!("{mxtype:?}: first letter R, P or C"),
            ))
        }
    };
    let symmetry = match t[1] {
        'U' | 'R' => Symmetry::General,
        'S' => Symmetry::Symmetric,
        'Z' => Symmetry::SkewSymmetric,
        'H' => return Err(unsupported(format!("Hermitian matrices (MXTYPE {mxtype})"))),
        _ => {
            return Err(l.err(
                3,
                "MXTYPE (columns 1-3)",
                format!("{mxtype:?}: second letter U, R, S, Z or H"),
            ))
        }
    };
    match t[2] {
        'A' => {}
        'E' => return Err(unsupported(format!("elemental matrices (MXTYPE {mxtype})"))),
        _ => {
            return Err(l.err(
                3,
                "MXTYPE (columns 1-3)",
                format!("{mxtype:?}: third letter A or E"),
            ))
        }
    }
    let nrow = l.count(3, 1, "NROW", false)?;
    let ncol = l.count(3, 2, "NCOL", false)?;
    let nnz = l.count(3, 3, "NNZERO", false)?;
    let limit = super::dim_limit(text.len());
    for (name, col, n) in [("NROW", 15, nrow), ("NCOL", 29, ncol)] {
        if n > limit {
            return Err(l.err(
                3,
                format!("{name} (columns {col}-{})", col + 13),
                format!(
                    "{n} is more than a file of {} bytes can describe (at most {limit})",
                    text.len()
                ),
            ));
        }
    }
    if nrow.checked_mul(ncol).is_some_and(|cells| nnz > cells) {
        return Err(l.err(
            3,
            "NNZERO (columns 43-56)",
            format!("{nnz} entries do not fit in {nrow} x {ncol}"),
        ));
    }

    // Line 4: the formats.
    let fmt = |from: usize, to: usize, name: &str, edit: Edit| -> Result<Format, MatrixError> {
        let what = format!("{name} (columns {from}-{to})");
        let f =
            Format::parse(l.cols(4, from, to, name)?).map_err(|e| l.err(4, what.clone(), e.0))?;
        if f.edit != edit {
            let want = if edit == Edit::Int {
                "an integer (I)"
            } else {
                "a real (E, D, F, G)"
            };
            return Err(l.err(4, what, format!("{} must be {want} format", f.text)));
        }
        Ok(f)
    };
    let ptrfmt = fmt(1, 16, "PTRFMT", Edit::Int)?;
    let indfmt = fmt(17, 32, "INDFMT", Edit::Int)?;
    let valfmt = if pattern {
        None
    } else {
        Some(fmt(33, 52, "VALFMT", Edit::Real)?)
    };
    let rhsfmt = if rhscrd > 0 {
        Some(fmt(53, 72, "RHSFMT", Edit::Real)?)
    } else {
        None
    };

    // Line 5: the right-hand sides (rule 4).
    let mut body = 5;
    let mut rhs_spec = None;
    if rhscrd > 0 {
        if pattern {
            return Err(l.err(
                2,
                "RHSCRD (columns 57-70)",
                "a pattern matrix has no right-hand sides",
            ));
        }
        let rhstyp = l.cols(5, 1, 3, "RHSTYP")?.to_ascii_uppercase();
        let r: Vec<char> = rhstyp.chars().collect();
        match r.first() {
            Some('F') => {}
            Some('M') => {
                return Err(unsupported(
                    "right-hand sides in matrix storage (RHSTYP M)".to_string(),
                ))
            }
            _ => {
                return Err(l.err(
                    5,
                    "RHSTYP (columns 1-3)",
                    format!("{rhstyp:?}: first letter F or M"),
                ))
            }
        }
        let guess = r.get(1) == Some(&'G');
        let exact = r.get(2) == Some(&'X');
        let nrhs = l.count(5, 1, "NRHS", false)?;
        rhs_spec = Some((nrhs, guess, exact));
        body = 6;
    }

    // Line counts (rule 3).
    let check = |name: &str, col: usize, given: usize, need: usize| -> Result<(), MatrixError> {
        if given == need {
            Ok(())
        } else {
            Err(l.err(
                2,
                format!("{name} (columns {col}-{})", col + 13),
                format!("{given} lines, but the values take {need}"),
            ))
        }
    };
    let ncol1 = ncol + 1;
    check("PTRCRD", 15, ptrcrd, ptrfmt.lines_for(ncol1))?;
    check("INDCRD", 29, indcrd, indfmt.lines_for(nnz))?;
    check(
        "VALCRD",
        43,
        valcrd,
        valfmt.as_ref().map_or(0, |f| f.lines_for(nnz)),
    )?;
    let rhs_values = rhs_spec.map_or(Ok(0), |(nrhs, _, _)| {
        nrhs.checked_mul(nrow)
            .filter(|&v| v <= MAX_DIM)
            .ok_or_else(|| {
                l.err(
                    5,
                    "NRHS (columns 15-28)",
                    format!("{nrhs} right-hand sides of {nrow} values are too many"),
                )
            })
    })?;
    if let (Some(f), Some((_, g, x))) = (&rhsfmt, rhs_spec) {
        let reads = 1 + usize::from(g) + usize::from(x);
        check("RHSCRD", 57, rhscrd, reads * f.lines_for(rhs_values))?;
    }
    if totcrd != ptrcrd + indcrd + valcrd + rhscrd {
        return Err(l.err(
            2,
            "TOTCRD (columns 1-14)",
            format!(
                "{totcrd}, but PTRCRD + INDCRD + VALCRD + RHSCRD = {}",
                ptrcrd + indcrd + valcrd + rhscrd
            ),
        ));
    }

    // The body (rule 3).
    let as_index = |f: &str| fortran::read_int(f);
    let ptr = l.section(body, &ptrfmt, ncol1, "column pointers", as_index)?;
    let ind_line = body + ptrcrd;
    let ind = l.section(ind_line, &indfmt, nnz, "row indices", as_index)?;
    let val_line = ind_line + indcrd;
    let vals = match &valfmt {
        Some(f) => l.section(val_line, f, nnz, "values", |s| {
            fortran::read_real(s, f.decimals, f.scale)
        })?,
        None => vec![1.0; ind.len()],
    };
    let mut rhs_line = val_line + valcrd;
    let mut read_vectors = |what: &str| -> Result<Vec<Vec<f64>>, MatrixError> {
        let (Some(f), Some((nrhs, _, _))) = (&rhsfmt, rhs_spec) else {
            return Ok(Vec::new());
        };
        let v = l.section(rhs_line, f, rhs_values, what, |s| {
            fortran::read_real(s, f.decimals, f.scale)
        })?;
        rhs_line += f.lines_for(rhs_values);
        Ok(if nrow == 0 {
            vec![Vec::new(); nrhs]
        } else {
            v.chunks(nrow).map(<[f64]>::to_vec).collect()
        })
    };
    let rhs = read_vectors("right-hand sides")?;
    let guesses = if rhs_spec.is_some_and(|s| s.1) {
        read_vectors("starting guesses")?
    } else {
        Vec::new()
    };
    let exact = if rhs_spec.is_some_and(|s| s.2) {
        read_vectors("exact solutions")?
    } else {
        Vec::new()
    };

    // Structure (rule 5): pointers, then indices, each error at its own line and field.
    let at = |first: usize, f: &Format, k: usize, name: &str| {
        let (a, b) = f.columns(k % f.per_line);
        (
            first + k / f.per_line,
            format!("{name}, field {} (columns {a}-{b})", k % f.per_line + 1),
        )
    };
    for (k, &p) in ptr.iter().enumerate() {
        let prev = if k == 0 { 1 } else { ptr[k - 1] };
        let bad = if k == 0 && p != 1 {
            Some("the first column pointer is 1".to_string())
        } else if p < prev {
            Some(format!("pointer {p} is less than the previous one, {prev}"))
        } else if k == ncol && usize::try_from(p).ok() != Some(nnz + 1) {
            Some(format!(
                "the last pointer is NNZERO + 1 = {}, not {p}",
                nnz + 1
            ))
        } else if usize::try_from(p).map_or(true, |p| p > nnz + 1) {
            Some(format!("pointer {p} is past NNZERO + 1 = {}", nnz + 1))
        } else {
            None
        };
        if let Some(m) = bad {
            let (no, what) = at(body, &ptrfmt, k, "column pointers");
            return Err(l.err(no, what, m));
        }
    }
    let mut t = Triplets::new(file, nrow, ncol, nnz);
    for j in 0..ncol {
        // Checked above: 1 <= ptr[j] <= ptr[j + 1] <= nnz + 1.
        let (a, b) = (ptr[j] as usize - 1, ptr[j + 1] as usize - 1);
        for k in a..b {
            let i = ind[k];
            let (no, what) = at(ind_line, &indfmt, k, "row indices");
            if i < 1 || i as usize > nrow {
                return Err(l.err(
                    no,
                    what,
                    format!("row {i} of column {} is not within 1..={nrow}", j + 1),
                ));
            }
            let line = u32::try_from(no).unwrap_or(u32::MAX);
            // Indices bounded by MAX_DIM (= u32::MAX) above.
            t.entries.push(((i - 1) as u32, j as u32, vals[k], line));
        }
    }
    t.expand(symmetry)?;
    Ok(FileMatrix {
        matrix: t.into_csr()?,
        symmetry,
        rhs,
        guesses,
        exact,
        title,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3x3 symmetric matrix [[4,-1,0],[-1,4,-2],[0,-2,5]] stored as its lower triangle, with
    /// a right-hand side, a guess and an exact solution, in `1P` and `D` formats; fields touch
    /// on line 9, whose values have no exponent (so 1P scales them).
    fn lines() -> Vec<String> {
        vec![
            format!("{:<72}{:<8}", "SMALL TEST MATRIX", "SMALL"),
            counts2(7, 1, 1, 2, 3),
            counts3("RSA", "3", "5"),
            format!(
                "{:<16}{:<16}{:<20}{:<20}",
                "(4I3)", "(5I3)", "(1P,3D20.12)", "(1P3E12.4)"
            ),
            format!("{:<14}{:>14}{:>14}", "FGX", 1, 0),
            "  1  3  5  6".to_string(),
            "  1  2  2  3  3".to_string(),
            "  4.000000000000D+00 -1.000000000000D+00  4.000000000000D+00".to_string(),
            " -20.00000000000000050.00000000000000000".to_string(),
            "  1.0000E+00      2.5000    -3.00000".to_string(),
            "  0.0000E+00  0.0000E+00  0.0000E+00".to_string(),
            "  1.0000E+00  1.0000E+00  1.0000E+00".to_string(),
        ]
    }

    fn counts2(a: usize, b: usize, c: usize, d: usize, e: usize) -> String {
        format!("{a:>14}{b:>14}{c:>14}{d:>14}{e:>14}")
    }

    fn counts3(t: &str, n: &str, nnz: &str) -> String {
        format!("{t:<14}{n:>14}{n:>14}{nnz:>14}{:>14}", 0)
    }

    fn small() -> String {
        lines().join("\n")
    }

    #[test]
    fn a_symmetric_file_with_all_right_hand_side_blocks() {
        let m = parse("small.rsa", &small()).unwrap();
        let a = &m.matrix;
        assert_eq!(a.nnz(), 7);
        assert_eq!(a.get(0, 0), Some(4.0));
        assert_eq!(a.get(0, 1), Some(-1.0));
        assert_eq!(a.get(1, 0), Some(-1.0));
        assert_eq!(a.get(2, 1), Some(-2.0));
        assert_eq!(a.get(1, 2), Some(-2.0));
        assert_eq!(a.get(2, 2), Some(5.0));
        assert!(a.is_symmetric());
        // 1P: "2.5000" without exponent reads 0.25, "-3.00000" reads -0.3, with one it is as written.
        assert_eq!(m.rhs, vec![vec![1.0, 0.25, -0.3]]);
        assert_eq!(m.guesses, vec![vec![0.0; 3]]);
        assert_eq!(m.exact, vec![vec![1.0; 3]]);
    }

    #[test]
    fn errors_name_line_and_field() {
        let edit = |line: usize, new: String| {
            let mut v = lines();
            v[line - 1] = new;
            v.join("\n")
        };
        let fmts = |ind: &str| {
            format!(
                "{:<16}{:<16}{:<20}{:<20}",
                "(4I3)", ind, "(1P,3D20.12)", "(1P3E12.4)"
            )
        };
        let s = |x: &str| x.to_string();
        let cases = [
            (edit(4, fmts("(5Z3)")), "line 4, INDFMT (columns 17-32)"),
            (
                edit(4, fmts("(5(1X,I3))")),
                "line 4, INDFMT (columns 17-32): format \"(5(1X,I3))\": nested",
            ),
            (
                edit(4, fmts("(5E3.1)")),
                "line 4, INDFMT (columns 17-32): (5E3.1) must be an integer (I) format",
            ),
            (
                edit(6, s("  1  3  x  6")),
                "line 6, column pointers, field 3 (columns 7-9)",
            ),
            (
                edit(7, s("  1  2  2  3  9")),
                "line 7, row indices, field 5 (columns 13-15): row 9",
            ),
            (
                edit(
                    8,
                    s("  4.000000000000D+00 -1.000000000000D+00  4.0000000000Z0D+00"),
                ),
                "line 8, values, field 3 (columns 41-60)",
            ),
            (
                edit(9, s(" -20.000000000000000")),
                "line 9, values, field 2 (columns 21-40): the line ends",
            ),
            (
                edit(10, s("  1.0000E+00            -3.00000")),
                "line 10, right-hand sides, field 2 (columns 13-24): blank field",
            ),
            (
                edit(2, counts2(7, 2, 1, 2, 3)),
                "line 2, PTRCRD (columns 15-28): 2 lines, but the values take 1",
            ),
            (
                edit(2, counts2(9, 1, 1, 2, 3)),
                "line 2, TOTCRD (columns 1-14)",
            ),
            (
                edit(2, counts2(7, 1, 1, 2, 2)),
                "line 2, RHSCRD (columns 57-70): 2 lines",
            ),
            (
                edit(3, counts3("RSA", "3", "x 5")),
                "line 3, NNZERO (columns 43-56)",
            ),
            (
                edit(3, counts3("RSA", "3", "10")),
                "line 3, NNZERO (columns 43-56): 10 entries do not fit",
            ),
            (
                edit(3, counts3("RSE", "3", "5")),
                "not supported: elemental",
            ),
            (edit(3, counts3("CSA", "3", "5")), "not supported: complex"),
            (
                edit(
                    3,
                    format!(
                        "{:<14}{:>14}{:>14}{:>14}{:>14}",
                        "RSA", 3_000_000_000u64, 3, 5, 0
                    ),
                ),
                "line 3, NROW (columns 15-28): 3000000000 is more than",
            ),
            (
                edit(3, counts3("RQA", "3", "5")),
                "line 3, MXTYPE (columns 1-3)",
            ),
            (
                edit(6, s("  1  3  7  6")),
                "line 6, column pointers, field 3 (columns 7-9): pointer 7 is past",
            ),
            (
                edit(6, s("  2  3  5  6")),
                "line 6, column pointers, field 1 (columns 1-3)",
            ),
            (
                edit(6, s("  1  3  5  5")),
                "line 6, column pointers, field 4 (columns 10-12): the last pointer",
            ),
            (
                edit(5, format!("{:<14}{:>14}{:>14}", "MGX", 1, 0)),
                "not supported: right-hand sides in matrix storage",
            ),
        ];
        for (text, want) in cases {
            let e = parse("small.rsa", &text).unwrap_err().to_string();
            assert!(e.contains(want), "{e}\nshould contain {want:?}");
        }
        let truncated: String = lines()[..9].join("\n");
        let e = parse("small.rsa", &truncated).unwrap_err().to_string();
        assert!(
            e.contains("line 10, right-hand sides: the file ends"),
            "{e}"
        );
        let e = parse("small.rsa", "only a title").unwrap_err().to_string();
        assert!(e.contains("line 2, TOTCRD: the file ends"), "{e}");
    }
}
