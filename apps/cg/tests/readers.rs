//! The readers on real third-party files (tests/data/README.md): the two encodings of LUND A
//! give the same matrix, UTM300 exercises the unsymmetric and right-hand-side paths, and damaged
//! copies of them give errors that name the line and the field.

use std::path::{Path, PathBuf};

use cg::matrix::{self, Symmetry};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn text(name: &str) -> String {
    std::fs::read_to_string(data(name)).unwrap()
}

#[test]
fn lund_a_is_the_same_matrix_in_both_formats() {
    let hb = matrix::load(&data("lund_a.rsa")).unwrap();
    let mm = matrix::load(&data("lund_a.mtx")).unwrap();
    assert_eq!(hb.symmetry, Symmetry::Symmetric);
    assert_eq!(mm.symmetry, Symmetry::Symmetric);
    let (a, b) = (&hb.matrix, &mm.matrix);
    assert_eq!((a.n_rows, a.n_cols), (147, 147));
    // 1298 stored entries, 147 of them diagonal: 2 * 1298 - 147 in full.
    assert_eq!(a.nnz(), 2 * 1298 - 147);
    assert_eq!(a.row_ptr, b.row_ptr);
    assert_eq!(a.col, b.col);
    // Bit for bit: both decimal expansions round to the same doubles.
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a.val), bits(&b.val));
    assert!(a.is_symmetric());
    // Spot checks against the text: "1 1 7.5000000000000e+07", "8 1 -1.2179486000000e+07".
    assert_eq!(a.get(0, 0), Some(7.5e7));
    assert_eq!(a.get(7, 0), Some(-1.2179486e7));
    assert_eq!(a.get(0, 7), Some(-1.2179486e7));
    assert!(hb.rhs.is_empty());
    assert!(hb.title.starts_with("1SYMMETRIC MATRIX A OF LUND"));
}

#[test]
fn utm300_reads_unsymmetric_entries_and_its_right_hand_side() {
    let m = matrix::load(&data("utm300.rua")).unwrap();
    let a = &m.matrix;
    assert_eq!(m.symmetry, Symmetry::General);
    assert_eq!((a.n_rows, a.n_cols, a.nnz()), (300, 300, 3155));
    assert!(!a.is_symmetric());
    // Column 1 (pointers 1..3): rows 1 and 51, "-.707106816579618E+000.707106745793467E+00".
    assert_eq!(a.get(0, 0), Some(-0.707106816579618));
    assert_eq!(a.get(50, 0), Some(0.707106745793467));
    // Column 2: rows 1, 2, 6, 51, 52, 56.
    assert_eq!(a.get(0, 1), Some(-0.0844334130890272));
    assert_eq!(a.get(1, 1), Some(-0.696951911168316));
    assert_eq!(a.get(55, 1), Some(0.0844333971430866));
    assert_eq!(a.get(1, 0), None, "unsymmetric: nothing is mirrored");
    // The last two values of the file, rows 295 and 300 of column 300 (indices "...295300").
    assert_eq!(a.get(294, 299), Some(0.223352700169129));
    assert_eq!(a.get(299, 299), Some(-0.772876425427416));
    // RHSTYP "FNN", one full right-hand side, 300 values in (3D21.15).
    assert_eq!(m.rhs.len(), 1);
    assert!(m.guesses.is_empty() && m.exact.is_empty());
    let rhs = &m.rhs[0];
    assert_eq!(rhs.len(), 300);
    assert_eq!(
        rhs[..3],
        [
            0.202394105899437e-12,
            0.274823389968666e-14,
            -0.554892366794151e-15
        ]
    );
    // "-.168359295253083E-080.123035231649352E-12-.239352379930970E-14": fields that touch.
    assert_eq!(
        rhs[294..297],
        [
            -0.168359295253083e-8,
            0.123035231649352e-12,
            -0.239352379930970e-14
        ]
    );
    assert_eq!(
        rhs[297..],
        [
            -0.225554746116851e-15,
            0.935226996093998e-16,
            -0.392547043891108e-14
        ]
    );
}

/// Replaces line `no` (1-based) of `text`.
fn with_line(text: &str, no: usize, new: &str) -> String {
    let mut lines: Vec<&str> = text.lines().collect();
    lines[no - 1] = new;
    lines.join("\n")
}

fn error(name: &str, text: &str) -> String {
    let e = matrix::parse(name, text.as_bytes()).expect_err("a damaged file must be refused");
    e.to_string()
}

#[test]
fn damaged_harwell_boeing_files_name_line_and_field() {
    let lund = text("lund_a.rsa");
    let utm = text("utm300.rua");

    // Truncated in the values section (lund_a: 5 header... 4 header lines, 10 + 82 lines of
    // pointers and indices, values from line 97).
    let cut: String = lund.lines().take(200).collect::<Vec<_>>().join("\n");
    let e = error("lund_a.rsa", &cut);
    assert!(
        e.contains("line 201, values: the file ends before this line"),
        "{e}"
    );

    // A bad format string on line 4.
    let bad = with_line(&lund, 4, "(16I5)          (16I5)          (5Y16.8)");
    let e = error("lund_a.rsa", &bad);
    assert!(
        e.contains("line 4, VALFMT (columns 33-52)") && e.contains("unknown edit descriptor 'Y'"),
        "{e}"
    );

    // Garbage in a value field: line 97 is the first line of values, field 3 is columns 33-48.
    let line97 = lund.lines().nth(96).unwrap().to_string();
    let mut garbled = line97.clone().into_bytes();
    garbled[40] = b'#';
    let bad = with_line(&lund, 97, std::str::from_utf8(&garbled).unwrap());
    let e = error("lund_a.rsa", &bad);
    assert!(
        e.contains("line 97, values, field 3 (columns 33-48)"),
        "{e}"
    );
    assert!(e.contains("is not a number"), "{e}");

    // Garbage in a touching integer field of utm300 (26I3): line 143, field 4 = columns 10-12.
    let bad = with_line(&utm, 143, "296297296x98296299250295300");
    let e = error("utm300.rua", &bad);
    assert!(
        e.contains("line 143, row indices, field 4 (columns 10-12)"),
        "{e}"
    );

    // Wrong counts: INDCRD says 81 lines where the indices take 82.
    let line2 = lund.lines().nth(1).unwrap();
    let bad = with_line(
        &lund,
        2,
        &line2.replacen("            82", "            81", 1),
    );
    let e = error("lund_a.rsa", &bad);
    assert!(
        e.contains("line 2, INDCRD (columns 29-42): 81 lines, but the values take 82"),
        "{e}"
    );

    // Wrong counts: NNZERO one more than stored. The line counts still fit (1299 indices
    // take 82 lines of 16, as 1298 do), so the reader meets the missing index: the third field
    // of line 96, blank (the line is padded to 80 columns).
    let line3 = lund.lines().nth(2).unwrap();
    let bad = with_line(
        &lund,
        3,
        &line3.replacen("          1298", "          1299", 1),
    );
    let e = error("lund_a.rsa", &bad);
    assert!(
        e.contains("line 96, row indices, field 3 (columns 11-15): blank field"),
        "{e}"
    );

    // A row index out of range in utm300 (300 x 300): "999" as the first index of line 22.
    let line22 = utm.lines().nth(21).unwrap();
    let bad = with_line(&utm, 22, &format!("999{}", &line22[3..]));
    let e = error("utm300.rua", &bad);
    assert!(
        e.contains("line 22, row indices, field 1 (columns 1-3): row 999"),
        "{e}"
    );

    // The right-hand-side block cut short: its last line loses its last field.
    let last = utm.lines().count();
    let short = utm.lines().last().unwrap()[..42].to_string();
    let bad = with_line(&utm, last, &short);
    let e = error("utm300.rua", &bad);
    assert!(
        e.contains(&format!(
            "line {last}, right-hand sides, field 3 (columns 43-63)"
        )),
        "{e}"
    );
}

#[test]
fn damaged_matrix_market_files_name_line_and_field() {
    let lund = text("lund_a.mtx");
    let cut: String = lund.lines().take(1000).collect::<Vec<_>>().join("\n");
    let e = error("lund_a.mtx", &cut);
    assert!(
        e.contains("line 1001, entry: the file ends after 998 of the 1298 entries"),
        "{e}"
    );
    let bad = with_line(&lund, 3, "1 1  7.5000000000000x+07");
    let e = error("lund_a.mtx", &bad);
    assert!(e.contains("line 3, field 3 (value)"), "{e}");
    let bad = with_line(&lund, 3, "1 148  7.5e7");
    let e = error("lund_a.mtx", &bad);
    assert!(
        e.contains("line 3, field 2 (column)") && e.contains("from 1 to 147"),
        "{e}"
    );
    let bad = with_line(&lund, 2, "147 147 1297");
    let e = error("lund_a.mtx", &bad);
    assert!(
        e.contains("line 1300, entry: more entries than the 1297"),
        "{e}"
    );
    // Both triangles of a symmetric file: "2 1" is stored, add "1 2".
    let bad = with_line(&lund, 3, "1 2  9.6153881000000e+05");
    let e = error("lund_a.mtx", &bad);
    assert!(e.contains("given twice"), "{e}");
}
