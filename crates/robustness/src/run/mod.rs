//! One robustness run: stand the topology up, record etcd's history, start
//! the recording watchers, readers and writers, inject faults from the
//! seeded schedule, then validate every stream and report.
//!
//! `setup`: what to run and the watchers started; `sources`: etcd's history
//! recorded, the proxies' relists and the final lists; `epoch`: a span
//! between etcd restores, with its own reference and clients; `phases`: the
//! run itself; `report`: what it found, as text.

mod epoch;
mod phases;
mod report;
mod setup;
mod sources;

pub use phases::run;
pub use report::{FaultRow, PropertyReport, Report};
pub use setup::Options;
