//! The registry of task types by name (rule 6 of `task/mod.rs`).

use std::any::TypeId;
use std::collections::HashMap;

use super::{Boxed, ErasedTask, InputSet, OutputSet, Task};
use crate::codec::{self, CodecError};

type Decoder = fn(&[u8]) -> Result<Box<dyn ErasedTask>, CodecError>;

/// What the runtime knows of a registered task type.
#[derive(Clone, Copy)]
pub struct TaskKind {
    name: &'static str,
    type_id: TypeId,
    type_name: &'static str,
    inputs: Option<usize>,
    outputs: usize,
    decode: Decoder,
    debug_output: fn(usize, &[u8]) -> Option<String>,
    forge_output: fn(usize, &[u8], u64) -> Option<Vec<u8>>,
}

impl std::fmt::Debug for TaskKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskKind")
            .field("name", &self.name)
            .field("type", &self.type_name)
            .finish()
    }
}

fn decode_as<T: Task>(args: &[u8]) -> Result<Box<dyn ErasedTask>, CodecError> {
    Ok(Box::new(Boxed::new(codec::decode::<T>(args)?)))
}

impl TaskKind {
    /// The registered name.
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// Number of inputs, `None` if variable.
    pub fn inputs(&self) -> Option<usize> {
        self.inputs
    }
    /// Number of outputs.
    pub fn outputs(&self) -> usize {
        self.outputs
    }
    /// Decodes output `index` and formats it with `Debug`.
    pub fn debug_output(&self, index: usize, bytes: &[u8]) -> Option<String> {
        (self.debug_output)(index, bytes)
    }
    pub(crate) fn forge_output(&self, index: usize, bytes: &[u8], seed: u64) -> Option<Vec<u8>> {
        (self.forge_output)(index, bytes, seed)
    }
    /// Checks that `args` decode as this task's arguments.
    pub fn check_args(&self, args: &[u8]) -> Result<(), CodecError> {
        (self.decode)(args).map(drop)
    }
    pub(crate) fn decode(&self, args: &[u8]) -> Result<Box<dyn ErasedTask>, CodecError> {
        (self.decode)(args)
    }
}

/// Why a registration was refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RegistryError {
    /// Two different types claim one name.
    #[error("task name {name:?} is registered twice: by {first} and by {second}")]
    DuplicateName {
        /// The name.
        name: &'static str,
        /// Type registered first.
        first: &'static str,
        /// Type registered second.
        second: &'static str,
    },
    /// A name that is empty or has characters that would be ambiguous in logs and dot files.
    #[error("task name {0:?} must be non-empty ASCII letters, digits, '_', '-', '.' or ':'")]
    BadName(&'static str),
}

/// Task types by name.
#[derive(Clone, Default, Debug)]
pub struct Registry {
    by_name: HashMap<&'static str, TaskKind>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `T`; registering the same type twice is fine, two types with one name are not.
    pub fn register<T: Task>(&mut self) -> Result<(), RegistryError> {
        let name = T::NAME;
        let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':');
        if name.is_empty() || !name.chars().all(ok) {
            return Err(RegistryError::BadName(name));
        }
        let kind = TaskKind {
            name,
            type_id: TypeId::of::<T>(),
            type_name: std::any::type_name::<T>(),
            inputs: T::Inputs::arity(),
            outputs: T::Outputs::LEN,
            decode: decode_as::<T>,
            debug_output: T::Outputs::debug_output,
            forge_output: T::Outputs::forge_output,
        };
        match self.by_name.get(name) {
            Some(k) if k.type_id != kind.type_id => Err(RegistryError::DuplicateName {
                name,
                first: k.type_name,
                second: kind.type_name,
            }),
            _ => {
                self.by_name.insert(name, kind);
                Ok(())
            }
        }
    }

    /// Builder form of [`Registry::register`].
    pub fn with<T: Task>(mut self) -> Result<Self, RegistryError> {
        self.register::<T>()?;
        Ok(self)
    }

    /// The kind registered under `name`.
    pub fn get(&self, name: &str) -> Option<&TaskKind> {
        self.by_name.get(name)
    }

    /// Whether `T` itself is registered under its name.
    pub fn contains<T: Task>(&self) -> bool {
        self.by_name
            .get(T::NAME)
            .is_some_and(|k| k.type_id == TypeId::of::<T>())
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.by_name.keys().copied().collect();
        v.sort_unstable();
        v
    }
}
