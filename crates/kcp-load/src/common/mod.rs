//! What the subcommands share: the target they run against, the watchers
//! and writers of watch-delivery runs, and concurrent GET clients with
//! their figures, through the proxy and directly.

pub mod load;
pub mod plan;
pub mod target;
pub mod watchers;
pub mod writers;
