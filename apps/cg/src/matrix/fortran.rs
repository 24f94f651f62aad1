//! Fortran edit descriptors as Harwell-Boeing files use them: the format strings of header line
//! 4 (`(16I5)`, `(3E26.18)`, `(1P,3E26.18)`, `(4D20.12)`, ...) and the fixed-width fields they
//! describe.
//!
//! Rules this module keeps (Fortran 77 §13.5, formatted input, with `BLANK='NULL'`, the default
//! of `OPEN`):
//!
//! 1. **Format.** A format is `(` items `)`, items separated by commas, case and blanks
//!    ignored. Supported items: an optional scale factor `kP` (alone, or glued to the next item
//!    as in `1P3E26.18` or `1PE26.18`), any number of `nX` (skip n columns) before the data
//!    item, and exactly one data item `[r]Iw[.m]` or `[r]Fw.d`, `[r]Ew.d[Ee]`, `[r]Dw.d`,
//!    `[r]Gw.d[Ee]`, `[r]ESw.d[Ee]`, `[r]ENw.d[Ee]` (r = repeat, default 1). Items after the
//!    data item are ignored on input. Nested groups like `(5(1X,E15.7))` are refused with an
//!    error (never guessed at).
//! 2. **Records.** Each line (record) holds `r` fields of width `w`, after the skipped columns;
//!    the format reverts to its start for the next line, so a section of `count` values takes
//!    `ceil(count / r)` lines and its last line may hold fewer. Columns past `r * w` are
//!    ignored. Fields touch: `-.1683E-080.1230E-12` is two fields of width 21, never split on
//!    blanks.
//! 3. **Blanks.** Blanks inside a field are ignored (`BLANK='NULL'`): `" 1 2"` reads 12. A field
//!    that is all blank, or lies past the end of its line, would read as zero in Fortran; in a
//!    Harwell-Boeing file it means a truncated or misaligned line, so it is an error here.
//! 4. **Integers** (`I`): an optional sign and digits.
//! 5. **Reals** (`F`, `E`, `D`, `G`, `ES`, `EN`, all read alike): an optional sign, a mantissa of
//!    digits with at most one decimal point, then an optional exponent: a letter `E`, `D` or `Q`
//!    (either case) with an optionally signed integer, or a sign and an integer with no letter
//!    (`1.5+3` is 1.5e3, which is how `E` output writes three-digit exponents).
//! 6. **Implied decimal point.** When the mantissa has no decimal point, its last `d` digits are
//!    the fraction (`E16.8` reads `12345` as 0.00012345).
//! 7. **Scale factor.** With `kP` in force, a field *without* an exponent is the external value
//!    times 10^k, so the value read is the field times 10^-k; a field *with* an exponent is read
//!    as written (the scale factor has no effect on input then). A `kP` stays in force for the
//!    rest of the format.
//! 8. Values are converted by a correctly rounded decimal-to-binary parse of the digits and the
//!    final exponent: no accumulated floating-point error.

use std::fmt;

/// The kind of data edit descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edit {
    /// `Iw[.m]`: an integer.
    Int,
    /// `F`, `E`, `D`, `G`, `ES`, `EN`: a real (all read alike on input, rule 5).
    Real,
}

/// A parsed format: how to read the fields of one line (rules 1-2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Format {
    /// The format as written in the file (for messages).
    pub text: String,
    /// Columns skipped at the start of every line (`nX` before the data item).
    pub skip: usize,
    /// Fields per line (the repeat count r).
    pub per_line: usize,
    /// Width of a field.
    pub width: usize,
    /// Digits after the implied decimal point (`d` of `Fw.d`; 0 for integers).
    pub decimals: u32,
    /// Scale factor k of `kP` (0 if none).
    pub scale: i32,
    /// Integer or real.
    pub edit: Edit,
}

/// Why a format string was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FormatError(pub String);

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Reads an unsigned decimal number at the start of `s`; returns it and the rest.
fn number(s: &str) -> (Option<u64>, &str) {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if end == 0 {
        return (None, s);
    }
    (s[..end].parse().ok(), &s[end..])
}

/// The largest width or repeat count accepted (a sanity bound against absurd formats:
/// Harwell-Boeing lines are 80 columns).
const MAX_WIDTH: u64 = 1000;

impl Format {
    /// Parses a format string such as `(1P,3E26.18)` (rule 1).
    pub fn parse(text: &str) -> Result<Format, FormatError> {
        let shown = text.trim().to_string();
        let err = |m: String| FormatError(format!("format {shown:?}: {m}"));
        let compact: String = text
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            .to_ascii_uppercase();
        let inner = compact
            .strip_prefix('(')
            .and_then(|s| s.strip_suffix(')'))
            .ok_or_else(|| err("a format is enclosed in parentheses".to_string()))?;
        if inner.contains('(') || inner.contains(')') {
            return Err(err(
                "nested groups are not supported (one repeated edit descriptor per format)"
                    .to_string(),
            ));
        }
        let mut scale = 0i32;
        let mut skip = 0usize;
        let mut data: Option<(usize, usize, u32, Edit)> = None;
        for item in inner.split(',') {
            if item.is_empty() {
                return Err(err("empty item between commas".to_string()));
            }
            let mut rest = item;
            // A scale factor: [sign] k P, possibly glued to the data item that follows.
            let (sign, unsigned) = match rest.as_bytes()[0] {
                b'-' => (-1i64, &rest[1..]),
                b'+' => (1, &rest[1..]),
                _ => (1, rest),
            };
            let (k, after) = number(unsigned);
            if let (Some(k), Some(tail)) = (k, after.strip_prefix('P')) {
                let k = i64::try_from(k).unwrap_or(i64::MAX).saturating_mul(sign);
                scale = i32::try_from(k)
                    .ok()
                    .filter(|k| k.abs() <= 100)
                    .ok_or_else(|| err(format!("scale factor {k}P is out of range")))?;
                rest = tail;
                if rest.is_empty() {
                    continue;
                }
            } else if sign < 0 || unsigned.len() != rest.len() {
                return Err(err(format!(
                    "{item:?}: a sign only goes before a scale factor"
                )));
            }
            let (repeat, after) = number(rest);
            if after == "X" {
                let n = repeat.unwrap_or(1);
                if n > MAX_WIDTH {
                    return Err(err(format!("{item:?}: skip too wide")));
                }
                if data.is_none() {
                    skip += n as usize; // at most MAX_WIDTH
                }
                continue;
            }
            let repeat = repeat.unwrap_or(1);
            let (edit, after) = if let Some(a) = after.strip_prefix("ES") {
                (Edit::Real, a)
            } else if let Some(a) = after.strip_prefix("EN") {
                (Edit::Real, a)
            } else if let Some(a) = after.strip_prefix('I') {
                (Edit::Int, a)
            } else if let Some(a) = after
                .strip_prefix('E')
                .or_else(|| after.strip_prefix('D'))
                .or_else(|| after.strip_prefix('F'))
                .or_else(|| after.strip_prefix('G'))
            {
                (Edit::Real, a)
            } else {
                let what = after
                    .chars()
                    .next()
                    .map_or_else(|| "nothing".to_string(), |c| format!("{c:?}"));
                return Err(err(format!(
                    "{item:?}: unknown edit descriptor {what} (expected I, F, E, D, G, ES, EN, X or P)"
                )));
            };
            let (width, after) = number(after);
            let width = width
                .filter(|&w| (1..=MAX_WIDTH).contains(&w))
                .ok_or_else(|| err(format!("{item:?}: a field width from 1 to {MAX_WIDTH}")))?;
            let (decimals, after) = match after.strip_prefix('.') {
                Some(a) => {
                    let (d, a) = number(a);
                    let d = d.filter(|&d| d <= width).ok_or_else(|| {
                        err(format!("{item:?}: digits after '.' up to the width"))
                    })?;
                    (d, a)
                }
                None if edit == Edit::Int => (0, after),
                None => return Err(err(format!("{item:?}: a real descriptor needs .d"))),
            };
            // An exponent width (Ew.dEe) changes nothing on input.
            let after = match after.strip_prefix('E') {
                Some(a) if edit == Edit::Real => number(a).1,
                _ => after,
            };
            if !after.is_empty() {
                return Err(err(format!("{item:?}: unexpected {after:?}")));
            }
            if !(1..=MAX_WIDTH).contains(&repeat) {
                return Err(err(format!(
                    "{item:?}: a repeat count from 1 to {MAX_WIDTH}"
                )));
            }
            if data.is_some() {
                return Err(err(
                    "more than one data edit descriptor is not supported".to_string()
                ));
            }
            // All bounded by MAX_WIDTH above.
            let decimals = if edit == Edit::Int {
                0
            } else {
                decimals as u32
            };
            data = Some((repeat as usize, width as usize, decimals, edit));
        }
        let (per_line, width, decimals, edit) =
            data.ok_or_else(|| err("no data edit descriptor (I, F, E, D, G)".to_string()))?;
        Ok(Format {
            text: shown,
            skip,
            per_line,
            width,
            decimals,
            scale,
            edit,
        })
    }

    /// Lines that `count` values take (rule 2).
    pub fn lines_for(&self, count: usize) -> usize {
        count.div_ceil(self.per_line)
    }

    /// The 1-based columns of field `index` (0-based) of a line.
    pub fn columns(&self, index: usize) -> (usize, usize) {
        let start = self.skip + index * self.width;
        (start + 1, start + self.width)
    }

    /// The text of field `index` of `line` (rule 2), or `None` if it lies wholly past the end.
    pub fn field<'a>(&self, line: &'a str, index: usize) -> Option<&'a str> {
        let start = self.skip + index * self.width;
        let bytes = line.as_bytes();
        if start >= bytes.len() {
            return None;
        }
        let end = (start + self.width).min(bytes.len());
        line.get(start..end)
    }
}

/// Removes the blanks of a field (rule 3); `None` if nothing is left.
fn squeeze(field: &str) -> Option<String> {
    let s: String = field.chars().filter(|c| *c != ' ' && *c != '\t').collect();
    (!s.is_empty()).then_some(s)
}

/// Reads an integer field (rules 3-4).
pub fn read_int(field: &str) -> Result<i64, String> {
    let s = squeeze(field).ok_or_else(|| "blank field".to_string())?;
    let digits = s.strip_prefix(['+', '-']).unwrap_or(&s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{:?} is not an integer", field.trim()));
    }
    s.parse::<i64>()
        .map_err(|_| format!("{:?} is out of range", field.trim()))
}

/// Reads a real field with `decimals` implied digits and scale factor `scale` (rules 3, 5-8).
pub fn read_real(field: &str, decimals: u32, scale: i32) -> Result<f64, String> {
    let bad = || format!("{:?} is not a number", field.trim());
    let s = squeeze(field).ok_or_else(|| "blank field".to_string())?;
    let (negative, body) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, &s[..]),
    };
    // Mantissa: digits with at most one point.
    let mantissa_end = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (mantissa, tail) = body.split_at(mantissa_end);
    if mantissa.matches('.').count() > 1 || !mantissa.bytes().any(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    // Exponent (rule 5): letter + optional sign + digits, or sign + digits.
    let exponent: Option<i64> = if tail.is_empty() {
        None
    } else {
        let t = tail
            .strip_prefix(['E', 'e', 'D', 'd', 'Q', 'q'])
            .map_or(Ok(tail), |t| if t.is_empty() { Err(()) } else { Ok(t) })
            .map_err(|()| bad())?;
        let had_letter = t.len() != tail.len();
        let (sign, digits) = match t.as_bytes()[0] {
            b'-' => (-1, &t[1..]),
            b'+' => (1, &t[1..]),
            _ if had_letter => (1, t),
            _ => return Err(bad()),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        // Clamp absurd exponents: anything past ±100000 is out of f64 range anyway.
        let e: i64 = digits.parse::<i64>().unwrap_or(i64::MAX).min(100_000);
        Some(sign * e)
    };
    let (int_part, frac_part, point) = match mantissa.split_once('.') {
        Some((i, f)) => (i, f, true),
        None => (mantissa, "", false),
    };
    let mut e10 = exponent.unwrap_or(0);
    if !point {
        e10 -= i64::from(decimals); // rule 6
    }
    if exponent.is_none() {
        e10 -= i64::from(scale); // rule 7
    }
    let text = format!(
        "{}{}.{}e{}",
        if negative { "-" } else { "" },
        if int_part.is_empty() { "0" } else { int_part },
        if frac_part.is_empty() { "0" } else { frac_part },
        e10
    );
    let v: f64 = text.parse().map_err(|_| bad())?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(format!(
            "{:?} is out of the range of a double",
            field.trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse() {
        let f = Format::parse("(16I5)").unwrap();
        assert_eq!(
            (f.per_line, f.width, f.edit, f.scale),
            (16, 5, Edit::Int, 0)
        );
        let f = Format::parse("(1P,3E26.18)").unwrap();
        assert_eq!((f.per_line, f.width, f.decimals, f.scale), (3, 26, 18, 1));
        let f = Format::parse(" (1p3e26.18) ").unwrap();
        assert_eq!((f.per_line, f.width, f.decimals, f.scale), (3, 26, 18, 1));
        let f = Format::parse("(1PE26.18)").unwrap();
        assert_eq!((f.per_line, f.width, f.scale), (1, 26, 1));
        let f = Format::parse("(4D20.12)").unwrap();
        assert_eq!(
            (f.per_line, f.width, f.decimals, f.edit),
            (4, 20, 12, Edit::Real)
        );
        let f = Format::parse("(1X,5E15.7E3)").unwrap();
        assert_eq!((f.skip, f.per_line, f.width), (1, 5, 15));
        let f = Format::parse("(26I3)").unwrap();
        assert_eq!(f.lines_for(3155), 122);
        let f = Format::parse("(10F7.1)").unwrap();
        assert_eq!((f.per_line, f.decimals), (10, 1));
        assert_eq!(Format::parse("(8I10.3)").unwrap().width, 10);
        for bad in [
            "16I5",
            "(16Z5)",
            "(3E26)",
            "(5(1X,E15.7))",
            "(I5,E15.7)",
            "()",
            "(1P)",
            "(0I5)",
            "(I0)",
            "(3E26.30)",
            "(,I5)",
        ] {
            assert!(Format::parse(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn fields_run_together() {
        let f = Format::parse("(3D21.15)").unwrap();
        let line = "-.168359295253083E-080.123035231649352E-12-.239352379930970E-14";
        let v: Vec<f64> = (0..3)
            .map(|i| read_real(f.field(line, i).unwrap(), f.decimals, f.scale).unwrap())
            .collect();
        assert_eq!(
            v,
            [
                -0.168359295253083e-8,
                0.123035231649352e-12,
                -0.239352379930970e-14
            ]
        );
        assert_eq!(f.field(line, 3), None);
        let f = Format::parse("(26I3)").unwrap();
        let line = "  1 10100";
        let v: Vec<i64> = (0..3)
            .map(|i| read_int(f.field(line, i).unwrap()).unwrap())
            .collect();
        assert_eq!(v, [1, 10, 100]);
    }

    #[test]
    fn fortran_real_rules() {
        // Exponent letters D, E, Q, either case; sign-only exponents (rule 5).
        assert_eq!(read_real("1.0D+00", 12, 0), Ok(1.0));
        assert_eq!(read_real("1.5d3", 12, 0), Ok(1500.0));
        assert_eq!(read_real("2.5Q-1", 1, 0), Ok(0.25));
        assert_eq!(read_real(" 1.234-105", 3, 0), Ok(1.234e-105));
        assert_eq!(read_real("-.5+3", 3, 0), Ok(-500.0));
        // Implied decimal point (rule 6).
        assert_eq!(read_real("   12345", 8, 0), Ok(0.00012345));
        assert_eq!(read_real("12345E2", 2, 0), Ok(12345.0));
        // Scale factor: applies without an exponent only (rule 7).
        assert_eq!(read_real("1.5", 8, 1), Ok(0.15));
        assert_eq!(read_real("1.5", 8, -2), Ok(150.0));
        assert_eq!(read_real("1.5E+01", 8, 1), Ok(15.0));
        assert_eq!(read_real("1.5D+01", 8, 3), Ok(15.0));
        // Blanks are ignored (rule 3), a blank field is an error.
        assert_eq!(read_real(" 1 . 5 E 1", 1, 0), Ok(15.0));
        assert!(read_real("     ", 1, 0).is_err());
        // Correct rounding (rule 8): 0.1 is the double nearest 0.1.
        assert_eq!(read_real("0.1000000000000000000000001", 0, 0), Ok(0.1));
        for bad in [
            "1.2.3", "E5", "1.0E", "1.0E+", "abc", "1.0X3", "--1", "1e99999", ".",
        ] {
            assert!(read_real(bad, 0, 0).is_err(), "{bad} should be refused");
        }
        assert_eq!(read_int(" -42"), Ok(-42));
        assert_eq!(read_int(" 4 2"), Ok(42));
        assert!(read_int("4.2").is_err());
        assert!(read_int("   ").is_err());
    }
}
