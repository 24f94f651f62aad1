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

use std::any::Any;
use std::sync::Arc;

use crate::codec::{self, CodecError};
use crate::task::Data;

type Encoder = fn(&(dyn Any + Send + Sync)) -> Result<Vec<u8>, CodecError>;

/// A data object's value, typed or encoded (opaque outside the runtime).
#[derive(Clone)]
pub struct Value(Inner);

#[derive(Clone)]
enum Inner {
    Typed {
        any: Arc<dyn Any + Send + Sync>,
        encode: Encoder,
    },
    /// `Arc<Vec<u8>>`, not `Arc<[u8]>`: a received buffer becomes a value without a copy.
    /// `wire`: the bytes came over a wire (deserialized), not from this process's own log or
    /// encoder; a receiver checks those against their digest.
    Bytes { bytes: Arc<Vec<u8>>, wire: bool },
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Inner::Typed { .. } => f.write_str("Value::Typed"),
            Inner::Bytes { bytes, .. } => write!(f, "Value::Bytes({} bytes)", bytes.len()),
        }
    }
}

fn encode_as<T: Data>(any: &(dyn Any + Send + Sync)) -> Result<Vec<u8>, CodecError> {
    match any.downcast_ref::<T>() {
        Some(v) => codec::encode(v),
        None => unreachable!("a Value's encoder is created with its own type"),
    }
}

impl Value {
    pub(crate) fn typed<T: Data>(v: T) -> Value {
        Value(Inner::Typed {
            any: Arc::new(v),
            encode: encode_as::<T>,
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
            Inner::Typed { any, encode } => encode(&**any),
            Inner::Bytes { bytes, .. } => Ok(bytes.as_ref().clone()),
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
            Inner::Bytes { bytes, .. } => codec::decode::<T>(&bytes)
                .map_err(|e| format!("cannot decode a {}: {e}", std::any::type_name::<T>())),
        }
    }
}

/// On a wire a value is its encoded bytes (typed values are encoded here).
impl serde::Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            Inner::Typed { any, encode } => {
                let bytes = encode(&**any).map_err(serde::ser::Error::custom)?;
                s.serialize_bytes(&bytes)
            }
            Inner::Bytes { bytes, .. } => s.serialize_bytes(bytes),
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
}
