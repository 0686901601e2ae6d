//! `leda.stage.util.*`: timer, print, map, average, broadcast, roundrobin, switch, quit.

mod average;
mod broadcast;
mod map;
mod print;
mod quit;
mod roundrobin;
mod switch;
mod timer;

pub use average::{average, mean};
pub use broadcast::broadcast;
pub use map::{MapFn, builtin_map, map, map_with};
pub use print::{format_event, print};
pub use quit::quit;
pub use roundrobin::roundrobin;
pub use switch::switch;
pub use timer::timer;
