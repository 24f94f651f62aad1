//! Type-erased values of data objects.
//!
//! A value lives either typed (written by a task in this process: no encoding needed unless it
//! is logged or sent) or as bytes (received from another vnode or read from a log: decoded by
//! the consumer, which knows its type).

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
    Bytes(Arc<[u8]>),
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Inner::Typed { .. } => f.write_str("Value::Typed"),
            Inner::Bytes(b) => write!(f, "Value::Bytes({} bytes)", b.len()),
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
        Value(Inner::Bytes(b.into()))
    }

    /// The encoded bytes of the value.
    pub(crate) fn encode(&self) -> Result<Vec<u8>, CodecError> {
        match &self.0 {
            Inner::Typed { any, encode } => encode(&**any),
            Inner::Bytes(b) => Ok(b.to_vec()),
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
            Inner::Bytes(b) => codec::decode::<T>(&b)
                .map_err(|e| format!("cannot decode a {}: {e}", std::any::type_name::<T>())),
        }
    }
}
