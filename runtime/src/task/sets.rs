//! Typed tuples of inputs and outputs ([`InputSet`], [`OutputSet`]), implemented for tuples of
//! up to six [`Data`] types; [`InputSet`] also for `Vec<T>` (any number of inputs of one type).

use std::marker::PhantomData;

use smallvec::SmallVec;

use super::value::Value;
use super::{Data, Read, Write};
use crate::ids::DataId;

/// Ids of a task's inputs or outputs, inline for the common small case.
pub type IdList = SmallVec<[DataId; 4]>;

/// A value that could not be turned into the type a task declared.
#[derive(Debug, Clone)]
pub struct ValueError {
    /// Position in the tuple.
    pub index: usize,
    /// What went wrong.
    pub reason: String,
}

/// The inputs of a task: a tuple of values it reads, e.g. `(u64, Vec<f64>)`, or `Vec<T>`.
/// [`InputSet::Reads`] is the matching tuple of [`Read`] handles passed to `spawn`.
pub trait InputSet: Sized + Send + 'static {
    /// Handles naming the data to read: `(Read<A>, Read<B>)` or `Vec<Read<T>>`.
    type Reads: Send;
    /// Appends the data ids of `reads` to `out`, in order.
    fn ids(reads: &Self::Reads, out: &mut IdList);
    /// Number of inputs, or `None` if it varies (`Vec<T>`).
    fn arity() -> Option<usize>;
    #[doc(hidden)]
    fn from_values(values: Vec<Value>) -> Result<Self, ValueError>;
    #[doc(hidden)]
    fn into_values(self) -> Vec<Value>;
}

/// The outputs of a task: a tuple of the values it writes, e.g. `(u64,)`.
/// [`OutputSet::Writes`] are the handles the task gets, [`OutputSet::Reads`] what its parent
/// gets back from `spawn`.
pub trait OutputSet: Sized + Send + 'static {
    /// `(Write<A>, ...)`: must each be written or delegated by the task.
    type Writes: Send;
    /// `(Read<A>, ...)`: handles to the outputs, returned by `spawn`.
    type Reads: Send;
    /// Number of outputs.
    const LEN: usize;
    #[doc(hidden)]
    fn make_writes(ids: &[DataId]) -> Self::Writes;
    #[doc(hidden)]
    fn make_reads(ids: &[DataId]) -> Self::Reads;
    /// Consumes write handles (delegation), appending their ids.
    #[doc(hidden)]
    fn write_ids(writes: Self::Writes, out: &mut IdList);
    #[doc(hidden)]
    fn from_values(values: Vec<Value>) -> Result<Self, ValueError>;
    /// Decodes output `index` from bytes and formats it with `Debug` (for `inspect`).
    fn debug_output(index: usize, bytes: &[u8]) -> Option<String>;
    /// A plausible forgery of output `index` (forgery injection, `exec/forge.rs` rule 3).
    #[doc(hidden)]
    fn forge_output(index: usize, bytes: &[u8], seed: u64) -> Option<Vec<u8>>;
}

fn take<T: Data>(index: usize, v: Option<Value>) -> Result<T, ValueError> {
    v.ok_or_else(|| ValueError {
        index,
        reason: "missing".to_string(),
    })?
    .take::<T>()
    .map_err(|reason| ValueError { index, reason })
}

fn debug_as<T: Data>(bytes: &[u8]) -> Option<String> {
    crate::codec::decode::<T>(bytes)
        .ok()
        .map(|v| format!("{v:?}"))
}

macro_rules! tuple_sets {
    ($len:expr; $($T:ident $i:tt),*) => {
        impl<$($T: Data),*> InputSet for ($($T,)*) {
            type Reads = ($(Read<$T>,)*);
            #[allow(unused_variables)]
            fn ids(reads: &Self::Reads, out: &mut IdList) {
                $(out.push(reads.$i.id);)*
            }
            fn arity() -> Option<usize> {
                Some($len)
            }
            #[allow(unused_variables, unused_mut)]
            fn from_values(values: Vec<Value>) -> Result<Self, ValueError> {
                if values.len() != $len {
                    return Err(ValueError {
                        index: values.len(),
                        reason: format!("expected {} inputs, got {}", $len, values.len()),
                    });
                }
                let mut it = values.into_iter();
                Ok(($(take::<$T>($i, it.next())?,)*))
            }
            fn into_values(self) -> Vec<Value> {
                vec![$(Value::typed(self.$i)),*]
            }
        }

        impl<$($T: Data),*> OutputSet for ($($T,)*) {
            type Writes = ($(Write<$T>,)*);
            type Reads = ($(Read<$T>,)*);
            const LEN: usize = $len;
            #[allow(unused_variables, clippy::unused_unit)]
            fn make_writes(ids: &[DataId]) -> Self::Writes {
                ($(Write { id: ids[$i], _t: PhantomData },)*)
            }
            #[allow(unused_variables, clippy::unused_unit)]
            fn make_reads(ids: &[DataId]) -> Self::Reads {
                ($(Read { id: ids[$i], _t: PhantomData },)*)
            }
            #[allow(unused_variables)]
            fn write_ids(writes: Self::Writes, out: &mut IdList) {
                $(out.push(writes.$i.id);)*
            }
            #[allow(unused_variables, unused_mut)]
            fn from_values(values: Vec<Value>) -> Result<Self, ValueError> {
                let mut it = values.into_iter();
                Ok(($(take::<$T>($i, it.next())?,)*))
            }
            #[allow(unused_variables)]
            fn debug_output(index: usize, bytes: &[u8]) -> Option<String> {
                match index {
                    $($i => debug_as::<$T>(bytes),)*
                    _ => None,
                }
            }
            #[allow(unused_variables)]
            fn forge_output(index: usize, bytes: &[u8], seed: u64) -> Option<Vec<u8>> {
                match index {
                    $($i => crate::exec::forge::forge_as::<$T>(bytes, seed),)*
                    _ => None,
                }
            }
        }
    };
}

tuple_sets!(0;);
tuple_sets!(1; A 0);
tuple_sets!(2; A 0, B 1);
tuple_sets!(3; A 0, B 1, C 2);
tuple_sets!(4; A 0, B 1, C 2, D 3);
tuple_sets!(5; A 0, B 1, C 2, D 3, E 4);
tuple_sets!(6; A 0, B 1, C 2, D 3, E 4, F 5);

impl<T: Data> InputSet for Vec<T> {
    type Reads = Vec<Read<T>>;
    fn ids(reads: &Self::Reads, out: &mut IdList) {
        out.extend(reads.iter().map(|r| r.id));
    }
    fn arity() -> Option<usize> {
        None
    }
    // Inlined into the task's run: its `Vec` then comes back in registers, not through a
    // result in memory read back in 16-byte moves before its 8-byte stores were done (a
    // store-forwarding stall on every task that reads a list).
    #[inline]
    fn from_values(values: Vec<Value>) -> Result<Self, ValueError> {
        values
            .into_iter()
            .enumerate()
            .map(|(i, v)| take::<T>(i, Some(v)))
            .collect()
    }
    fn into_values(self) -> Vec<Value> {
        self.into_iter().map(Value::typed).collect()
    }
}
