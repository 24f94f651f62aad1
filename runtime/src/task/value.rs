//! Type-erased values of data objects.
//!
//! A value lives either typed (written by a task in this process: no encoding needed unless it
//! is logged or sent over a wire) or as bytes (received over a wire or read from a log: decoded
//! by the consumer, which knows its type).
//!
//! A value in a vnode message (`transport::Message`) stays typed between the vnodes of one
//! process: the in-process transport moves the message, and the thief's task takes the value
//! (a copy of it while the victim still holds its grant). It is encoded only when the message
//! is serialized for a wire, and arrives there as bytes. Before this, a steal between two
//! in-process vnodes encoded every input, copied it three times and decoded it again: in the
//! data-flow CG (8 MB vectors) that was most of a no-log run's time.
//!
//! A typed scalar of at most 64 bits (the integers, `f32`, `f64`, `bool`) is held in the value
//! itself, as a word with its type, not behind an `Arc`: most small tasks pass a count or a
//! flag, and that allocation and its atomic reference count were one of the two mallocs of
//! every task of an empty-task tree. It reads back, encodes and compares exactly as the boxed
//! value did.

use std::any::Any;
use std::sync::Arc;

use crate::codec::{self, CodecError};
use crate::task::Data;

type Encoder = fn(&(dyn Any + Send + Sync)) -> Result<Vec<u8>, CodecError>;

/// How a typed value is encoded, and the length of its encoding when that is known without
/// encoding (`codec::encoded_value_len`): one static per type, so a typed value stays two
/// words and a pointer.
struct Codec {
    encode: Encoder,
    len: fn(&(dyn Any + Send + Sync)) -> Option<u64>,
}

struct CodecOf<T>(std::marker::PhantomData<T>);

impl<T: Data> CodecOf<T> {
    const CODEC: Codec = Codec {
        encode: encode_as::<T>,
        len: len_as::<T>,
    };
}

/// A data object's value, typed or encoded (opaque outside the runtime).
#[derive(Clone)]
pub struct Value(Inner);

#[derive(Clone)]
enum Inner {
    Typed {
        any: Arc<dyn Any + Send + Sync>,
        codec: &'static Codec,
    },
    /// `Arc<Vec<u8>>`, not `Arc<[u8]>`: a received buffer becomes a value without a copy.
    /// `wire`: the bytes came over a wire (deserialized), not from this process's own log or
    /// encoder; a receiver checks those against their digest.
    Bytes { bytes: Arc<Vec<u8>>, wire: bool },
    /// A typed scalar held in place (see the module doc).
    Word { word: u64, kind: &'static WordKind },
}

/// How a scalar type lives in a word (one static per type: a kind is its type).
struct WordKind {
    encode: fn(u64) -> Result<Vec<u8>, CodecError>,
}

/// The scalar types held in a word: name of their kind, type, to the word, from the word.
///
/// `word_of` and `from_word` are generic, so that each type test is a constant of the
/// monomorphized function (a `dyn Any` made from a concrete type in place), not a chain of
/// calls through vtables and function pointers on every value a task writes or reads.
macro_rules! words {
    ($($kind:ident: $t:ty, $to:expr, $from:expr;)*) => {
        $(
            static $kind: WordKind = WordKind {
                encode: |w| codec::encode(&($from)(w)),
            };
        )*

        /// The word and kind of `v` if it is one of the scalar types.
        fn word_of<T: 'static>(v: &T) -> Option<(u64, &'static WordKind)> {
            let v: &dyn Any = v;
            $(
                if let Some(&x) = v.downcast_ref::<$t>() {
                    return Some((($to)(x), &$kind));
                }
            )*
            None
        }

        /// The `T` held in `word` of kind `kind`, if `T` is that kind's type.
        fn from_word<T: 'static>(word: u64, kind: &'static WordKind) -> Option<T> {
            let mut out: Option<T> = None;
            let slot: &mut dyn Any = &mut out;
            $(
                if let Some(o) = slot.downcast_mut::<Option<$t>>() {
                    if std::ptr::eq(kind, &$kind) {
                        *o = Some(($from)(word));
                    }
                    return out;
                }
            )*
            None
        }
    };
}

// The casts are exact both ways: a word is only read back as the type it was made from.
words! {
    U64: u64, |x: u64| x, |w: u64| w;
    I64: i64, |x: i64| x as u64, |w: u64| w as i64;
    U32: u32, u64::from, |w: u64| w as u32;
    I32: i32, |x: i32| x as u64, |w: u64| w as i32;
    USIZE: usize, |x: usize| x as u64, |w: u64| w as usize;
    F64: f64, f64::to_bits, f64::from_bits;
    F32: f32, |x: f32| u64::from(x.to_bits()), |w: u64| f32::from_bits(w as u32);
    BOOL: bool, u64::from, |w: u64| w != 0;
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Inner::Typed { .. } | Inner::Word { .. } => f.write_str("Value::Typed"),
            Inner::Bytes { bytes, .. } => write!(f, "Value::Bytes({} bytes)", bytes.len()),
        }
    }
}

fn encode_as<T: Data>(any: &(dyn Any + Send + Sync)) -> Result<Vec<u8>, CodecError> {
    match any.downcast_ref::<T>() {
        Some(v) => codec::encode_value(v),
        None => unreachable!("a Value's encoder is created with its own type"),
    }
}

fn len_as<T: Data>(any: &(dyn Any + Send + Sync)) -> Option<u64> {
    codec::encoded_value_len(any.downcast_ref::<T>()?)
}

impl Value {
    pub(crate) fn typed<T: Data>(v: T) -> Value {
        if let Some((word, kind)) = word_of(&v) {
            return Value(Inner::Word { word, kind });
        }
        Value(Inner::Typed {
            any: Arc::new(v),
            codec: &CodecOf::<T>::CODEC,
        })
    }

    pub(crate) fn bytes(b: Vec<u8>) -> Value {
        Value(Inner::Bytes {
            bytes: Arc::new(b),
            wire: false,
        })
    }

    /// The encoded bytes of the value.
    pub(crate) fn encode(&self) -> Result<Vec<u8>, CodecError> {
        match &self.0 {
            Inner::Typed { any, codec } => (codec.encode)(&**any),
            Inner::Bytes { bytes, .. } => Ok(bytes.as_ref().clone()),
            Inner::Word { word, kind } => (kind.encode)(*word),
        }
    }

    /// The length of [`Value::encode`]'s bytes when it is known without encoding (bytes, or
    /// a type whose length `codec::encoded_value_len` knows): a log that holds the value by
    /// digest already names it again by digest and length, without a copy.
    pub(crate) fn encoded_len(&self) -> Option<u64> {
        match &self.0 {
            Inner::Typed { any, codec } => (codec.len)(&**any),
            Inner::Bytes { bytes, .. } => Some(bytes.len() as u64),
            Inner::Word { .. } => None,
        }
    }

    /// The bytes of a value that came over a wire (deserialized from a message), else `None`.
    pub(crate) fn wire_bytes(&self) -> Option<&[u8]> {
        match &self.0 {
            Inner::Bytes { bytes, wire: true } => Some(bytes),
            _ => None,
        }
    }

    /// The value as a `T`: moved out when this is the last reference, cloned otherwise,
    /// decoded when it is bytes.
    pub(crate) fn take<T: Data>(self) -> Result<T, String> {
        match self.0 {
            Inner::Typed { any, .. } => match any.downcast::<T>() {
                Ok(arc) => Ok(Arc::try_unwrap(arc).unwrap_or_else(|a| (*a).clone())),
                Err(_) => Err(format!("value is not a {}", std::any::type_name::<T>())),
            },
            Inner::Bytes { bytes, .. } => codec::decode_value::<T>(&bytes)
                .map_err(|e| format!("cannot decode a {}: {e}", std::any::type_name::<T>())),
            Inner::Word { word, kind } => from_word::<T>(word, kind)
                .ok_or_else(|| format!("value is not a {}", std::any::type_name::<T>())),
        }
    }
}

/// On a wire a value is its encoded bytes (typed values are encoded here).
impl serde::Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            Inner::Typed { any, codec } => {
                let bytes = (codec.encode)(&**any).map_err(serde::ser::Error::custom)?;
                s.serialize_bytes(&bytes)
            }
            Inner::Bytes { bytes, .. } => s.serialize_bytes(bytes),
            Inner::Word { word, kind } => {
                let bytes = (kind.encode)(*word).map_err(serde::ser::Error::custom)?;
                s.serialize_bytes(&bytes)
            }
        }
    }
}

/// ... and read back as bytes, decoded by the consumer.
impl<'de> serde::Deserialize<'de> for Value {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bytes = serde_bytes::ByteBuf::deserialize(d)?;
        Ok(Value(Inner::Bytes {
            bytes: Arc::new(bytes.into_vec()),
            wire: true,
        }))
    }
}

/// Equal when the encodings are (for tests of messages).
impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        match (self.encode(), other.encode()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A typed value goes over a wire as the bytes of its encoding and comes back as bytes
    /// that decode to it; in a message moved in process it stays typed.
    #[test]
    fn a_value_is_its_encoding_on_a_wire_and_typed_in_process() {
        let v = Value::typed(vec![1.5f64, -2.0, 3.25]);
        assert!(v.wire_bytes().is_none());
        let wire = postcard::to_allocvec(&v).unwrap();
        let want = postcard::to_allocvec(&serde_bytes::ByteBuf::from(
            codec::encode(&vec![1.5f64, -2.0, 3.25]).unwrap(),
        ))
        .unwrap();
        assert_eq!(wire, want);
        let back: Value = postcard::from_bytes(&wire).unwrap();
        assert!(back.wire_bytes().is_some() && Value::bytes(vec![0]).wire_bytes().is_none());
        assert_eq!(back, v);
        assert_eq!(back.take::<Vec<f64>>().unwrap(), vec![1.5, -2.0, 3.25]);
        let moved = v.clone();
        assert!(moved.wire_bytes().is_none());
        assert_eq!(moved.take::<Vec<f64>>().unwrap(), vec![1.5, -2.0, 3.25]);
    }

    /// The length of a value's encoding is known without encoding it for bytes and for a
    /// `Vec<f64>` (every varint width of its length), and is then exactly the encoding's.
    #[test]
    fn an_encoded_length_known_in_advance_is_the_encodings() {
        for n in [0usize, 1, 127, 128, 16_383, 16_384, 300_000] {
            let v = Value::typed(vec![0.5f64; n]);
            assert_eq!(
                v.encoded_len(),
                Some(v.encode().unwrap().len() as u64),
                "{n}"
            );
        }
        assert_eq!(Value::bytes(vec![3; 17]).encoded_len(), Some(17));
        assert_eq!(Value::typed("text".to_string()).encoded_len(), None);
        assert_eq!(Value::typed(vec![1u8, 2]).encoded_len(), None);
        assert_eq!(Value::typed(7u64).encoded_len(), None);
    }

    /// Scalars live in the word (no `Arc`), and read back, encode, cross a wire and refuse
    /// another type exactly as a boxed value does.
    #[test]
    fn a_scalar_is_held_in_place_and_behaves_as_a_boxed_value() {
        fn same<T: Data + PartialEq>(x: T) {
            let v = Value::typed(x.clone());
            assert!(
                matches!(v.0, Inner::Word { .. }),
                "{x:?} is not held in place"
            );
            assert_eq!(v.encode().unwrap(), codec::encode(&x).unwrap());
            let back: Value = postcard::from_bytes(&postcard::to_allocvec(&v).unwrap()).unwrap();
            assert_eq!(back.take::<T>().unwrap(), x);
            assert_eq!(v.clone().take::<T>().unwrap(), x);
            assert!(v.take::<String>().is_err());
        }
        same(u64::MAX);
        same(-7i64);
        same(u32::MAX);
        same(i32::MIN);
        same(usize::MAX);
        same(-0.1f64);
        same(f32::MIN_POSITIVE);
        same(true);
        same(false);
        assert!(Value::typed(3u64).take::<i64>().is_err());
        assert!(matches!(Value::typed(3u16).0, Inner::Typed { .. }));
        assert!(matches!(Value::typed((1u8, 2u8)).0, Inner::Typed { .. }));
    }
}
