//! The stage registry: how a daemon rebuilds the Rust stages of its cluster.
//!
//! Handlers are code, and Rust code does not travel: every process runs the same binary
//! (or binaries that register the same kinds), and a deployment names each stage's
//! *kind* (set with [`leda_core::stage::Stage::kind`]). The daemon looks the kind up
//! here and builds the stage from the deployed attributes.

use std::collections::BTreeMap;
use std::sync::Arc;

use leda_core::stage::{Attrs, BoxError, Stage};

/// Builds a stage of one kind from its attributes (the name is set by the caller).
pub type StageFactory = Arc<dyn Fn(&Attrs) -> Result<Stage, BoxError> + Send + Sync>;

/// Stage kinds this process can build, by registered name.
#[derive(Clone, Default)]
pub struct Registry {
    kinds: BTreeMap<String, StageFactory>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.kinds.keys()).finish()
    }
}

/// Why a stage of a deployment could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The deployment gives the stage no kind (a closure stage with no `kind(...)`).
    #[error("stage '{stage}' has no registered kind; give it one with Stage::kind")]
    NoKind {
        /// The stage.
        stage: String,
    },
    /// This process has no such kind.
    #[error("stage '{stage}': kind '{kind}' is not registered in this process")]
    UnknownKind {
        /// The stage.
        stage: String,
        /// The kind.
        kind: String,
    },
    /// The factory failed (bad attributes...).
    #[error("stage '{stage}' (kind '{kind}') could not be built: {reason}")]
    Factory {
        /// The stage.
        stage: String,
        /// The kind.
        kind: String,
        /// The factory's error.
        reason: String,
    },
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Registers `kind`; a later registration of the same kind replaces it.
    pub fn register<F>(&mut self, kind: impl Into<String>, factory: F) -> &mut Self
    where
        F: Fn(&Attrs) -> Result<Stage, BoxError> + Send + Sync + 'static,
    {
        self.kinds.insert(kind.into(), Arc::new(factory));
        self
    }

    /// Registers `kind` (builder form).
    pub fn with<F>(mut self, kind: impl Into<String>, factory: F) -> Self
    where
        F: Fn(&Attrs) -> Result<Stage, BoxError> + Send + Sync + 'static,
    {
        self.register(kind, factory);
        self
    }

    /// `true` if `kind` is registered.
    pub fn contains(&self, kind: &str) -> bool {
        self.kinds.contains_key(kind)
    }

    /// The registered kinds.
    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.kinds.keys().map(String::as_str)
    }

    /// Builds stage `name` of `kind` with `attrs`: the factory's stage, renamed, with
    /// the attributes set on it and its kind recorded.
    pub fn build(&self, name: &str, kind: &str, attrs: &Attrs) -> Result<Stage, ResolveError> {
        let factory = self
            .kinds
            .get(kind)
            .ok_or_else(|| ResolveError::UnknownKind {
                stage: name.into(),
                kind: kind.into(),
            })?;
        let built = factory(attrs).map_err(|e| ResolveError::Factory {
            stage: name.into(),
            kind: kind.into(),
            reason: e.to_string(),
        })?;
        let stage = if built.name() == name {
            built
        } else {
            built.clone_as(name)
        };
        for (k, v) in attrs.iter() {
            stage.set_attr(k, v.clone());
        }
        Ok(stage.kind(kind))
    }
}
