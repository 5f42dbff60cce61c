//! plugio-device: io_uring rings and storage backends (skeleton; see issue 3).
