//! plugio-engine: the userspace block layer (skeleton; see issue 4).

pub(crate) mod sync;
pub mod tag;
