//! `util.print`: Listing 4.1, prints each event as Lua's `print` would.

use std::fs::{File, OpenOptions};
use std::io::Write;

use leda_core::prelude::*;

use crate::StageError;

/// Formats an event as Lua's `print` does: arguments separated by tabs.
pub fn format_event(ev: &Event) -> String {
    let mut line = String::new();
    for (i, v) in ev.args().iter().enumerate() {
        if i > 0 {
            line.push('\t');
        }
        line.push_str(&v.to_string());
    }
    line
}

enum Sink {
    Stdout,
    File(File),
}

/// `util.print` (serial, so lines never interleave).
///
/// * **Event**: any values; printed tab-separated on one line.
/// * **Attribute `file`** (optional): append to this file instead of standard output.
///   It is opened (created if need be) by the process that runs the stage, when its
///   instance is built for the first event: a file that cannot be opened fails each
///   event (reported), it cannot be checked before the run.
/// * **Port 1** (optional): the event is forwarded after printing.
/// * **bind**: `file`, when set, must be a non-empty string.
pub fn print() -> Stage {
    Stage::stateful(
        "print",
        |attrs: &Attrs| -> Result<Sink, BoxError> {
            file_attr("print", attrs)?;
            match attrs.get("file") {
                None | Some(Value::Nil) => Ok(Sink::Stdout),
                Some(Value::Str(path)) => {
                    let f = OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .map_err(|e| StageError::io("print", format!("open {path}"), e))?;
                    Ok(Sink::File(f))
                }
                Some(other) => {
                    Err(
                        StageError::attr("print", "file", format!("must be a path, not {other}"))
                            .into(),
                    )
                }
            }
        },
        |sink: &mut Sink, ev: Event, ctx: &mut Ctx| {
            let mut line = format_event(&ev);
            line.push('\n');
            let res = match sink {
                Sink::Stdout => std::io::stdout().lock().write_all(line.as_bytes()),
                Sink::File(f) => f.write_all(line.as_bytes()),
            };
            res.map_err(|e| StageError::io(ctx.stage_name(), "write", e))?;
            if ctx.has_output(1) {
                ctx.send_or_wait(1, ev)?;
            }
            Ok(())
        },
    )
    .serial()
    .bind(|b| {
        file_attr(b.name, b.attrs).map_err(|e| e.to_string())?;
        Ok(())
    })
}

/// Checks the `file` attribute: absent, or a non-empty string.
fn file_attr(stage: &str, attrs: &Attrs) -> Result<(), StageError> {
    match attrs.get("file") {
        None | Some(Value::Nil) => Ok(()),
        Some(Value::Str(path)) if !path.is_empty() => Ok(()),
        Some(other) => Err(StageError::attr(
            stage,
            "file",
            format!("must be a path, not {other:?}"),
        )),
    }
}
