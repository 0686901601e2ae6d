//! Events: the tuple of values a handler receives, plus an optional local attachment.
//!
//! An event is what `leda.send(port, ...)` packs: its arguments, in order. Arguments
//! are [`Value`]s, so any event can cross a decoupled connector (and the wire). A
//! *local attachment* is any `Send` Rust value (a socket, a file, an image buffer)
//! that moves with the event by unique ownership. It may only travel on `local` and
//! `cohort` connectors; sending it on a decoupled connector fails at send time.

use std::any::Any;
use std::fmt;
use std::mem::ManuallyDrop;

use serde::Deserialize;
use smallvec::SmallVec;

use crate::value::{Value, ValueError};

/// Inline capacity of an event's argument list; more arguments spill to the heap.
const INLINE_ARGS: usize = 1;

/// The argument list of an event.
pub type Args = SmallVec<[Value; INLINE_ARGS]>;

/// Binary arguments at least this long are not shared with the copy kept for the
/// failure log ([`Event::clone_args_for_log`]); shorter ones are (one count each).
const LOG_COPY_BYTES: usize = 4096;

/// One event: ordered arguments and an optional local attachment.
///
/// Kept to one cache line (56 bytes) for the common case of one argument: events cross
/// cores through queues, and every extra line is a miss on the receiving side.
#[derive(Default)]
pub struct Event {
    /// Dropped by hand (see the `Drop` impl).
    args: ManuallyDrop<Args>,
    /// Dropped by hand too: the generic glue is an out-of-line call per event.
    extra: ManuallyDrop<Option<Box<Extra>>>,
}

impl Drop for Event {
    /// An event of scalars held inline, with no attachment, owns nothing: it is
    /// dropped with a few tests instead of the generic drop glue's calls per argument
    /// (events are dropped at every handler call).
    #[inline]
    fn drop(&mut self) {
        if self.args.spilled() || self.args.iter().any(Value::owns_memory) || self.extra.is_some() {
            self.drop_fields();
        }
    }
}

impl Event {
    #[cold]
    #[inline(never)]
    fn drop_fields(&mut self) {
        // SAFETY: called once, from `drop`; the fields are never used again.
        unsafe {
            ManuallyDrop::drop(&mut self.args);
            ManuallyDrop::drop(&mut self.extra);
        }
    }
}

/// The rare parts of an event, boxed to keep `Event` small.
#[derive(Default)]
struct Extra {
    attachment: Option<Box<dyn Any + Send>>,
    stamp: Option<crate::stats::Stamp>,
}

impl Event {
    /// An event with no arguments (what `autostart = true` pushes).
    pub fn new() -> Self {
        Self::default()
    }

    /// An event with the given arguments.
    pub fn from_values(values: impl IntoIterator<Item = Value>) -> Self {
        Event {
            args: ManuallyDrop::new(values.into_iter().collect()),
            extra: ManuallyDrop::new(None),
        }
    }

    /// Appends an argument (builder form).
    pub fn with(mut self, v: impl Into<Value>) -> Self {
        self.args.push(v.into());
        self
    }

    /// Appends an argument.
    pub fn push(&mut self, v: impl Into<Value>) {
        self.args.push(v.into());
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.args.len()
    }

    /// `true` when the event has no arguments.
    pub fn is_empty(&self) -> bool {
        self.args.is_empty()
    }

    /// The arguments.
    pub fn args(&self) -> &[Value] {
        &self.args
    }

    /// Consumes the event, returning its arguments (any attachment is dropped).
    pub fn into_args(mut self) -> Args {
        std::mem::take(&mut *self.args)
    }

    /// Argument `i`, or `None` past the end.
    pub fn arg(&self, i: usize) -> Option<&Value> {
        self.args.get(i)
    }

    /// Moves argument `i` out, leaving nil in its place (no copy of strings or arrays).
    pub fn take(&mut self, i: usize) -> Value {
        self.args.get_mut(i).map(std::mem::take).unwrap_or_default()
    }

    /// Typed access to argument `i` through serde. A missing argument reads as nil, so
    /// `Option<T>` works for optional arguments, as in Lua.
    pub fn get<'a, T: Deserialize<'a>>(&'a self, i: usize) -> Result<T, ValueError> {
        const NIL: Value = Value::Nil;
        let v = self.args.get(i).unwrap_or(&NIL);
        v.to()
            .map_err(|e| ValueError(format!("argument {}: {e}", i + 1)))
    }

    /// Attaches a local resource. Replaces any previous attachment.
    pub fn attach<T: Any + Send>(mut self, resource: T) -> Self {
        self.extra.get_or_insert_with(Box::default).attachment = Some(Box::new(resource));
        self
    }

    /// `true` if the event carries a local attachment.
    pub fn has_attachment(&self) -> bool {
        self.extra.as_ref().is_some_and(|x| x.attachment.is_some())
    }

    /// Takes the attachment if it is a `T`; otherwise leaves it in place and returns `None`.
    pub fn take_attachment<T: Any + Send>(&mut self) -> Option<T> {
        let extra = self.extra.as_mut()?;
        match extra.attachment.take()?.downcast::<T>() {
            Ok(b) => Some(*b),
            Err(other) => {
                extra.attachment = Some(other);
                None
            }
        }
    }

    /// A copy of the arguments without the attachment (used to report a failed event).
    pub fn clone_args(&self) -> Event {
        Event {
            args: self.args.clone(),
            extra: ManuallyDrop::new(None),
        }
    }

    /// A copy of the arguments that only has to print like them (the failure log):
    /// a binary argument of [`LOG_COPY_BYTES`] or more becomes its printed form
    /// (`<N bytes>`), so that the copy holds no reference to it and a handler may take
    /// it over (`Bytes::try_into_mut`) while the copy is kept.
    pub(crate) fn clone_args_for_log(&self) -> Event {
        let args = self
            .args
            .iter()
            .map(|v| match v {
                Value::Bytes(b) if b.len() >= LOG_COPY_BYTES => Value::Str(v.to_string()),
                v => v.clone(),
            })
            .collect();
        Event {
            args: ManuallyDrop::new(args),
            extra: ManuallyDrop::new(None),
        }
    }

    /// Puts a send timestamp on the event (sampled connector latency).
    pub(crate) fn set_stamp(&mut self, stamp: crate::stats::Stamp) {
        self.extra.get_or_insert_with(Box::default).stamp = Some(stamp);
    }

    /// Takes the send timestamp, if any.
    #[inline]
    pub(crate) fn take_stamp(&mut self) -> Option<crate::stats::Stamp> {
        self.extra.as_mut().and_then(|x| x.stamp.take())
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut t = f.debug_tuple("Event");
        for a in self.args.iter() {
            t.field(a);
        }
        if self.has_attachment() {
            t.field(&"<attachment>");
        }
        t.finish()
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, a) in self.args.iter().enumerate() {
            if i > 0 {
                f.write_str("\t")?;
            }
            write!(f, "{a}")?;
        }
        Ok(())
    }
}

impl<T: Into<Value>> From<T> for Event {
    fn from(v: T) -> Self {
        let mut args = Args::new();
        args.push(v.into());
        Event {
            args: ManuallyDrop::new(args),
            extra: ManuallyDrop::new(None),
        }
    }
}

macro_rules! from_tuple {
    ($($name:ident),+) => {
        impl<$($name: Into<Value>),+> From<($($name,)+)> for Event {
            #[allow(non_snake_case)]
            fn from(($($name,)+): ($($name,)+)) -> Self {
                Event {
                    args: ManuallyDrop::new(smallvec::smallvec![$($name.into()),+]),
                    extra: ManuallyDrop::new(None),
                }
            }
        }
    };
}
from_tuple!(A, B);
from_tuple!(A, B, C);
from_tuple!(A, B, C, D);
from_tuple!(A, B, C, D, E);
from_tuple!(A, B, C, D, E, F);

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    use super::*;

    #[test]
    fn typed_get_and_missing_args() {
        let ev = Event::from(("file.txt", 3, 2.5));
        assert_eq!(ev.get::<&str>(0).unwrap(), "file.txt");
        assert_eq!(ev.get::<u32>(1).unwrap(), 3);
        assert_eq!(ev.get::<f64>(2).unwrap(), 2.5);
        assert_eq!(ev.get::<Option<String>>(3).unwrap(), None);
        let err = ev.get::<i64>(0).unwrap_err().to_string();
        assert!(err.contains("argument 1"), "{err}");
    }

    #[test]
    fn event_fits_a_cache_line() {
        assert!(
            std::mem::size_of::<Event>() <= 64,
            "{}",
            std::mem::size_of::<Event>()
        );
    }

    /// Owns a byte buffer and counts its drops (through `Bytes::from_owner`).
    struct Counted(Arc<AtomicUsize>, Vec<u8>);
    impl AsRef<[u8]> for Counted {
        fn as_ref(&self) -> &[u8] {
            &self.1
        }
    }
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    #[test]
    fn dropping_an_event_frees_what_it_owns_and_only_that() {
        let drops = Arc::new(AtomicUsize::new(0));
        let bytes = || {
            Value::Bytes(bytes::Bytes::from_owner(Counted(
                drops.clone(),
                vec![1, 2, 3],
            )))
        };
        // Inline (one argument), spilled (several), nested in an array, with an
        // attachment: every owner is dropped exactly once.
        drop(Event::from(bytes()));
        drop(Event::from_values([Value::Int(1), bytes(), bytes()]));
        drop(Event::from(Value::Array(vec![bytes(), Value::Nil])));
        let attached = Arc::new(());
        drop(Event::from(2).attach(attached.clone()));
        assert_eq!(drops.load(SeqCst), 4);
        assert_eq!(
            Arc::strong_count(&attached),
            1,
            "the attachment was dropped"
        );
        // Scalars take the fast path, and moving the arguments out leaves nothing to drop.
        drop(Event::from(1.5));
        let args = Event::from_values([bytes(), Value::Str("s".into())]).into_args();
        assert_eq!(
            drops.load(SeqCst),
            4,
            "the arguments moved out are still alive"
        );
        drop(args);
        assert_eq!(drops.load(SeqCst), 5);
    }

    #[test]
    fn attachment_moves_by_type() {
        let mut ev = Event::new().with(1).attach(vec![1u8, 2, 3]);
        assert!(ev.has_attachment());
        assert_eq!(ev.take_attachment::<String>(), None);
        assert!(
            ev.has_attachment(),
            "a wrong-typed take leaves the attachment"
        );
        assert_eq!(ev.take_attachment::<Vec<u8>>(), Some(vec![1, 2, 3]));
        assert!(!ev.has_attachment());
    }
}
