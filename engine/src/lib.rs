//! plugio-engine: the userspace block layer (skeleton; see issue 4).
