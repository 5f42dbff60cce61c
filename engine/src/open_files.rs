//! One device state per open file: [`Device::open`](crate::Device::open)
//! of a file (or block device) that this process already has open with
//! equal options returns a handle to the same [`DeviceShared`], so every
//! handle of one file is one ordering domain (overlapping IO through any
//! two handles keeps program order), with one tag set and one set of
//! iostats, as the kernel has one request queue per disk.
//!
//! Invariants:
//! - An entry names a file by what the kernel names it by: a block or
//!   character device by its device number (`st_rdev`), so two nodes of
//!   one disk are one entry; anything else by `(st_dev, st_ino)`, so
//!   hard links and symlinks of one file are one entry.
//! - A state is handed out again only while it has a handle (its
//!   `handles` count is raised from a non-zero value atomically): a closed
//!   state, which its cores are letting go of, is never revived.
//! - The registry holds only weak references: it keeps nothing open.
//! - A file has one set of options: an open with other options while a
//!   state of the file has a handle is refused (`InvalidInput::AlreadyOpen`,
//!   naming the options that differ), never given a second, unordered
//!   state.
//! - A forked child starts with an empty registry of its own (a
//!   [`ForkLocal`]): the parent's entries hold the parent's IO in flight
//!   at the fork (see `plugio_device::fork`), and the parent's lock may
//!   have been held by a thread the child does not have (an open in
//!   progress at the fork left the child's opens waiting forever).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use plugio_device::{Error, InvalidInput};
use plugio_executor::fork::ForkLocal;

use crate::options::DeviceOptions;
use crate::shared::DeviceShared;

/// What names one open file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileKey {
    /// A block or character device: its device number.
    Device(u64),
    /// Anything else: file system device and inode.
    Inode(u64, u64),
}

impl FileKey {
    /// The key of `path` (symlinks followed), or `None` when it cannot be
    /// stat'ed (the open then reports why).
    pub fn of(path: &Path) -> Option<FileKey> {
        Some(Self::of_metadata(&std::fs::metadata(path).ok()?))
    }

    /// The key of an open file (`fstat`; no path walk).
    pub fn of_file(file: &std::fs::File) -> Option<FileKey> {
        Some(Self::of_metadata(&file.metadata().ok()?))
    }

    fn of_metadata(m: &std::fs::Metadata) -> FileKey {
        let ft = m.file_type();
        if ft.is_block_device() || ft.is_char_device() {
            FileKey::Device(m.rdev())
        } else {
            FileKey::Inode(m.dev(), m.ino())
        }
    }
}

/// `(file, state)`.
type Entries = Vec<(FileKey, Weak<DeviceShared>)>;

/// The registry of this fork generation.
static OPEN: ForkLocal<Mutex<Entries>> = ForkLocal::new(|| Mutex::new(Vec::new()));

/// The registry, locked: held across an open so two threads opening one
/// file get one state.
pub(crate) struct Registry(MutexGuard<'static, Entries>);

impl Registry {
    pub fn lock() -> Registry {
        Registry(OPEN.get().lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// A new handle's share of the open state of `key`, if there is one
    /// that still has a handle (`Ok(None)`: open the file).
    ///
    /// # Errors
    /// [`InvalidInput::AlreadyOpen`] when that state has other options.
    pub fn find(
        &mut self,
        key: FileKey,
        opts: &DeviceOptions,
    ) -> Result<Option<Arc<DeviceShared>>, Error> {
        self.0.retain(|(_, w)| w.strong_count() > 0);
        for shared in self
            .0
            .iter()
            .filter(|(k, _)| *k == key)
            .filter_map(|(_, w)| w.upgrade())
        {
            if !raise_handles(&shared) {
                // Closing: its cores are letting go of it.
                continue;
            }
            if shared.opts == *opts {
                return Ok(Some(shared));
            }
            let detail = shared.opts.differences(opts).join(", ");
            // The handle raised above goes again, as a Device drop: when
            // every other handle went meanwhile, this one was the last, and
            // the cores that used the device are woken to let go of it
            // (they kept the file open until they next ran; found by a
            // reviewer).
            let wake = shared.drop_handle();
            drop(shared);
            for waker in wake.into_iter().flatten() {
                waker.unpark();
            }
            return Err(Error::invalid(InvalidInput::AlreadyOpen { detail }));
        }
        Ok(None)
    }

    /// Records the state of a file just opened.
    pub fn insert(&mut self, key: FileKey, shared: &Arc<DeviceShared>) {
        self.0.push((key, Arc::downgrade(shared)));
    }
}

/// Raises the handle count of `shared` if it is not zero (a closed state
/// is never revived); false when it was zero.
fn raise_handles(shared: &DeviceShared) -> bool {
    // Relaxed: the count's closing decision pairs drop_handle's Release
    // decrement (a Device drop, or `find` letting go of a raised count)
    // with is_closed's Acquire load; this increment, like a clone,
    // publishes nothing.
    let mut n = shared.handles.load(Ordering::Relaxed);
    loop {
        if n == 0 {
            return false;
        }
        match shared
            .handles
            .compare_exchange_weak(n, n + 1, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => return true,
            Err(now) => n = now,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Registry;
    use crate::{Device, DeviceOptions};
    use plugio_device::testing::{in_forked_child, while_another_thread_holds};
    use plugio_device::{ErrorKind, InvalidInput};

    /// An open in progress in another thread at a fork holds the
    /// registry's lock: a child that opens a file does not wait for it
    /// (before, it waited forever: the child inherits the lock but not its
    /// holder; CI saw it as a fork test killed by its alarm).
    #[test]
    fn an_open_in_progress_at_the_fork_does_not_stop_the_childs_opens() {
        let file = tempfile::NamedTempFile::new().unwrap();
        file.as_file().set_len(4096).unwrap();
        let path = file.path().to_path_buf();
        let child = while_another_thread_holds(Registry::lock, || {
            in_forked_child(20, || {
                let first =
                    Device::open(&path, DeviceOptions::default()).map_err(|e| e.to_string())?;
                // The child's registry works: a second open with other options
                // finds the first and is refused.
                let other = DeviceOptions {
                    queue_depth: first.options().queue_depth / 2,
                    ..DeviceOptions::default()
                };
                match Device::open(&path, other) {
                    Err(e)
                        if matches!(
                            e.kind(),
                            ErrorKind::InvalidInput(InvalidInput::AlreadyOpen { .. })
                        ) =>
                    {
                        Ok(())
                    }
                    got => Err(format!("a second open with other options: {:?}", got.err())),
                }
            })
        });
        child.unwrap();
    }
}
