//! What a request's completion says: the typed [`Status`] decoded once
//! from the backend's `i32` result, and the two forms a batch of
//! completions comes in ([`Completed`]).
//!
//! Idea: the kernel's `blk_status_t`, decoded once per request from the
//! driver's completion (`nvme_error_status`), not per bio.
//!
//! Invariants: a result is decoded once, in one place
//! ([`Status::from_result`]); an NVMe status keeps its encoding through
//! [`Status::as_share`], so the bio's error names it.

use plugio_device::error::NVME_STATUS_BASE;

/// What a request's completion says, decoded once from the backend's
/// `i32` result (a CQE's `res`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Bytes transferred.
    Bytes(u64),
    /// The kernel or the device failed the request with this errno.
    Errno(i32),
    /// An NVMe completion status (status field without the phase bit), as
    /// the passthrough backend encodes it.
    Nvme(u16),
    /// The backend refused the submission (errno): the request never
    /// reached the device, so it is not issued again.
    Submit(i32),
}

impl Status {
    /// Decodes a completion result.
    pub fn from_result(result: i32) -> Self {
        if result >= 0 {
            return Status::Bytes(result as u64);
        }
        let code = result.checked_neg().unwrap_or(i32::MAX);
        if code >= NVME_STATUS_BASE {
            Status::Nvme((code - NVME_STATUS_BASE) as u16)
        } else {
            Status::Errno(code)
        }
    }

    /// The result as the bios record it: bytes, or a negative code that
    /// `Error::from_errno` maps (NVMe statuses keep their encoding).
    pub(crate) fn as_share(self) -> i64 {
        match self {
            Status::Bytes(n) => n as i64,
            Status::Errno(e) | Status::Submit(e) => -i64::from(e),
            Status::Nvme(s) => -(i64::from(NVME_STATUS_BASE) + i64::from(s)),
        }
    }
}

/// A completion to handle: a token and its status.
pub(crate) type Done = (u64, Status);

/// A completion as the device layer delivers it (`(token, res)`) or as
/// the engine records it (`(token, Status)`): the batch is handled in the
/// form it comes in, decoded one entry at a time (no second array).
pub(crate) trait Completed: Copy {
    fn token(self) -> u64;
    fn status(self) -> Status;
    /// The byte count, where the status is [`Status::Bytes`] (the common
    /// case, tested without decoding the rest).
    fn bytes(self) -> Option<u64>;
}

impl Completed for (u64, i32) {
    #[inline]
    fn token(self) -> u64 {
        self.0
    }
    #[inline]
    fn status(self) -> Status {
        Status::from_result(self.1)
    }
    #[inline]
    fn bytes(self) -> Option<u64> {
        // As `from_result`: a result >= 0 is a byte count.
        (self.1 >= 0).then_some(self.1 as u64)
    }
}

impl Completed for Done {
    #[inline]
    fn token(self) -> u64 {
        self.0
    }
    #[inline]
    fn status(self) -> Status {
        self.1
    }
    #[inline]
    fn bytes(self) -> Option<u64> {
        match self.1 {
            Status::Bytes(n) => Some(n),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_decode_bytes_errnos_and_nvme() {
        assert_eq!(Status::from_result(4096), Status::Bytes(4096));
        assert_eq!(Status::from_result(0), Status::Bytes(0));
        assert_eq!(Status::from_result(-libc::EIO), Status::Errno(libc::EIO));
        let nvme = plugio_device::error::nvme_status_result(0x0280);
        assert_eq!(Status::from_result(nvme), Status::Nvme(0x0280));
        assert_eq!(Status::Nvme(0x0280).as_share(), i64::from(nvme));
        assert_eq!(
            Status::Submit(libc::EINVAL).as_share(),
            -i64::from(libc::EINVAL)
        );
    }
}
