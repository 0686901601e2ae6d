//! What the application's events mean: resource names ([`NamedSpace`]) and the forms a
//! request may take (`[name, ...]`, `[[name, count], ...]`, `{name = count}`), parsed
//! into a [`MultiRequest`] or refused with a [`MultiRequestError`] before anything
//! reaches the algorithm. Owns the parsing and the `holds` value of a grant; must not
//! know any algorithm.

use leda_core::prelude::*;

use crate::error::MutexError;

use super::super::model::{Hold, MultiRequest, ResourceSpace};

/// Why a multi-resource request is refused before it reaches the algorithm.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MultiRequestError {
    /// The request names no resource.
    #[error("a multi-resource request must name at least one resource")]
    Empty,
    /// A name the group was not configured with.
    #[error("unknown resource {0:?}")]
    UnknownResource(String),
    /// A resource named twice in one request.
    #[error("resource {0:?} is named twice in one request")]
    Duplicate(String),
    /// A count outside `1..=capacity`.
    #[error("{count} instances of {resource:?} asked for, it has {capacity}")]
    Count {
        /// The resource.
        resource: String,
        /// The count asked for.
        count: i64,
        /// Its number of instances.
        capacity: u32,
    },
    /// The request is not a list of names or of `[name, count]` pairs.
    #[error("malformed multi-resource request: {0}")]
    Malformed(String),
}

impl MultiRequestError {
    /// A short stable name of the error (`empty`, `unknown`, `duplicate`, `count`,
    /// `malformed`), for the wire and for Lua.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::UnknownResource(_) => "unknown",
            Self::Duplicate(_) => "duplicate",
            Self::Count { .. } => "count",
            Self::Malformed(_) => "malformed",
        }
    }

    /// The error as event arguments: `kind, resource, count, capacity, message` (unused fields
    /// are `""` or 0).
    pub fn to_values(&self) -> Vec<Value> {
        let (resource, count, capacity) = match self {
            Self::Empty => (String::new(), 0, 0),
            Self::UnknownResource(r) | Self::Duplicate(r) => (r.clone(), 0, 0),
            Self::Count {
                resource,
                count,
                capacity,
            } => (resource.clone(), *count, i64::from(*capacity)),
            Self::Malformed(m) => (m.clone(), 0, 0),
        };
        vec![
            Value::from(self.kind()),
            Value::Str(resource),
            Value::Int(count),
            Value::Int(capacity),
            Value::Str(self.to_string()),
        ]
    }

    /// Rebuilds an error from [`Self::to_values`]'s arguments.
    pub fn from_values(args: &[Value]) -> Result<Self, MutexError> {
        let text = |i: usize| {
            args.get(i)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_default()
        };
        let int = |i: usize| args.get(i).and_then(Value::as_int).unwrap_or(0);
        Ok(match args.first().and_then(Value::as_str) {
            Some("empty") => Self::Empty,
            Some("unknown") => Self::UnknownResource(text(1)),
            Some("duplicate") => Self::Duplicate(text(1)),
            Some("count") => Self::Count {
                resource: text(1),
                count: int(2),
                capacity: u32::try_from(int(3)).unwrap_or(0),
            },
            Some("malformed") => Self::Malformed(text(1)),
            other => {
                return Err(MutexError::Encoding(format!(
                    "unknown request error kind {other:?}"
                )));
            }
        })
    }
}

/// Named resource types with their numbers of instances: the configuration of a multi node
/// stage and of the lock service's multi-resource locks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedSpace {
    names: Vec<String>,
    space: ResourceSpace,
}

impl NamedSpace {
    /// Resources `(name, instances)`; fails on an empty list, an empty or repeated name, or
    /// zero instances.
    pub fn new(resources: &[(String, u32)]) -> Result<Self, MutexError> {
        let mut seen = std::collections::BTreeSet::new();
        for (name, _) in resources {
            if name.is_empty() {
                return Err(MutexError::Config("a resource has an empty name".into()));
            }
            if !seen.insert(name.as_str()) {
                return Err(MutexError::Config(format!(
                    "resource {name:?} is configured twice"
                )));
            }
        }
        let space = ResourceSpace::with_capacities(resources.iter().map(|(_, k)| *k).collect())?;
        Ok(Self {
            names: resources.iter().map(|(n, _)| n.clone()).collect(),
            space,
        })
    }

    /// The algorithm's view: type `r` is the `r`-th name.
    pub fn space(&self) -> &ResourceSpace {
        &self.space
    }

    /// The names, in type order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The type of `name`.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// Whether `name` is configured.
    pub fn contains(&self, name: &str) -> bool {
        self.index(name).is_some()
    }

    /// `(name, instances)` pairs, in type order.
    pub fn resources(&self) -> Vec<(String, u32)> {
        self.names
            .iter()
            .cloned()
            .zip(self.space.capacities().iter().copied())
            .collect()
    }

    /// The configuration as a value: an array of `[name, instances]`.
    pub fn to_value(&self) -> Value {
        Value::Array(
            self.resources()
                .into_iter()
                .map(|(n, k)| Value::Array(vec![Value::Str(n), Value::Int(i64::from(k))]))
                .collect(),
        )
    }

    /// Reads a configuration value: an array of `[name, instances]` pairs or of names (one
    /// instance each), or a map `name → instances`.
    pub fn from_value(v: &Value) -> Result<Self, MutexError> {
        let pairs = name_counts(v).map_err(|e| MutexError::Config(format!("resources: {e}")))?;
        let mut out = Vec::with_capacity(pairs.len());
        for (name, k) in pairs {
            let k = u32::try_from(k)
                .map_err(|_| MutexError::Config(format!("resource {name:?}: {k} instances")))?;
            out.push((name, k));
        }
        Self::new(&out)
    }

    /// Validates a request given as `(name, count)` pairs.
    pub fn request(&self, items: &[(String, i64)]) -> Result<MultiRequest, MultiRequestError> {
        if items.is_empty() {
            return Err(MultiRequestError::Empty);
        }
        let mut seen = std::collections::BTreeSet::new();
        let mut typed = Vec::with_capacity(items.len());
        for (name, count) in items {
            if !seen.insert(name.as_str()) {
                return Err(MultiRequestError::Duplicate(name.clone()));
            }
            let r = self
                .index(name)
                .ok_or_else(|| MultiRequestError::UnknownResource(name.clone()))?;
            let capacity = self.space.capacity(r);
            let c = u32::try_from(*count)
                .ok()
                .filter(|&c| c >= 1 && c <= capacity)
                .ok_or_else(|| MultiRequestError::Count {
                    resource: name.clone(),
                    count: *count,
                    capacity,
                })?;
            typed.push((r, c));
        }
        MultiRequest::new(typed, &self.space)
            .map_err(|e| MultiRequestError::Malformed(e.to_string()))
    }

    /// Reads a request's `(name, count)` items from a value (the forms of
    /// [`Self::parse_request`]) without checking them against any configuration.
    pub fn parse_items(v: &Value) -> Result<Vec<(String, i64)>, MultiRequestError> {
        name_counts(v).map_err(MultiRequestError::Malformed)
    }

    /// Validates a request given as a value: an array whose items are names (one instance) or
    /// `[name, count]` pairs, or a map `name → count`.
    pub fn parse_request(&self, v: &Value) -> Result<MultiRequest, MultiRequestError> {
        self.request(&name_counts(v).map_err(MultiRequestError::Malformed)?)
    }

    /// A request as a value: an array of `[name, count]`.
    pub fn request_value(&self, req: &MultiRequest) -> Value {
        Value::Array(
            req.items()
                .iter()
                .map(|&(r, c)| {
                    Value::Array(vec![
                        Value::from(self.names.get(r).map_or("", String::as_str)),
                        Value::Int(i64::from(c)),
                    ])
                })
                .collect(),
        )
    }

    /// Holds as a value: an array of `[name, instance, fence]`.
    pub fn holds_value(&self, holds: &[Hold]) -> Value {
        Value::Array(
            holds
                .iter()
                .map(|h| {
                    Value::Array(vec![
                        Value::from(self.names.get(h.resource).map_or("", String::as_str)),
                        Value::Int(i64::from(h.instance)),
                        Value::Int(h.fence as i64),
                    ])
                })
                .collect(),
        )
    }
}

/// Reads `[name | [name, count], ...]` or `{name = count}` into pairs (count 1 for a bare name).
fn name_counts(v: &Value) -> Result<Vec<(String, i64)>, String> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::Str(s) => Ok((s.clone(), 1)),
                Value::Array(pair) => match pair.as_slice() {
                    [Value::Str(s), c] => c
                        .as_int()
                        .map(|c| (s.clone(), c))
                        .ok_or_else(|| format!("count of {s:?} is a {}", c.type_name())),
                    _ => Err("a pair must be [name, count]".to_owned()),
                },
                other => Err(format!(
                    "an item must be a name or [name, count], not a {}",
                    other.type_name()
                )),
            })
            .collect(),
        Value::Map(entries) => {
            let mut out: Vec<(String, i64)> = entries
                .iter()
                .map(|(k, c)| match (k, c.as_int()) {
                    (Value::Str(s), Some(c)) => Ok((s.clone(), c)),
                    _ => Err("a map entry must be name = count".to_owned()),
                })
                .collect::<Result<_, _>>()?;
            // Lua tables have no order: make the result independent of it.
            out.sort();
            Ok(out)
        }
        // An empty Lua table may arrive as nil or as an empty map.
        Value::Nil => Ok(Vec::new()),
        other => Err(format!(
            "expected a list of resources, got a {}",
            other.type_name()
        )),
    }
}
