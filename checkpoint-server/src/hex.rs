//! Hex text of bytes: the one encoder and decoder of the workspace (keys, digests, signatures,
//! tokens).
//!
//! Rules:
//!
//! 1. [`encode`] writes two lower-case digits per byte, most significant nibble first.
//! 2. [`decode`] reads exactly `2 * N` digits, upper or lower case, into `N` bytes; anything
//!    else (another length, a sign, a space, a non-ASCII character) is a [`HexError`] that says
//!    what and where, never a panic.
//!
//! ```
//! use veriflow_checkpoint::hex;
//! assert_eq!(hex::encode(&[0x0a, 0xff]), "0aff");
//! assert_eq!(hex::decode::<2>("0AfF"), Ok([0x0a, 0xff]));
//! ```

/// Why text is not the hex of `N` bytes (rule 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HexError {
    /// The text has the wrong number of characters.
    #[error("{found} characters, expected {expected} hex digits")]
    Length {
        /// Characters found.
        found: usize,
        /// Digits expected (twice the bytes).
        expected: usize,
    },
    /// A character is not a hex digit.
    #[error("{found:?} at {at} is not a hex digit")]
    NotHex {
        /// The character.
        found: char,
        /// Its position, in characters.
        at: usize,
    },
}

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Lower-case hex of `bytes` (rule 1).
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(2 * bytes.len());
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// `N` bytes from `2 * N` hex digits (rule 2).
pub fn decode<const N: usize>(text: &str) -> Result<[u8; N], HexError> {
    let found = text.chars().count();
    if found != 2 * N {
        return Err(HexError::Length {
            found,
            expected: 2 * N,
        });
    }
    let mut out = [0u8; N];
    let mut chars = text.chars().enumerate();
    for byte in &mut out {
        for _ in 0..2 {
            let (at, c) = chars.next().expect("the length was checked");
            let nibble = c.to_digit(16).ok_or(HexError::NotHex { found: c, at })?;
            // A hex digit is below 16: the cast cannot lose anything.
            *byte = (*byte << 4) | nibble as u8;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_of_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        let text = encode(&all);
        assert_eq!(&text[..8], "00010203");
        assert_eq!(&text[text.len() - 4..], "feff");
        let back: [u8; 256] = decode(&text).unwrap();
        assert_eq!(back.to_vec(), all);
        assert_eq!(decode::<2>("ABcd"), Ok([0xab, 0xcd]));
    }

    #[test]
    fn bad_text_says_what_and_where() {
        assert_eq!(
            decode::<2>("abc"),
            Err(HexError::Length {
                found: 3,
                expected: 4
            })
        );
        // A sign is refused (`u8::from_str_radix("+f", 16)` would take it).
        assert_eq!(
            decode::<2>("+fab"),
            Err(HexError::NotHex { found: '+', at: 0 })
        );
        assert_eq!(
            decode::<2>("ab g").unwrap_err().to_string(),
            "' ' at 2 is not a hex digit"
        );
        // Four characters, more than four bytes: counted in characters, never split.
        assert_eq!(
            decode::<2>("abcé"),
            Err(HexError::NotHex { found: 'é', at: 3 })
        );
    }
}
