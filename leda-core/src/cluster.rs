//! Clusters: sets of stages, each one scheduling domain (one process, one worker pool).
//! `+`, `-` and `*` are union, difference and intersection, as in `leda.cluster`.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::{Add, Mul, Sub};

use crate::stage::{Stage, StageId};

/// A set of stages.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Cluster {
    stages: BTreeMap<StageId, Stage>,
}

impl Cluster {
    /// A cluster of the given stages.
    pub fn of<'a>(stages: impl IntoIterator<Item = &'a Stage>) -> Cluster {
        Cluster {
            stages: stages.into_iter().map(|s| (s.id(), s.clone())).collect(),
        }
    }

    /// `true` if `stage` is in the cluster.
    pub fn contains(&self, stage: &Stage) -> bool {
        self.stages.contains_key(&stage.id())
    }

    /// The stages, in creation order.
    pub fn stages(&self) -> impl Iterator<Item = &Stage> {
        self.stages.values()
    }

    /// Number of stages.
    pub fn len(&self) -> usize {
        self.stages.len()
    }

    /// `true` if the cluster has no stage.
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// Adds a stage.
    pub fn insert(&mut self, stage: &Stage) {
        self.stages.insert(stage.id(), stage.clone());
    }
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.stages.values().map(|s| s.name()))
            .finish()
    }
}

impl fmt::Display for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.stages.values().map(|s| s.name()).collect();
        write!(f, "{{{}}}", names.join(", "))
    }
}

impl Add<&Cluster> for &Cluster {
    type Output = Cluster;
    fn add(self, rhs: &Cluster) -> Cluster {
        let mut out = self.clone();
        out.stages
            .extend(rhs.stages.iter().map(|(k, v)| (*k, v.clone())));
        out
    }
}

impl Sub<&Cluster> for &Cluster {
    type Output = Cluster;
    fn sub(self, rhs: &Cluster) -> Cluster {
        Cluster {
            stages: self
                .stages
                .iter()
                .filter(|(k, _)| !rhs.stages.contains_key(k))
                .map(|(k, v)| (*k, v.clone()))
                .collect(),
        }
    }
}

impl Mul<&Cluster> for &Cluster {
    type Output = Cluster;
    fn mul(self, rhs: &Cluster) -> Cluster {
        Cluster {
            stages: self
                .stages
                .iter()
                .filter(|(k, _)| rhs.stages.contains_key(k))
                .map(|(k, v)| (*k, v.clone()))
                .collect(),
        }
    }
}

macro_rules! owned_ops {
    ($($tr:ident $m:ident),*) => {$(
        impl $tr<Cluster> for Cluster {
            type Output = Cluster;
            fn $m(self, rhs: Cluster) -> Cluster { (&self).$m(&rhs) }
        }
        impl $tr<&Cluster> for Cluster {
            type Output = Cluster;
            fn $m(self, rhs: &Cluster) -> Cluster { (&self).$m(rhs) }
        }
        impl $tr<Cluster> for &Cluster {
            type Output = Cluster;
            fn $m(self, rhs: Cluster) -> Cluster { self.$m(&rhs) }
        }
    )*};
}
owned_ops!(Add add, Sub sub, Mul mul);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stage::Stage;

    fn stage(n: &str) -> Stage {
        Stage::new(n, |_, _| Ok(()))
    }

    #[test]
    fn set_algebra() {
        let (a, b, c) = (stage("a"), stage("b"), stage("c"));
        let ab = Cluster::of([&a, &b]);
        let bc = Cluster::of([&b, &c]);
        assert_eq!((&ab + &bc).len(), 3);
        let d = &ab - &bc;
        assert!(d.contains(&a) && !d.contains(&b));
        let i = ab * bc;
        assert_eq!(i.len(), 1);
        assert!(i.contains(&b));
    }
}
